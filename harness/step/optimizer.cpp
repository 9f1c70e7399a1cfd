// SGD and AdamW over a parameter set (kernels/optim does the per-tensor update).
#include "harness/step/optimizer.hpp"

#include "harness/check.hpp"

namespace hr {

const char* optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::custom: return "custom";
  }
  return "?";
}

namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(const ops::SgdConfig& cfg, ParamSet& params) : cfg_(cfg) {
    for (Param& p : params.all()) {
      Tensor buf;
      if (p.trainable && cfg.momentum != 0.f)
        buf = Tensor::zeros(params.device(), p.master.shape(), DType::f32, Consumer::optimizer_state);
      momentum_.push_back(buf);
      names_.push_back(p.name);
    }
  }
  std::string name() const override { return "sgd"; }
  void step(ParamSet& params, int64_t) override {
    auto& ps = params.all();
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].trainable) continue;
      ops::SgdConfig c = cfg_;
      if (!ps[i].weight_decay) c.weight_decay = 0.f;
      ops::sgd_step(ps[i].master, ps[i].grad, momentum_[i], c);
    }
  }
  size_t state_bytes() const override {
    size_t n = 0;
    for (const Tensor& t : momentum_)
      if (t.defined()) n += t.nbytes();
    return n;
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < momentum_.size(); ++i)
      if (momentum_[i].defined()) out.emplace_back(names_[i] + ".momentum_buffer", momentum_[i]);
    return out;
  }

 private:
  ops::SgdConfig cfg_;
  std::vector<Tensor> momentum_;
  std::vector<std::string> names_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(const ops::AdamWConfig& cfg, ParamSet& params) : cfg_(cfg) {
    for (Param& p : params.all()) {
      Tensor m, v;
      if (p.trainable) {
        m = Tensor::zeros(params.device(), p.master.shape(), DType::f32, Consumer::optimizer_state);
        v = Tensor::zeros(params.device(), p.master.shape(), DType::f32, Consumer::optimizer_state);
      }
      m_.push_back(m);
      v_.push_back(v);
      names_.push_back(p.name);
    }
  }
  std::string name() const override { return "adamw"; }
  void step(ParamSet& params, int64_t step) override {
    auto& ps = params.all();
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].trainable) continue;
      ops::AdamWConfig c = cfg_;
      if (!ps[i].weight_decay) c.weight_decay = 0.f;
      ops::adamw_step(ps[i].master, ps[i].grad, m_[i], v_[i], step, c);
    }
  }
  size_t state_bytes() const override {
    size_t n = 0;
    for (size_t i = 0; i < m_.size(); ++i)
      if (m_[i].defined()) n += m_[i].nbytes() + v_[i].nbytes();
    return n;
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < m_.size(); ++i) {
      if (!m_[i].defined()) continue;
      out.emplace_back(names_[i] + ".exp_avg", m_[i]);
      out.emplace_back(names_[i] + ".exp_avg_sq", v_[i]);
    }
    return out;
  }

 private:
  ops::AdamWConfig cfg_;
  std::vector<Tensor> m_, v_;
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, ParamSet& params) {
  switch (cfg.kind) {
    case OptimizerKind::sgd: return std::make_unique<Sgd>(cfg.sgd, params);
    case OptimizerKind::adamw: return std::make_unique<AdamW>(cfg.adamw, params);
    case OptimizerKind::custom:
      HR_ARG_CHECK(static_cast<bool>(cfg.factory), "optimizer.factory: kind 'custom' needs a factory");
      return cfg.factory(params);
  }
  throw InvalidArgument("optimizer.kind: unknown optimizer");
}

}  // namespace hr
