// Synthetic data generators (see synthetic.hpp).
#include "harness/data/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include "harness/check.hpp"
#include "harness/data/packing.hpp"
#include "harness/models/params.hpp"
#include "harness/step/train_step.hpp"
#include "kernels/common/philox.hpp"

namespace hr {

LengthDistribution LengthDistribution::scaled(int64_t max_len) const {
  LengthDistribution d = *this;
  const double f = static_cast<double>(max_len) / static_cast<double>(max);
  d.max = max_len;
  d.p95 = std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(p95) * f)));
  d.min = std::max<int64_t>(1, std::min<int64_t>(d.p95, static_cast<int64_t>(std::llround(static_cast<double>(min) * f))));
  return d;
}

std::vector<int64_t> sample_lengths(const LengthDistribution& d, int64_t n, uint64_t seed) {
  HR_ARG_CHECK(d.min >= 1 && d.min <= d.p95 && d.p95 <= d.max, "length distribution: need 1 <= min <= p95 <= max, got {} {} {}",
               d.min, d.p95, d.max);
  const double median = static_cast<double>(d.p95) / std::exp(1.6448536269514722 * d.sigma);
  const std::vector<float> z = philox_normal(seed, 0, n, 0.f, 1.f);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {
    const double len = median * std::exp(d.sigma * static_cast<double>(z[i]));
    out[i] = std::clamp<int64_t>(static_cast<int64_t>(std::llround(len)), d.min, d.max);
  }
  return out;
}

namespace {

// The successor map of a task: a fixed random permutation of the vocabulary
// (without the pad id as a successor when the vocabulary allows).
std::vector<int32_t> successor_map(int64_t vocab, uint64_t task_seed) {
  std::vector<int32_t> perm(static_cast<size_t>(vocab));
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = vocab - 1; i > 0; --i) {  // Fisher-Yates on Philox draws
    const int64_t j = static_cast<int64_t>(philox_draw(task_seed, static_cast<uint64_t>(i)) % static_cast<uint64_t>(i + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

int32_t random_token(uint64_t seed, uint64_t n, int64_t vocab) {
  return static_cast<int32_t>(philox_draw(seed, n) % static_cast<uint64_t>(vocab));
}

}  // namespace

Batch make_lm_batch(Device& dev, const TransformerConfig& cfg, int64_t rows, int64_t seq_len, uint64_t seed,
                    const std::vector<int64_t>& lengths, const LmTask& task) {
  HR_ARG_CHECK(rows > 0 && seq_len > 0, "lm batch: rows and seq_len must be positive, got {} and {}", rows, seq_len);
  HR_ARG_CHECK(lengths.empty() || static_cast<int64_t>(lengths.size()) == rows,
               "lm batch: {} lengths for {} rows", lengths.size(), rows);
  const std::vector<int32_t> succ = successor_map(cfg.vocab, task.task_seed);
  const size_t n = static_cast<size_t>(rows * seq_len);
  std::vector<int32_t> ids(n, task.pad_id), pos(n), tgt(n, cfg.ignore_index), valid(static_cast<size_t>(rows));
  for (int64_t b = 0; b < rows; ++b) {
    const int64_t len = lengths.empty() ? seq_len : lengths[static_cast<size_t>(b)];
    HR_ARG_CHECK(len >= 1 && len <= seq_len, "lm batch: length {} of row {} outside [1, {}]", len, b, seq_len);
    valid[static_cast<size_t>(b)] = static_cast<int32_t>(len);
    int32_t t = random_token(seed, static_cast<uint64_t>(b), cfg.vocab);
    for (int64_t i = 0; i < seq_len; ++i) {
      const size_t k = static_cast<size_t>(b * seq_len + i);
      pos[k] = static_cast<int32_t>(i);
      if (i < len) {
        ids[k] = t;
        t = succ[static_cast<size_t>(t)];
        if (i + 1 < len) tgt[k] = t;
      }
    }
  }
  Batch out;
  out.ids = Tensor::from_host_i32(dev, ids, {rows, seq_len}, Consumer::workspace);
  out.pos = Tensor::from_host_i32(dev, pos, {rows, seq_len}, Consumer::workspace);
  out.targets = Tensor::from_host_i32(dev, tgt, {rows, seq_len}, Consumer::workspace);
  if (!lengths.empty()) out.key_valid_len = Tensor::from_host_i32(dev, valid, {rows}, Consumer::workspace);
  out.keep_host_index(std::move(ids), std::move(pos), std::move(tgt));
  return out;
}

std::vector<std::vector<int32_t>> make_lm_sequences(const TransformerConfig& cfg, const std::vector<int64_t>& lengths,
                                                    uint64_t seed, const LmTask& task) {
  const std::vector<int32_t> succ = successor_map(cfg.vocab, task.task_seed);
  std::vector<std::vector<int32_t>> out(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) {
    HR_ARG_CHECK(lengths[s] >= 1, "lm sequences: sequence {} has length {}", s, lengths[s]);
    std::vector<int32_t>& seq = out[s];
    seq.resize(static_cast<size_t>(lengths[s]));
    int32_t t = random_token(seed, s, cfg.vocab);
    for (int32_t& v : seq) {
      v = t;
      t = succ[static_cast<size_t>(t)];
    }
  }
  return out;
}

Batch make_packed_lm_batch(Device& dev, const TransformerConfig& cfg, int64_t rows, int64_t seq_len,
                           const std::vector<int64_t>& lengths, uint64_t seed, const LmTask& task, PackPlan* placed) {
  PackPlan plan = pack_first_fit_decreasing(lengths, seq_len, rows);
  // The caller asked for `rows` rows: the ones packing did not need are all padding.
  plan.row_fill.resize(static_cast<size_t>(rows), 0);
  plan.rows = rows;
  Batch b = make_packed_batch(dev, cfg, plan, make_lm_sequences(cfg, lengths, seed, task), {}, -1, task.pad_id);
  if (placed != nullptr) *placed = std::move(plan);
  return b;
}

Batch make_mlp_batch(Device& dev, const MlpConfig& cfg, int64_t rows, uint64_t seed, const MlpTaskSpec& task) {
  HR_ARG_CHECK(rows > 0, "mlp batch: rows must be positive, got {}", rows);
  const std::vector<float> x = philox_normal(seed, 0, rows * cfg.in_dim, 0.f, 1.f);
  const std::vector<float> a =
      philox_normal(task.task_seed, 0, cfg.out_dim * cfg.in_dim, 0.f, 1.f / std::sqrt(static_cast<float>(cfg.in_dim)));
  Batch out;
  out.x = Tensor::from_host(dev, x, {rows, cfg.in_dim}, DType::f32, Consumer::workspace);
  std::vector<float> y(static_cast<size_t>(rows * cfg.out_dim));
  std::vector<int32_t> cls(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t best = 0;
    for (int64_t o = 0; o < cfg.out_dim; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < cfg.in_dim; ++i)
        acc += static_cast<double>(a[static_cast<size_t>(o * cfg.in_dim + i)]) * x[static_cast<size_t>(r * cfg.in_dim + i)];
      y[static_cast<size_t>(r * cfg.out_dim + o)] = task.target_scale * static_cast<float>(std::tanh(acc));
      if (y[static_cast<size_t>(r * cfg.out_dim + o)] > y[static_cast<size_t>(r * cfg.out_dim + best)]) best = o;
    }
    cls[static_cast<size_t>(r)] = static_cast<int32_t>(best);
  }
  if (cfg.task == MlpTask::regression)
    out.targets_f32 = Tensor::from_host(dev, y, {rows, cfg.out_dim}, DType::f32, Consumer::workspace);
  else
    out.targets = Tensor::from_host_i32(dev, cls, {rows}, Consumer::workspace);
  if (out.targets.defined()) out.keep_host_index({}, {}, std::move(cls));
  return out;
}

double loss_multiplier_for_grad_magnitude(TrainStep& step, const Batch& batch, double target) {
  HR_ARG_CHECK(target > 0, "gradient magnitude target must be positive, got {}", target);
  step.forward_backward(batch);
  std::vector<float> mags;
  for (const auto& [name, g] : step.gradients())
    for (float v : g.to_host_f32())
      if (v != 0.f) mags.push_back(std::fabs(v));
  HR_CHECK(!mags.empty(), "every gradient is zero");
  const size_t mid = mags.size() / 2;
  std::nth_element(mags.begin(), mags.begin() + static_cast<std::ptrdiff_t>(mid), mags.end());
  return step.config().loss_multiplier * target / static_cast<double>(mags[mid]);
}

}  // namespace hr
