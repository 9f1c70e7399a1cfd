// SGD and AdamW over a parameter set (kernels/optim does the per-tensor update).
#include "harness/step/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/check.hpp"
#include "harness/faults.hpp"

namespace hr {

const char* optimizer_kind_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::custom: return "custom";
    case OptimizerKind::adamw8bit: return "adamw8bit";
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
  // Every tensor in one call: on a GPU, a few launches for the whole model.
  void step(ParamSet& params, int64_t step) override {
    auto& ps = params.all();
    std::vector<ops::AdamWTensor> ts;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].trainable) continue;
      ops::AdamWConfig c = cfg_;
      if (!ps[i].weight_decay) c.weight_decay = 0.f;
      ts.push_back({&ps[i].master, &ps[i].grad, &m_[i], &v_[i], c});
    }
    ops::adamw_step_many(ts, step);
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

// Q8Fault::requantise_on_save: the saved codes and absmax of one moment replaced by
// what saving the moment dequantised and quantising it again gives. Codes survive,
// but a block whose largest value is negative in the signed map gets its lowest
// code's magnitude (0.99297) times its absmax.
void requantise(std::vector<uint8_t>& codes, std::vector<uint8_t>& absmax_bytes, int64_t block_size, q8::MapKind map) {
  const q8::Codebook c = q8::make_codebook(map);
  std::vector<float> absmax(absmax_bytes.size() / sizeof(float));
  std::memcpy(absmax.data(), absmax_bytes.data(), absmax_bytes.size());
  const size_t block = static_cast<size_t>(block_size);
  std::vector<float> x(block);
  for (size_t b = 0; b < absmax.size(); ++b) {
    const size_t begin = b * block, end = std::min(codes.size(), begin + block);
    float a = 0.f;
    for (size_t e = begin; e < end; ++e) a = std::max(a, std::fabs(x[e - begin] = q8::decode(c, codes[e], absmax[b])));
    for (size_t e = begin; e < end; ++e) codes[e] = q8::quantize(c, x[e - begin], a);
    absmax[b] = a;
  }
  std::memcpy(absmax_bytes.data(), absmax.data(), absmax_bytes.size());
}

// AdamW whose moments are kept block-wise in 8 bits between steps. Tensors under
// q8::kMin8bitNumel elements (biases, norm weights) keep fp32 moments, as
// bitsandbytes does by default (min_8bit_size = 4096).
class AdamW8bit final : public Optimizer {
 public:
  AdamW8bit(const ops::AdamWConfig& cfg, const ops::AdamW8bitOptions& opt, ParamSet& params) : cfg_(cfg) {
    HR_ARG_CHECK(opt.block_size > 0, "optimizer.adamw8bit.block_size: must be positive, got {}", opt.block_size);
    Device& dev = params.device();
    const ops::Q8Fault* fault = faults::active<ops::Q8Fault>();
    for (Param& p : params.all()) {
      State st;
      if (p.trainable) {
        const int64_t n = p.master.numel();
        if (n >= q8::kMin8bitNumel && !(fault && fault->fp32_state)) {
          st.opt = ops::applied_options(opt, n);
          const Shape blocks{q8::block_count(n, st.opt.block_size)};
          // Zero absmax decodes every code to zero: the moments start at zero.
          st.m = Tensor::zeros(dev, p.master.shape(), DType::u8, Consumer::optimizer_state);
          st.v = Tensor::zeros(dev, p.master.shape(), DType::u8, Consumer::optimizer_state);
          st.m_absmax = Tensor::zeros(dev, blocks, DType::f32, Consumer::optimizer_state);
          st.v_absmax = fault && fault->shared_absmax
                            ? st.m_absmax
                            : Tensor::zeros(dev, blocks, DType::f32, Consumer::optimizer_state);
        } else {
          st.m = Tensor::zeros(dev, p.master.shape(), DType::f32, Consumer::optimizer_state);
          st.v = Tensor::zeros(dev, p.master.shape(), DType::f32, Consumer::optimizer_state);
        }
      }
      states_.push_back(st);
      names_.push_back(p.name);
    }
  }
  std::string name() const override { return "adamw8bit"; }
  // The 8-bit tensors in one call and the small fp32-state ones in another: on a
  // GPU, a few launches for the whole model. The fp32-state list is checked before
  // the 8-bit one steps, so a bad tensor in either refuses the step with nothing moved.
  void step(ParamSet& params, int64_t step) override {
    auto& ps = params.all();
    std::vector<ops::AdamW8bitTensor> q8;
    std::vector<ops::AdamWTensor> f32;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (!ps[i].trainable) continue;
      ops::AdamWConfig c = cfg_;
      if (!ps[i].weight_decay) c.weight_decay = 0.f;
      State& st = states_[i];
      if (st.m_absmax.defined())
        q8.push_back({&ps[i].master, &ps[i].grad, &st.m, &st.m_absmax, &st.v, &st.v_absmax, c, st.opt});
      else
        f32.push_back({&ps[i].master, &ps[i].grad, &st.m, &st.v, c});
    }
    ops::adamw_check_many(f32, step);
    ops::adamw8bit_step_many(q8, step);
    ops::adamw_step_many(f32, step);
  }
  size_t state_bytes() const override {
    size_t n = 0;
    for (const State& st : states_)
      for (const Tensor* t : {&st.m, &st.v, &st.m_absmax, &st.v_absmax})
        if (t->defined()) n += t->nbytes();
    return n;
  }
  // The checkpoint faults of ops::Q8Fault act here: the absmax left out, the moments
  // saved dequantised and quantised again on load, one absmax one ulp up on reload.
  Saved save() const override {
    Saved saved = Optimizer::save();
    const ops::Q8Fault* f = faults::active<ops::Q8Fault>();
    if (!f || !(f->absmax_not_saved || f->requantise_on_save)) return saved;
    size_t k = 0;  // index into `saved`, in state()'s order
    for (const State& st : states_) {
      if (!st.m.defined()) continue;
      if (!st.m_absmax.defined()) {
        k += 2;
        continue;
      }
      // exp_avg codes, absmax, exp_avg_sq codes, absmax
      for (const bool first : {true, false}) {
        std::vector<uint8_t>& codes = saved[k].second;
        std::vector<uint8_t>& absmax = saved[k + 1].second;
        if (f->requantise_on_save)
          requantise(codes, absmax, st.opt.block_size, first ? st.opt.m_map : st.opt.v_map);
        if (f->absmax_not_saved) std::fill(absmax.begin(), absmax.end(), 0);
        k += 2;
      }
    }
    return saved;
  }
  void load(const Saved& saved) override {
    Optimizer::load(saved);
    const ops::Q8Fault* f = faults::active<ops::Q8Fault>();
    if (!f || !f->reload_absmax_ulp) return;
    for (State& st : states_)
      if (st.m_absmax.defined()) {
        std::vector<float> a = st.m_absmax.to_host_f32();
        a[0] = std::nextafter(a[0], INFINITY);
        st.m_absmax.from_host_bytes(a.data(), a.size() * sizeof(float));
        return;
      }
  }
  std::vector<std::pair<std::string, Tensor>> state() const override {
    std::vector<std::pair<std::string, Tensor>> out;
    for (size_t i = 0; i < states_.size(); ++i) {
      const State& st = states_[i];
      if (!st.m.defined()) continue;
      if (st.m_absmax.defined()) {
        out.emplace_back(names_[i] + ".exp_avg.codes", st.m);
        out.emplace_back(names_[i] + ".exp_avg.absmax", st.m_absmax);
        out.emplace_back(names_[i] + ".exp_avg_sq.codes", st.v);
        out.emplace_back(names_[i] + ".exp_avg_sq.absmax", st.v_absmax);
      } else {
        out.emplace_back(names_[i] + ".exp_avg", st.m);
        out.emplace_back(names_[i] + ".exp_avg_sq", st.v);
      }
    }
    return out;
  }

 private:
  struct State {
    Tensor m, v;                // uint8 codes, or fp32 moments for small tensors
    Tensor m_absmax, v_absmax;  // fp32, one per block; undefined for fp32 state
    ops::AdamW8bitOptions opt;  // the maps and block this tensor's state is stored with
  };
  ops::AdamWConfig cfg_;
  std::vector<State> states_;
  std::vector<std::string> names_;
};

}  // namespace

Optimizer::Saved Optimizer::save() const {
  Saved s;
  for (const auto& [name, t] : state()) s.emplace_back(name, t.to_host_bytes());
  return s;
}

void Optimizer::load(const Saved& saved) {
  const auto st = state();
  HR_ARG_CHECK(st.size() == saved.size(), "optimizer state: {} saved tensors, {} to fill", saved.size(), st.size());
  for (size_t i = 0; i < st.size(); ++i) {
    HR_ARG_CHECK(st[i].first == saved[i].first, "optimizer state: saved '{}' where '{}' is expected", saved[i].first,
                 st[i].first);
    HR_ARG_CHECK(saved[i].second.size() == st[i].second.nbytes(), "optimizer state '{}': {} saved bytes, {} expected",
                 st[i].first, saved[i].second.size(), st[i].second.nbytes());
    Tensor t = st[i].second;
    t.from_host_bytes(saved[i].second.data(), saved[i].second.size());
  }
}

size_t adamw8bit_state_bytes(int64_t numel, int64_t block_size) {
  if (numel < q8::kMin8bitNumel) return static_cast<size_t>(numel) * 8;
  return static_cast<size_t>(2 * numel + 2 * 4 * q8::block_count(numel, block_size));
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& cfg, ParamSet& params) {
  switch (cfg.kind) {
    case OptimizerKind::sgd: return std::make_unique<Sgd>(cfg.sgd, params);
    case OptimizerKind::adamw: return std::make_unique<AdamW>(cfg.adamw, params);
    case OptimizerKind::adamw8bit: return std::make_unique<AdamW8bit>(cfg.adamw, cfg.adamw8bit, params);
    case OptimizerKind::custom:
      HR_ARG_CHECK(static_cast<bool>(cfg.factory), "optimizer.factory: kind 'custom' needs a factory");
      return cfg.factory(params);
  }
  throw InvalidArgument("optimizer.kind: unknown optimizer");
}

}  // namespace hr
