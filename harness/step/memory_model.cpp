// The analytical memory model (see memory_model.hpp). Two derivations: the
// per-layer closed form (layer_terms; the activations a block keeps, peaked over
// the forward pass and each checkpoint segment's recompute), and a replay of the
// step's allocations by size, in the order harness/models/{transformer,mlp}.cpp,
// harness/step/checkpoint.cpp and the kernels make and free them, which adds the
// temporaries and so the workspace and total peaks. Tests hold the two to the same
// activation bytes; MEM-1 holds both to the tracker.
#include "harness/step/memory_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/faults.hpp"

namespace hr {

size_t MemoryPrediction::of(Consumer c) const {
  switch (c) {
    case Consumer::weights: return weights;
    case Consumer::gradients: return gradients;
    case Consumer::optimizer_state: return optimizer_state;
    case Consumer::activations: return activations;
    case Consumer::workspace: return workspace;
  }
  return 0;
}

std::vector<int64_t> parameter_tensor_sizes(const StepConfig& cfg) {
  std::vector<int64_t> sizes;
  if (cfg.model == ModelKind::mlp) {
    const MlpConfig& m = cfg.mlp;
    for (int64_t l = 0; l < m.layers; ++l) {
      const int64_t in = l == 0 ? m.in_dim : m.width, out = l + 1 == m.layers ? m.out_dim : m.width;
      sizes.push_back(out * in);
      sizes.push_back(out);
    }
    if (m.norm != NormKind::none)
      for (int64_t l = 0; l + 1 < m.layers; ++l) sizes.insert(sizes.end(), {m.width, m.width});
    if (cfg.adapters.kind == AdapterKind::lora)  // each hidden linear's A [r, in] and B [W, r], after the base
      for (int64_t l = 0; l + 1 < m.layers; ++l) {
        const int64_t in = l == 0 ? m.in_dim : m.width;
        sizes.insert(sizes.end(), {cfg.adapters.rank * in, m.width * cfg.adapters.rank});
      }
    return sizes;
  }
  const TransformerConfig& t = cfg.transformer;
  const int64_t C = t.d_model, R = t.mlp_ratio * C;
  sizes = {t.vocab * C, t.max_positions * C};
  for (int64_t l = 0; l < t.layers; ++l)
    sizes.insert(sizes.end(), {C, C, C * C, C, C * C, C, C * C, C, C * C, C, C, C, R * C, R, C * R, C});
  sizes.insert(sizes.end(), {C, C, t.vocab * C});
  if (cfg.adapters.kind == AdapterKind::lora) {  // q and v's A [r, C] and B [C, r], after the base
    const int64_t r = cfg.adapters.rank;
    for (int64_t l = 0; l < t.layers; ++l) sizes.insert(sizes.end(), {r * C, C * r, r * C, C * r});
  }
  return sizes;
}

std::vector<int64_t> trainable_tensor_sizes(const StepConfig& cfg) {
  std::vector<int64_t> sizes = parameter_tensor_sizes(cfg);
  if (cfg.adapters.kind == AdapterKind::lora) {  // the frozen base owns no gradient and no state
    const int64_t adapters = cfg.model == ModelKind::mlp ? 2 * (cfg.mlp.layers - 1) : 4 * cfg.transformer.layers;
    sizes.erase(sizes.begin(), sizes.end() - adapters);
  }
  return sizes;
}

std::vector<int64_t> parameter_tensor_blocks(const StepConfig& cfg) {
  std::vector<int64_t> blocks;
  if (cfg.model == ModelKind::mlp) {
    const MlpConfig& m = cfg.mlp;
    // Block l: layer l's weight and bias, its norm, its adapters; the last layer outside.
    for (int64_t l = 0; l < m.layers; ++l) blocks.insert(blocks.end(), 2, l + 1 == m.layers ? -1 : l);
    if (m.norm != NormKind::none)
      for (int64_t l = 0; l + 1 < m.layers; ++l) blocks.insert(blocks.end(), 2, l);
    if (cfg.adapters.kind == AdapterKind::lora)
      for (int64_t l = 0; l + 1 < m.layers; ++l) blocks.insert(blocks.end(), 2, l);
    return blocks;
  }
  const TransformerConfig& t = cfg.transformer;
  blocks = {-1, -1};
  for (int64_t l = 0; l < t.layers; ++l) blocks.insert(blocks.end(), 16, l);
  blocks.insert(blocks.end(), 3, -1);
  if (cfg.adapters.kind == AdapterKind::lora)
    for (int64_t l = 0; l < t.layers; ++l) blocks.insert(blocks.end(), 4, l);
  return blocks;
}

ShardedPrediction predict_sharded(const StepConfig& cfg, int64_t ranks) {
  HR_ARG_CHECK(cfg.sharding != Sharding::none, "predict_sharded: sharding none is the unsharded step (predict_memory)");
  HR_ARG_CHECK(ranks >= 1 && ranks <= (int64_t{1} << 20), "predict_sharded: {} ranks", ranks);
  HR_ARG_CHECK(cfg.adapters.kind == AdapterKind::none, "predict_sharded: adapters (LoRA) are not sharded");
  // What the sharded step runs (harness/dist/sharded_step.hpp), so nothing is predicted
  // for a step that cannot be run.
  HR_ARG_CHECK(cfg.precision.compute == DType::f32 || cfg.precision.compute == DType::bf16,
               "predict_sharded: the sharded step runs fp32 or bf16, not {}", dtype_name(cfg.precision.compute));
  HR_ARG_CHECK(cfg.precision.master_weights, "predict_sharded: the sharded step keeps fp32 master weights");
  HR_ARG_CHECK(cfg.optimizer.kind == OptimizerKind::adamw || cfg.optimizer.kind == OptimizerKind::sgd,
               "predict_sharded: adamw or sgd, not {}", optimizer_kind_name(cfg.optimizer.kind));
  HR_ARG_CHECK(cfg.batch % ranks == 0 && (cfg.batch / ranks) % cfg.micro_batch == 0,
               "predict_sharded: batch {} over {} ranks in micro-batches of {}", cfg.batch, ranks, cfg.micro_batch);
  ShardedPrediction p;
  p.level = cfg.sharding;
  p.ranks = ranks;
  p.micro_batches = cfg.batch / ranks / cfg.micro_batch;
  const std::vector<int64_t> sizes = parameter_tensor_sizes(cfg), blocks = parameter_tensor_blocks(cfg);
  const int64_t B = cfg.model == ModelKind::mlp ? cfg.mlp.layers - 1 : cfg.transformer.layers;
  std::vector<int64_t> unit(static_cast<size_t>(B) + 1, 0);  // P_u; the last: outside the blocks
  for (size_t i = 0; i < sizes.size(); ++i)
    unit[blocks[i] < 0 ? static_cast<size_t>(B) : static_cast<size_t>(blocks[i])] += sizes[i];
  int64_t recomputed = 0;  // N S_b of the blocks a checkpointed backward gathers a third time
  for (size_t u = 0; u < unit.size(); ++u) {
    const int64_t S = (unit[u] + ranks - 1) / ranks, padded = std::max<int64_t>(S * ranks, 1);
    p.parameters += unit[u];
    p.shard += std::max<int64_t>(S, 1);
    p.padded += padded;
    if (u == unit.size() - 1) p.outside_padded = padded;
    else {
      p.largest_block_padded = std::max(p.largest_block_padded, padded);
      if (cfg.checkpoint.enabled()) recomputed += padded;
    }
  }
  const double P = static_cast<double>(p.parameters), K = static_cast<double>(p.micro_batches);
  const size_t s = dtype_size(cfg.precision.compute);
  const size_t copies = s == 4 ? 0 : static_cast<size_t>(p.parameters) * s;  // fp32: the masters are read
  const size_t padded4 = static_cast<size_t>(p.padded) * 4, shard4 = static_cast<size_t>(p.shard) * 4;
  switch (cfg.sharding) {
    case Sharding::none: break;
    case Sharding::zero1:
      p.weights = p.weights_peak = padded4 + copies;
      p.gradients = p.gradients_peak = padded4 + shard4;
      p.gradient_elements = static_cast<double>(p.padded);
      p.parameter_elements = static_cast<double>(p.padded);
      p.zero_paper_elements = 2 * P;
      break;
    case Sharding::zero2:
      p.weights = p.weights_peak = padded4 + copies;
      p.gradients = shard4;
      p.gradients_peak = shard4 + static_cast<size_t>(p.outside_padded + p.largest_block_padded) * 4;
      p.gradient_elements = K * static_cast<double>(p.padded);
      p.parameter_elements = static_cast<double>(p.padded);
      p.zero_paper_elements = (K + 1) * P;
      break;
    case Sharding::zero3:
      p.weights = shard4;
      p.weights_peak = shard4 + static_cast<size_t>(p.outside_padded + p.largest_block_padded) * s;
      p.gradients = shard4;
      p.gradients_peak = shard4 + static_cast<size_t>(p.outside_padded + p.largest_block_padded) * 4;
      p.gradient_elements = K * static_cast<double>(p.padded);
      p.parameter_elements =
          K * static_cast<double>(p.outside_padded + 2 * (p.padded - p.outside_padded) + recomputed);
      p.zero_paper_elements = 3 * K * P;
      break;
  }
  const bool adamw = cfg.optimizer.kind == OptimizerKind::adamw;
  p.optimizer_state = adamw ? shard4 * 2 : (cfg.optimizer.sgd.momentum != 0.f ? shard4 : 0);
  return p;
}

int64_t parameter_count(const StepConfig& cfg) {
  if (cfg.model == ModelKind::mlp) {
    const MlpConfig& m = cfg.mlp;
    int64_t p = 0;
    for (int64_t l = 0; l < m.layers; ++l) {
      const int64_t in = l == 0 ? m.in_dim : m.width, out = l + 1 == m.layers ? m.out_dim : m.width;
      p += out * in + out;
    }
    if (m.norm != NormKind::none) p += (m.layers - 1) * 2 * m.width;
    if (cfg.adapters.kind == AdapterKind::lora)
      for (int64_t l = 0; l + 1 < m.layers; ++l)
        p += cfg.adapters.rank * ((l == 0 ? m.in_dim : m.width) + m.width);
    return p;
  }
  const TransformerConfig& t = cfg.transformer;
  const int64_t C = t.d_model, R = t.mlp_ratio * C;
  const int64_t per_block = 2 * C              // ln1
                            + 4 * (C * C + C)  // q, k, v, proj
                            + 2 * C            // ln2
                            + (R * C + R)      // fc
                            + (C * R + C);     // mlp proj
  const int64_t adapters = cfg.adapters.kind == AdapterKind::lora ? t.layers * 4 * cfg.adapters.rank * C : 0;
  return t.vocab * C + t.max_positions * C + t.layers * per_block + 2 * C + t.vocab * C + adapters;
}

namespace {

constexpr Consumer kAct = Consumer::activations;
constexpr Consumer kWs = Consumer::workspace;

// ---- the closed form -------------------------------------------------------------

// Peak activation bytes of a stack of n blocks, each keeping `own` bytes besides
// its input, whose outputs (= next inputs) are `boundary` bytes, under
// checkpointing every k blocks (0 = none). `head` is what is kept after the
// stack (at the end of the forward pass, all of it alive); `input` is the
// stack's input (kept: the first block or segment needs it). *at_boundary: what
// is alive when the loss has been computed.
double stack_peak(int64_t n, int64_t k, double own, double boundary, double input, double head,
                  double* at_boundary, nlohmann::json& b) {
  if (k <= 0) {
    b["blocks_kept"] = n;
    *at_boundary = input + static_cast<double>(n) * (own + boundary) + head;
    return *at_boundary;
  }
  k = std::min(k, n);
  const int64_t segments = (n + k - 1) / k;
  // Forward: only segment boundaries are kept (the stack's input and each segment's output).
  const double fwd = input + static_cast<double>(segments) * boundary + head;
  // Backward of segment s (the head is gone): the input, the outputs of segments
  // 0..s-1 (inputs of segments 1..s), and the recomputed segment: each of its
  // k_s blocks keeps `own`, and all but its last output are kept as the next
  // block's input.
  double bwd = 0;
  for (int64_t s = 0; s < segments; ++s) {
    const int64_t ks = std::min(k, n - s * k);
    bwd = std::max(bwd, input + static_cast<double>(s) * boundary + static_cast<double>(ks) * own +
                            static_cast<double>(ks - 1) * boundary);
  }
  b["segments"] = segments;
  b["forward_peak"] = fwd;
  b["recompute_peak"] = bwd;
  *at_boundary = fwd;
  return std::max(fwd, bwd);
}

// ---- the replay --------------------------------------------------------------------

// Buffers by size, in allocation order: current and peak bytes per consumer and in
// total, as MemoryTracker keeps them, and the phase of the step each peak fell in.
class Ledger {
 public:
  using Id = size_t;
  static constexpr Id kNone = static_cast<Id>(-1);

  Id alloc(Consumer c, double bytes) {
    bufs_.push_back({c, bytes, true});
    const int i = static_cast<int>(c);
    cur_[i] += bytes;
    total_ += bytes;
    if (cur_[i] > peak_[i]) peak_[i] = cur_[i], peak_at_[i] = phase_;
    if (total_ > total_peak_) total_peak_ = total_, total_peak_at_ = phase_;
    return bufs_.size() - 1;
  }
  void free(Id id) {
    if (id == kNone) return;
    Buf& b = bufs_.at(id);
    HR_CHECK(b.live, "memory model: buffer {} freed twice", id);
    b.live = false;
    cur_[static_cast<int>(b.c)] -= b.bytes;
    total_ -= b.bytes;
  }
  // An op's own buffers: allocated together, freed before it returns.
  void scratch(double bytes) {
    if (bytes > 0) free(alloc(kWs, bytes));
  }
  void phase(std::string p) { phase_ = std::move(p); }

  double current(Consumer c) const { return cur_[static_cast<int>(c)]; }
  double peak(Consumer c) const { return peak_[static_cast<int>(c)]; }
  const std::string& peak_at(Consumer c) const { return peak_at_[static_cast<int>(c)]; }
  double total() const { return total_; }
  double total_peak() const { return total_peak_; }
  const std::string& total_peak_at() const { return total_peak_at_; }

 private:
  struct Buf {
    Consumer c;
    double bytes;
    bool live;
  };
  std::vector<Buf> bufs_;
  std::array<double, kNumConsumers> cur_{}, peak_{};
  std::array<std::string, kNumConsumers> peak_at_;
  double total_ = 0, total_peak_ = 0;
  std::string phase_ = "setup", total_peak_at_;
};

// Partial-sum layouts of the CUDA reductions (kernels/common/cuda_rowwise.cuh,
// kernels/elementwise/elementwise.cu, kernels/reduce/reduce.cu).
double cuda_col_sum_floats(double n, double c, int k) {
  const double rows_per_chunk = std::max(64.0, std::ceil(n / 256.0));
  return k * std::ceil(n / rows_per_chunk) * c;
}
double cuda_bias_grad_chunks(double rows) { return std::clamp(std::floor((rows + 63) / 64), 1.0, 512.0); }
double cuda_sum_blocks(double n) { return std::min(std::ceil(n / (256.0 * 4)), 1024.0); }

// The kernels' own buffers: what an op allocates besides its outputs (always workspace).
struct Kernels {
  Ledger& L;
  bool cuda;
  bool widen;  // CPU products widen 16-bit operands to fp32 (kernels/matmul/matmul.cpp)

  // c = a b (element counts): fp32 copies of a and b, and an fp32 result buffer
  // unless c is fp32 itself (a parameter gradient).
  void gemm(double a, double b, double c, bool c_f32) const {
    if (widen) L.scratch(4 * (a + b + (c_f32 ? 0 : c)));
  }
  void linear_forward(double n, double in, double out) const { gemm(n * in, out * in, n * out, false); }
  // dw false: a frozen weight (LoRA's base), whose gradient product is skipped.
  void linear_backward(double n, double in, double out, bool dx, bool bias, bool dw = true) const {
    if (dx) gemm(n * out, out * in, n * in, false);  // dx = dy W
    if (dw) gemm(n * out, n * in, out * in, true);   // dW += dy^T x (fp32)
    if (bias && cuda) L.scratch(4 * cuda_bias_grad_chunks(n) * out);
  }
  void layernorm_backward(double n, double c) const {
    if (cuda) L.scratch(4 * cuda_col_sum_floats(n, c, 2));
  }
  void batchnorm_forward_train(double n, double c) const {
    if (cuda) L.scratch(4 * cuda_col_sum_floats(n, c, 1));
  }
  void batchnorm_backward(double n, double c) const {
    if (cuda) L.scratch(4 * (cuda_col_sum_floats(n, c, 2) + 2 * c));
  }
  void cross_entropy_forward(double rows) const {
    if (cuda) L.scratch(4 * rows);  // per-row losses (the CPU sums on the host)
  }
  void mse_forward(double n) const {
    if (cuda) L.scratch(4 * n + 8 * (cuda_sum_blocks(n) + 1));  // per-element losses + the sum's partials
  }
  void attention_mem_efficient_forward(double t, double d) const {
    if (!cuda) L.scratch(4 * (3 * t * d + d));  // one (b, h)'s q, k, v in fp32 and one output row
  }
  void attention_mem_efficient_backward(double bh, double t, double d) const {
    if (cuda) L.scratch(4 * bh * t);  // row_dot
    else L.scratch(4 * (7 * t * d + d));
  }
  // Inverse indices of the embedding gradient (CUDA): distinct rows, offsets, tokens.
  // Distinct ids depend on the data: min(tokens, rows) bounds them. The moment is
  // after every activation is freed, below the workspace peak of any block's backward.
  void embedding_backward(double tokens, double rows) const {
    if (cuda) L.scratch(4 * (2 * std::min(tokens, rows) + 1 + tokens));
  }
};

// Dimensions shared by the two replays.
struct Common {
  double s;           // bytes of the compute dtype
  double stats_row;   // fp32 mean and rstd per row: 8 (0 under PredictionFault::omit_norm_stats)
  int64_t n_blocks;
  int64_t k;          // blocks per segment (n_blocks without checkpointing)
  bool ck;
};

// One block's kept tensors, by ledger id (kNone for those it does not have).
struct Kept {
  std::vector<Ledger::Id> ids;
  Ledger::Id x = Ledger::kNone;  // the block input, when the state is its only holder
};

// The stack of blocks in segments of c.k, as harness/step/checkpoint.cpp runs it,
// shared by both replays. block(i, keep, recompute, out_consumer, kept) replays
// block i's forward. forward_segments keeps each segment's input in *seg_input and
// returns the last block's output; with checkpointing only a segment's last output
// is an activation, the ones inside it temporaries.
template <typename Block>
Ledger::Id forward_segments(Ledger& L, const Common& c, Ledger::Id x0, std::vector<Kept>& st,
                            std::vector<Ledger::Id>& seg_input, Block&& block) {
  Ledger::Id cur = x0;
  for (int64_t first = 0; first < c.n_blocks; first += c.k) {
    const int64_t end = std::min(first + c.k, c.n_blocks);
    seg_input.push_back(cur);
    for (int64_t i = first; i < end; ++i) {
      L.phase(fmt::format("block {} forward", i));
      const Consumer out_c = (!c.ck || i + 1 == end) ? kAct : kWs;
      const Ledger::Id out = block(i, !c.ck, false, out_c, &st[static_cast<size_t>(i)]);
      if (!c.ck) st[static_cast<size_t>(i)].x = i > 0 ? cur : Ledger::kNone;
      if (c.ck && i > first) L.free(cur);  // a temporary inside the segment
      cur = out;
    }
  }
  return cur;
}

// The backward over the same segments, last first: a checkpointed segment's forward
// is replayed from its input, then its blocks run backward(i, kept). Returns the
// gradient of block 0's input (the caller frees it; dx stays the caller's).
template <typename Block, typename Backward>
Ledger::Id backward_segments(Ledger& L, const Common& c, Ledger::Id dx, std::vector<Kept>& st,
                             const std::vector<Ledger::Id>& seg_input, Block&& block, Backward&& backward) {
  Ledger::Id d = dx;
  bool d_owned = false;
  const int64_t segments = static_cast<int64_t>(seg_input.size());
  for (int64_t si = segments - 1; si >= 0; --si) {
    const int64_t first = si * c.k, end = std::min(first + c.k, c.n_blocks);
    if (c.ck) {
      Ledger::Id rc = seg_input[static_cast<size_t>(si)];
      for (int64_t i = first; i < end; ++i) {
        L.phase(fmt::format("block {} recompute", i));
        const Ledger::Id out = block(i, true, true, i + 1 == end ? kWs : kAct, &st[static_cast<size_t>(i)]);
        st[static_cast<size_t>(i)].x = i > first ? rc : Ledger::kNone;
        rc = out;
      }
      L.free(rc);  // the last recomputed output: the next segment's input exists already
    }
    for (int64_t i = end - 1; i >= first; --i) {
      L.phase(fmt::format("block {} backward", i));
      const Ledger::Id di = backward(i, st[static_cast<size_t>(i)]);
      if (d_owned) L.free(d);
      d = di;
      d_owned = true;
    }
    if (c.ck && si > 0) L.free(seg_input[static_cast<size_t>(si)]);
  }
  return d;
}

class TransformerReplay {
 public:
  TransformerReplay(Ledger& L, const Kernels& k, const StepConfig& cfg, const Common& c)
      : L_(L), k_(k), cfg_(cfg), c_(c) {
    const TransformerConfig& t = cfg.transformer;
    B_ = static_cast<double>(cfg.micro_batch);
    T_ = static_cast<double>(cfg.seq_len);
    N_ = B_ * T_;
    C_ = static_cast<double>(t.d_model);
    H_ = static_cast<double>(t.heads);
    D_ = C_ / H_;
    R_ = static_cast<double>(t.mlp_ratio) * C_;
    V_ = static_cast<double>(t.vocab);
    lora_ = cfg.adapters.kind == AdapterKind::lora;
    r_ = static_cast<double>(cfg.adapters.rank);
  }

  // One micro-batch's forward + backward; *boundary gets the activations alive after the loss.
  void pass(double* boundary) {
    const double NCs = N_ * C_ * c_.s;
    L_.phase("embedding");
    const Ledger::Id x0 = L_.alloc(kAct, NCs);
    std::vector<Kept> st(static_cast<size_t>(c_.n_blocks));
    std::vector<Ledger::Id> seg_input;
    // A transformer block's recompute allocates as its forward does.
    const auto block = [this](int64_t, bool keep, bool, Consumer out_c, Kept* k) {
      return block_forward(keep, out_c, k);
    };
    const Ledger::Id xL = forward_segments(L_, c_, x0, st, seg_input, block);
    L_.phase("final layernorm and logits");
    const Ledger::Id lnf = L_.alloc(kAct, NCs), meanf = L_.alloc(kAct, N_ * c_.stats_row / 2),
                     rstdf = L_.alloc(kAct, N_ * c_.stats_row / 2);
    const Ledger::Id logits = L_.alloc(kAct, N_ * V_ * c_.s);
    k_.linear_forward(N_, C_, V_);
    L_.phase("loss");
    k_.cross_entropy_forward(N_);
    *boundary = L_.current(kAct);

    L_.phase("logits backward");
    const Ledger::Id dlnf = L_.alloc(kWs, NCs);
    const Ledger::Id dlogits = L_.alloc(kWs, N_ * V_ * c_.s);
    L_.free(logits);
    k_.linear_backward(N_, C_, V_, true, false, !lora_);
    L_.free(dlogits);
    L_.free(lnf);
    L_.phase("final layernorm backward");
    const Ledger::Id dxL = L_.alloc(kWs, NCs);
    layernorm_backward();
    L_.free(dlnf), L_.free(meanf), L_.free(rstdf), L_.free(xL);

    // The stack backward (harness/step/checkpoint.cpp): dxL stays held by the caller.
    const Ledger::Id d = backward_segments(L_, c_, dxL, st, seg_input, block,
                                           [this](int64_t, Kept& k) { return block_backward(k); });
    L_.free(dxL);
    L_.free(x0);
    L_.phase("embedding backward");
    if (!lora_) {  // frozen embeddings: no gradient scattered
      k_.embedding_backward(N_, V_);
      k_.embedding_backward(N_, T_);
    }
    L_.free(d);
  }

  nlohmann::json layer_terms() const {
    const double NCs = N_ * C_ * c_.s;
    const double attention = cfg_.transformer.memory_efficient_attention ? B_ * H_ * T_ * 4 : B_ * H_ * T_ * T_ * c_.s;
    nlohmann::json t = {{"block_input", NCs},
                        {"ln1_out", NCs},
                        {"ln1_mean_rstd_fp32", N_ * c_.stats_row},
                        {"q_k_v", 3 * NCs},
                        {"attention_out", NCs},
                        {cfg_.transformer.memory_efficient_attention ? "attention_row_lse_fp32" : "attention_probs",
                         attention},
                        {"x1_residual", NCs},
                        {"ln2_out", NCs},
                        {"ln2_mean_rstd_fp32", N_ * c_.stats_row},
                        {"fc_out", R_ * N_ * c_.s},
                        {"gelu_out", R_ * N_ * c_.s}};
    double sum = 0;
    for (const auto& [name, v] : t.items()) sum += v.get<double>();
    return {{"per_layer", t},
            {"per_layer_total", sum},
            {"formula", "N C s (8 + 2 r) + 2 N 8 + attention (N = b T tokens, s bytes, r mlp_ratio)"},
            {"head", {{"last_block_out", NCs},
                      {"lnf_out", NCs},
                      {"lnf_mean_rstd_fp32", N_ * c_.stats_row},
                      {"logits", N_ * V_ * c_.s}}}};
  }

  // The closed form of the activation peak and of the activations at the boundary.
  double closed_form(double* at_boundary, nlohmann::json& b) const {
    const double NCs = N_ * C_ * c_.s;
    const double attention = cfg_.transformer.memory_efficient_attention ? B_ * H_ * T_ * 4 : B_ * H_ * T_ * T_ * c_.s;
    const double own = NCs * (7 + 2 * static_cast<double>(cfg_.transformer.mlp_ratio)) + 2 * N_ * c_.stats_row +
                       attention;
    const double head = NCs + N_ * c_.stats_row + N_ * V_ * c_.s;
    return stack_peak(cfg_.transformer.layers, cfg_.checkpoint.every_k_blocks, own, NCs, NCs, head, at_boundary, b);
  }

 private:
  // TransformerModel::layernorm_backward_params: a frozen norm's gradients are fp32 temporaries.
  void layernorm_backward() {
    const Ledger::Id dg = lora_ ? L_.alloc(kWs, C_ * 4) : Ledger::kNone;
    const Ledger::Id db = lora_ ? L_.alloc(kWs, C_ * 4) : Ledger::kNone;
    k_.layernorm_backward(N_, C_);
    L_.free(dg), L_.free(db);
  }
  // TransformerModel::lora_forward: lin += s (x A^T) B^T through two temporaries.
  void lora_forward() {
    const Ledger::Id u = L_.alloc(kWs, N_ * r_ * c_.s);
    k_.linear_forward(N_, C_, r_);
    const Ledger::Id d = L_.alloc(kWs, N_ * C_ * c_.s);
    k_.linear_forward(N_, r_, C_);
    L_.free(u);
    L_.free(d);
  }
  // TransformerModel::lora_backward: x A^T recomputed, then B's and A's gradients.
  void lora_backward() {
    const Ledger::Id u = L_.alloc(kWs, N_ * r_ * c_.s);
    k_.linear_forward(N_, C_, r_);
    const Ledger::Id du = L_.alloc(kWs, N_ * r_ * c_.s);
    k_.linear_backward(N_, r_, C_, true, false);
    L_.free(u);
    k_.linear_backward(N_, C_, r_, true, false);  // added into the caller's dx
    L_.free(du);
  }

  // harness/models/transformer.cpp block_forward: keep = the tensors are activations.
  Ledger::Id block_forward(bool keep, Consumer out_c, Kept* st) {
    const Consumer a = keep ? kAct : kWs;
    const double NCs = N_ * C_ * c_.s, stats = N_ * c_.stats_row / 2;
    std::vector<Ledger::Id> ids;
    ids.push_back(L_.alloc(a, NCs));  // ln1
    ids.push_back(L_.alloc(a, stats)), ids.push_back(L_.alloc(a, stats));
    for (int h = 0; h < 3; ++h) {  // q, k, v: a projection into a temporary, split into heads
      const Ledger::Id lin = L_.alloc(kWs, NCs);
      k_.linear_forward(N_, C_, C_);
      if (lora_ && h != 1) lora_forward();  // q and v carry adapters
      ids.push_back(L_.alloc(a, NCs));
      L_.free(lin);
    }
    ids.push_back(L_.alloc(a, NCs));  // attention out
    if (cfg_.transformer.memory_efficient_attention) {
      ids.push_back(L_.alloc(a, B_ * H_ * T_ * 4));  // row log-sum-exp
      k_.attention_mem_efficient_forward(T_, D_);
    } else {
      ids.push_back(L_.alloc(a, B_ * H_ * T_ * T_ * c_.s));  // probabilities
      const Ledger::Id scores = L_.alloc(kWs, B_ * H_ * T_ * T_ * c_.s);
      k_.gemm(N_ * C_, N_ * C_, B_ * H_ * T_ * T_, false);  // q k^T
      L_.free(scores);
      // Dropout on the probabilities: drop(p) is a temporary beside the kept p.
      const Ledger::Id dropped =
          cfg_.transformer.attn_probs_p() > 0.f ? L_.alloc(kWs, B_ * H_ * T_ * T_ * c_.s) : Ledger::kNone;
      k_.gemm(B_ * H_ * T_ * T_, N_ * C_, N_ * C_, false);  // p v
      L_.free(dropped);
    }
    ids.push_back(L_.alloc(a, NCs));  // x1
    {
      const Ledger::Id merged = L_.alloc(kWs, NCs);
      Ledger::Id proj = L_.alloc(kWs, NCs);
      k_.linear_forward(N_, C_, C_);
      if (cfg_.transformer.attn_out_p() > 0.f) {  // the attention branch's dropout
        const Ledger::Id dropped = L_.alloc(kWs, NCs);
        L_.free(proj);
        proj = dropped;
      }
      L_.free(proj), L_.free(merged);
    }
    ids.push_back(L_.alloc(a, NCs));  // ln2
    ids.push_back(L_.alloc(a, stats)), ids.push_back(L_.alloc(a, stats));
    ids.push_back(L_.alloc(a, N_ * R_ * c_.s));  // fc out
    k_.linear_forward(N_, C_, R_);
    ids.push_back(L_.alloc(a, N_ * R_ * c_.s));  // gelu out
    const Ledger::Id out = L_.alloc(out_c, NCs);
    {
      Ledger::Id m = L_.alloc(kWs, NCs);
      k_.linear_forward(N_, R_, C_);
      if (cfg_.transformer.dropout > 0.f) {
        const Ledger::Id dropped = L_.alloc(kWs, NCs);
        L_.free(m);
        m = dropped;
      }
      L_.free(m);
    }
    if (keep) {
      st->ids = std::move(ids);
    } else {
      for (Ledger::Id id : ids) L_.free(id);
    }
    return out;
  }

  // harness/models/transformer.cpp block_backward; the incoming gradient stays
  // held by the caller throughout. Frees the state as the code does.
  Ledger::Id block_backward(Kept& st) {
    const double NCs = N_ * C_ * c_.s;
    const auto& id = st.ids;  // ln1 mean1 rstd1 q k v att saved x1 ln2 mean2 rstd2 fc act
    const bool dropout = cfg_.transformer.dropout > 0.f;
    const Ledger::Id dx1 = L_.alloc(kWs, NCs);
    {
      const Ledger::Id dm = dropout ? L_.alloc(kWs, NCs) : Ledger::kNone;
      const Ledger::Id dact = L_.alloc(kWs, N_ * R_ * c_.s);
      k_.linear_backward(N_, R_, C_, true, !lora_, !lora_);
      L_.free(dm);
      L_.free(id[13]);  // act
      const Ledger::Id dfc = L_.alloc(kWs, N_ * R_ * c_.s);
      L_.free(dact);
      L_.free(id[12]);  // fc
      const Ledger::Id dln2 = L_.alloc(kWs, NCs);
      k_.linear_backward(N_, C_, R_, true, !lora_, !lora_);
      L_.free(dfc);
      L_.free(id[9]);  // ln2
      layernorm_backward();
      L_.free(id[8]), L_.free(id[10]), L_.free(id[11]);  // x1, mean2, rstd2
      L_.free(dln2);
    }
    const Ledger::Id dq = L_.alloc(kWs, NCs), dk = L_.alloc(kWs, NCs), dv = L_.alloc(kWs, NCs);
    {
      const Ledger::Id dproj = cfg_.transformer.attn_out_p() > 0.f ? L_.alloc(kWs, NCs) : Ledger::kNone;
      const Ledger::Id merged = L_.alloc(kWs, NCs), dmerged = L_.alloc(kWs, NCs);
      k_.linear_backward(N_, C_, C_, true, !lora_, !lora_);
      L_.free(merged);
      L_.free(dproj);
      const Ledger::Id datt = L_.alloc(kWs, NCs);
      L_.free(dmerged);
      const double bhtt = B_ * H_ * T_ * T_;
      if (cfg_.transformer.memory_efficient_attention) {
        k_.attention_mem_efficient_backward(B_ * H_, T_, D_);
      } else {
        const Ledger::Id dropped =  // drop(P), replayed for dV
            cfg_.transformer.attn_probs_p() > 0.f ? L_.alloc(kWs, bhtt * c_.s) : Ledger::kNone;
        k_.gemm(bhtt, N_ * C_, N_ * C_, false);  // dV = P^T dO
        L_.free(dropped);
        const Ledger::Id dscores = L_.alloc(kWs, bhtt * c_.s);
        const Ledger::Id dprobs = L_.alloc(kWs, bhtt * c_.s);
        k_.gemm(N_ * C_, N_ * C_, bhtt, false);  // dP = dO V^T
        L_.free(dprobs);
        k_.gemm(bhtt, N_ * C_, N_ * C_, false);  // dQ = dS K
        k_.gemm(bhtt, N_ * C_, N_ * C_, false);  // dK = dS^T Q
        L_.free(dscores);
      }
      for (int j = 3; j <= 7; ++j) L_.free(id[static_cast<size_t>(j)]);  // q, k, v, att, saved
      L_.free(datt);
    }
    const Ledger::Id dln1 = L_.alloc(kWs, NCs);
    {
      const Ledger::Id lin = L_.alloc(kWs, NCs);
      for (Ledger::Id dh : {dq, dk, dv}) {  // each added into dln1
        L_.free(dh);
        k_.linear_backward(N_, C_, C_, true, !lora_, !lora_);
        if (lora_ && dh != dk) lora_backward();  // q and v carry adapters
      }
      L_.free(id[0]);  // ln1
      L_.free(lin);
    }
    const Ledger::Id dx = L_.alloc(kWs, NCs);
    layernorm_backward();
    L_.free(id[1]), L_.free(id[2]);  // mean1, rstd1
    L_.free(st.x);
    L_.free(dln1), L_.free(dx1);
    return dx;
  }

  Ledger& L_;
  const Kernels& k_;
  const StepConfig& cfg_;
  Common c_;
  double B_, T_, N_, C_, H_, D_, R_, V_;
  bool lora_ = false;
  double r_ = 0;
};

class MlpReplay {
 public:
  MlpReplay(Ledger& L, const Kernels& k, const StepConfig& cfg, const Common& c) : L_(L), k_(k), cfg_(cfg), c_(c) {
    const MlpConfig& m = cfg.mlp;
    N_ = static_cast<double>(cfg.micro_batch);
    W_ = static_cast<double>(m.width);
    In_ = static_cast<double>(m.in_dim);
    Out_ = static_cast<double>(m.out_dim);
    vb_ =
        m.bn_virtual_batch <= 0 || m.bn_virtual_batch >= cfg.micro_batch ? N_ : static_cast<double>(m.bn_virtual_batch);
    lora_ = cfg.adapters.kind == AdapterKind::lora;
    r_ = static_cast<double>(cfg.adapters.rank);
  }

  void pass(double* boundary) {
    const double NWs = N_ * W_ * c_.s;
    L_.phase("input cast");
    const Ledger::Id x0 = L_.alloc(kAct, N_ * In_ * c_.s);
    std::vector<Kept> st(static_cast<size_t>(c_.n_blocks));
    std::vector<Ledger::Id> seg_input;
    const auto block = [this](int64_t i, bool keep, bool recompute, Consumer out_c, Kept* k) {
      return block_forward(i, keep, recompute, out_c, k);
    };
    const Ledger::Id xL = forward_segments(L_, c_, x0, st, seg_input, block);
    L_.phase("head and loss");
    const Ledger::Id pred = L_.alloc(kAct, N_ * Out_ * c_.s);
    k_.linear_forward(N_, W_, Out_);
    if (cfg_.mlp.task == MlpTask::regression) {
      k_.mse_forward(N_ * Out_);
    } else {
      k_.cross_entropy_forward(N_);
    }
    *boundary = L_.current(kAct);

    L_.phase("head backward");
    const Ledger::Id dpred = L_.alloc(kWs, N_ * Out_ * c_.s);
    L_.free(pred);
    const Ledger::Id dxL = L_.alloc(kWs, NWs);
    k_.linear_backward(N_, W_, Out_, true, !lora_, !lora_);
    L_.free(dpred), L_.free(xL);

    const Ledger::Id d = backward_segments(L_, c_, dxL, st, seg_input, block,
                                           [this](int64_t i, Kept& k) { return block_backward(i, k); });
    L_.free(d);  // undefined for block 0 (its input needs no gradient)
    L_.free(x0), L_.free(dxL);
  }

  double norm_stats_bytes() const {
    if (cfg_.mlp.norm == NormKind::layernorm) return N_ * c_.stats_row;
    if (cfg_.mlp.norm == NormKind::batchnorm) return (N_ / vb_) * W_ * c_.stats_row;
    return 0;
  }

  nlohmann::json layer_terms() const {
    const double NWs = N_ * W_ * c_.s;
    nlohmann::json t = {{"block_input", NWs}, {"linear_out", NWs}};
    if (cfg_.mlp.norm != NormKind::none) {
      t["norm_out"] = NWs;
      t[cfg_.mlp.norm == NormKind::layernorm ? "layernorm_mean_rstd_fp32" : "batchnorm_mean_rstd_fp32_per_chunk"] =
          norm_stats_bytes();
    }
    double sum = 0;
    for (const auto& [name, v] : t.items()) sum += v.get<double>();
    return {{"per_layer", t},
            {"per_layer_total", sum},
            {"note", "block 0's input is the input cast to the compute dtype, N in_dim s"},
            {"head", {{"last_block_out", NWs}, {"prediction", N_ * Out_ * c_.s}}}};
  }

  double closed_form(double* at_boundary, nlohmann::json& b) const {
    const double NWs = N_ * W_ * c_.s;
    const double own = NWs * (cfg_.mlp.norm == NormKind::none ? 1 : 2) + norm_stats_bytes();
    return stack_peak(cfg_.mlp.layers - 1, cfg_.checkpoint.every_k_blocks, own, NWs, N_ * In_ * c_.s,
                      N_ * Out_ * c_.s, at_boundary, b);
  }

 private:
  // harness/models/mlp.cpp block_forward.
  Ledger::Id block_forward(int64_t i, bool keep, bool recompute, Consumer out_c, Kept* st) {
    const Consumer a = keep ? kAct : kWs;
    const double NWs = N_ * W_ * c_.s, in = i == 0 ? In_ : W_;
    std::vector<Ledger::Id> ids;
    ids.push_back(L_.alloc(a, NWs));  // linear out
    k_.linear_forward(N_, in, W_);
    if (lora_) {  // h += s (x A^T) B^T through two temporaries
      const Ledger::Id u = L_.alloc(kWs, N_ * r_ * c_.s);
      k_.linear_forward(N_, in, r_);
      const Ledger::Id d = L_.alloc(kWs, NWs);
      k_.linear_forward(N_, r_, W_);
      L_.free(u), L_.free(d);
    }
    std::vector<Ledger::Id> scratch;
    if (cfg_.mlp.norm == NormKind::layernorm) {
      ids.push_back(L_.alloc(a, NWs));
      ids.push_back(L_.alloc(a, N_ * c_.stats_row / 2)), ids.push_back(L_.alloc(a, N_ * c_.stats_row / 2));
    } else if (cfg_.mlp.norm == NormKind::batchnorm) {
      const double chunks = N_ / vb_;
      ids.push_back(L_.alloc(a, NWs));
      ids.push_back(L_.alloc(a, chunks * W_ * c_.stats_row / 2));
      ids.push_back(L_.alloc(a, chunks * W_ * c_.stats_row / 2));
      // A recompute normalises into scratch copies of the running statistics.
      if (recompute && !cfg_.checkpoint.update_bn_stats_on_recompute)
        scratch.push_back(L_.alloc(kWs, 4 * W_)), scratch.push_back(L_.alloc(kWs, 4 * W_));
      for (double c = 0; c < chunks; ++c) k_.batchnorm_forward_train(vb_, W_);
    }
    const Ledger::Id out = L_.alloc(out_c, NWs);
    if (cfg_.mlp.dropout > 0.f) L_.free(L_.alloc(kWs, NWs));  // GELU out, dropout's input
    for (Ledger::Id id : scratch) L_.free(id);
    if (keep) {
      st->ids = std::move(ids);
    } else {
      for (Ledger::Id id : ids) L_.free(id);
    }
    return out;
  }

  Ledger::Id block_backward(int64_t i, Kept& st) {
    const double NWs = N_ * W_ * c_.s, in = i == 0 ? In_ : W_;
    const auto& id = st.ids;  // h [n mean rstd]
    const Ledger::Id dg = cfg_.mlp.dropout > 0.f ? L_.alloc(kWs, NWs) : Ledger::kNone;
    const Ledger::Id dn = L_.alloc(kWs, NWs);
    L_.free(dg);
    Ledger::Id dh = dn;
    if (cfg_.mlp.norm != NormKind::none) {
      dh = L_.alloc(kWs, NWs);
      if (cfg_.mlp.norm == NormKind::layernorm) {
        const Ledger::Id dgamma = lora_ ? L_.alloc(kWs, 4 * W_) : Ledger::kNone;  // a frozen norm's temporaries
        const Ledger::Id dbeta = lora_ ? L_.alloc(kWs, 4 * W_) : Ledger::kNone;
        k_.layernorm_backward(N_, W_);
        L_.free(dgamma), L_.free(dbeta);
      } else {
        for (double c = 0; c < N_ / vb_; ++c) k_.batchnorm_backward(vb_, W_);
      }
      L_.free(dn);
      L_.free(id[1]), L_.free(id[2]), L_.free(id[3]);
    }
    const bool need_dx = i > 0;
    const Ledger::Id dx = need_dx ? L_.alloc(kWs, N_ * in * c_.s) : Ledger::kNone;
    k_.linear_backward(N_, in, W_, need_dx, !lora_, !lora_);
    if (lora_) {  // harness/models/mlp.cpp: x A^T recomputed, then B's and A's gradients
      const Ledger::Id u = L_.alloc(kWs, N_ * r_ * c_.s);
      k_.linear_forward(N_, in, r_);
      const Ledger::Id du = L_.alloc(kWs, N_ * r_ * c_.s);
      k_.linear_backward(N_, r_, W_, true, false);
      L_.free(u);
      k_.linear_backward(N_, in, r_, need_dx, false);  // added into dx
      L_.free(du);
    }
    L_.free(st.x), L_.free(id[0]);
    L_.free(dh);
    return dx;
  }

  Ledger& L_;
  const Kernels& k_;
  const StepConfig& cfg_;
  Common c_;
  double N_, W_, In_, Out_, vb_;
  bool lora_ = false;
  double r_ = 0;
};

double batch_bytes(const StepConfig& cfg) {
  const double rows = static_cast<double>(cfg.batch);
  if (cfg.model == ModelKind::transformer) return 3 * rows * static_cast<double>(cfg.seq_len) * 4;  // ids, pos, targets
  const double x = rows * static_cast<double>(cfg.mlp.in_dim) * 4;
  return x + (cfg.mlp.task == MlpTask::regression ? rows * static_cast<double>(cfg.mlp.out_dim) * 4 : rows * 4);
}

}  // namespace

RoughStepBytes rough_step_bytes(const StepConfig& cfg) {
  // Each term in double, so that no size within validate()'s ranges overflows.
  auto d = [](int64_t v) { return static_cast<double>(v); };
  RoughStepBytes r;
  auto term = [&r](double bytes, const char* what) {
    r.total += bytes;
    if (bytes > r.largest) {
      r.largest = bytes;
      r.largest_term = what;
    }
  };
  const double rows = d(cfg.micro_batch);
  if (cfg.model == ModelKind::mlp) {
    const auto& m = cfg.mlp;
    const double width = std::max({d(m.in_dim), d(m.width), d(m.out_dim)});
    term(d(m.layers) * width * width * 4 * 4, "weights, gradients and optimizer state (mlp.layers x mlp.width^2)");
    term(d(m.layers) * width * rows * 4, "activations (mlp.layers x mlp.width x micro_batch)");
  } else {
    const auto& t = cfg.transformer;
    const double dm = d(t.d_model), tokens = rows * d(cfg.seq_len);
    term(d(t.layers) * dm * dm * d(4 + 2 * t.mlp_ratio) * 4 * 4,
         "weights, gradients and optimizer state (transformer.layers x d_model^2)");
    term((d(t.vocab) + d(t.max_positions)) * dm * 4 * 4,
         "embeddings (transformer.vocab + max_positions) x d_model");
    term(d(t.layers) * tokens * dm * d(4 + t.mlp_ratio) * 4,
         "activations (transformer.layers x micro_batch x seq_len x d_model)");
    term(d(t.layers) * rows * d(t.heads) * d(cfg.seq_len) * d(cfg.seq_len) * 4,
         "attention probabilities (layers x micro_batch x heads x seq_len^2)");
    term(tokens * d(t.vocab) * 4, "logits (micro_batch x seq_len x transformer.vocab)");
  }
  return r;
}

MemoryPrediction predict_memory(const StepConfig& cfg, BackendKind backend, PredictionFault fault) {
  fault = faults::armed(fault);
  if (fault == PredictionFault::ignore_checkpointing) {
    StepConfig plain = cfg;
    plain.checkpoint.every_k_blocks = 0;
    return predict_memory(plain, backend, PredictionFault::none);
  }
  validate(cfg);
  {
    // The byte counts below are size_t: a step whose rough size passes 2^60 bytes
    // (an exabyte, past any memory) is refused before they could wrap.
    const RoughStepBytes rough = rough_step_bytes(cfg);
    HR_ARG_CHECK(rough.total <= kMaxPredictableBytes,
                 "the configuration needs about {:.3g} bytes for one step, past any memory ({:.3g} of them {}): "
                 "smaller sizes, please",
                 rough.total, rough.largest, rough.largest_term);
  }
  MemoryPrediction p;
  const int64_t P = parameter_count(cfg);
  p.parameters = P;
  const size_t s = dtype_size(cfg.precision.compute);
  const bool copies = cfg.precision.master_weights && cfg.precision.compute != DType::f32;
  const size_t master_s = cfg.precision.master_weights ? 4 : s;
  double weights = static_cast<double>(P) * static_cast<double>(master_s + (copies ? s : 0));
  if (cfg.model == ModelKind::mlp && cfg.mlp.norm == NormKind::batchnorm)
    weights += static_cast<double>((cfg.mlp.layers - 1) * 2 * cfg.mlp.width * 4);  // running mean and variance
  // Gradients and optimizer state: trainable parameters only (LoRA: the adapters).
  std::vector<int64_t> trainable = trainable_tensor_sizes(cfg);
  double P_train = 0;
  for (const int64_t n : trainable) P_train += static_cast<double>(n);
  const double gradients = P_train * 4;
  double optimizer = 0;
  switch (cfg.optimizer.kind) {
    case OptimizerKind::adamw: optimizer = P_train * 8; break;
    case OptimizerKind::sgd: optimizer = cfg.optimizer.sgd.momentum != 0.f ? P_train * 4 : 0; break;
    case OptimizerKind::custom: optimizer = 0; break;  // not modelled
    case OptimizerKind::adamw8bit:
      // Per tensor: 2 bytes of codes per element plus 2 fp32 absmax per block, or fp32
      // moments (8 bytes per element) under q8::kMin8bitNumel elements.
      for (const int64_t n : trainable)
        optimizer += static_cast<double>(adamw8bit_state_bytes(n, cfg.optimizer.adamw8bit.block_size));
      break;
  }

  Ledger L;
  const Kernels k{L, backend == BackendKind::cuda, backend == BackendKind::cpu && s != 4};
  L.alloc(Consumer::weights, weights);
  L.alloc(Consumer::gradients, gradients);
  L.alloc(Consumer::optimizer_state, optimizer);
  L.alloc(kWs, batch_bytes(cfg));

  Common c{};
  c.s = static_cast<double>(s);
  c.stats_row = fault == PredictionFault::omit_norm_stats ? 0 : 8;
  c.n_blocks = cfg.model == ModelKind::mlp ? cfg.mlp.layers - 1 : cfg.transformer.layers;
  c.ck = cfg.checkpoint.enabled();
  c.k = c.ck ? std::min(cfg.checkpoint.every_k_blocks, c.n_blocks) : c.n_blocks;

  double boundary = 0, boundary_closed = 0, peak_closed = 0;
  nlohmann::json closed = nlohmann::json::object();
  for (int64_t m = 0; m < cfg.accum_steps(); ++m) {
    double b = 0;
    if (cfg.model == ModelKind::transformer) {
      TransformerReplay r(L, k, cfg, c);
      r.pass(&b);
      if (m == 0) p.layer_terms = r.layer_terms(), peak_closed = r.closed_form(&boundary_closed, closed);
    } else {
      MlpReplay r(L, k, cfg, c);
      r.pass(&b);
      if (m == 0) p.layer_terms = r.layer_terms(), peak_closed = r.closed_form(&boundary_closed, closed);
    }
    if (m == 0) boundary = b;
  }
  // After the micro-batches: unscaling (CUDA: a 4-byte flag per gradient) and the
  // optimizer allocate nothing that reaches an earlier peak.

  auto bytes = [](double v) { return static_cast<size_t>(v); };
  p.weights = bytes(L.peak(Consumer::weights));
  p.gradients = bytes(L.peak(Consumer::gradients));
  p.optimizer_state = bytes(L.peak(Consumer::optimizer_state));
  p.activations = bytes(L.peak(kAct));
  p.workspace = bytes(L.peak(kWs));
  p.total_peak = bytes(L.total_peak());
  p.batch_bytes = bytes(batch_bytes(cfg));
  p.boundary_activations = bytes(boundary);
  p.layer_terms["closed_form"] = closed;
  p.layer_terms["closed_form"]["activation_peak"] = peak_closed;
  p.layer_terms["closed_form"]["boundary_activations"] = boundary_closed;
  p.timeline = {{"total_peak_at", L.total_peak_at()},
                {"activations_peak_at", L.peak_at(kAct)},
                {"workspace_peak_at", L.peak_at(kWs)},
                {"backend", backend_name(backend)}};
  return p;
}

}  // namespace hr
