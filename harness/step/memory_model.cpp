// The analytical memory model (see memory_model.hpp). The activation formulas
// follow the tensors each model keeps (harness/models/*.hpp list them); they are
// derived per layer, not read back from the allocator.
#include "harness/step/memory_model.hpp"

#include <algorithm>

#include "harness/check.hpp"

namespace hr {

size_t MemoryPrediction::of(Consumer c) const {
  switch (c) {
    case Consumer::weights: return weights;
    case Consumer::gradients: return gradients;
    case Consumer::optimizer_state: return optimizer_state;
    case Consumer::activations: return activations;
    case Consumer::workspace: return 0;
  }
  return 0;
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
    return p;
  }
  const TransformerConfig& t = cfg.transformer;
  const int64_t C = t.d_model, R = t.mlp_ratio * C;
  const int64_t per_block = 2 * C              // ln1
                            + 4 * (C * C + C)  // q, k, v, proj
                            + 2 * C            // ln2
                            + (R * C + R)      // fc
                            + (C * R + C);     // mlp proj
  return t.vocab * C + t.max_positions * C + t.layers * per_block + 2 * C + t.vocab * C;
}

namespace {

// Peak activation bytes of a stack of n blocks, each keeping `own` bytes besides
// its input, whose outputs (= next inputs) are `boundary` bytes, under
// checkpointing every k blocks (0 = none). `head` is what is kept after the
// stack (at the end of the forward pass, all of it alive); `input` is the
// stack's input (kept: the first block or segment needs it).
double stack_peak(int64_t n, int64_t k, double own, double boundary, double input, double head,
                  nlohmann::json& b) {
  if (k <= 0) {
    // Everything alive at the end of the forward pass.
    b["blocks_kept"] = n;
    return input + static_cast<double>(n) * (own + boundary) + head;
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
  return std::max(fwd, bwd);
}

}  // namespace

MemoryPrediction predict_memory(const StepConfig& cfg) {
  validate(cfg);
  MemoryPrediction p;
  const int64_t P = parameter_count(cfg);
  p.parameters = P;
  const size_t s = dtype_size(cfg.precision.compute);
  const bool copies = cfg.precision.master_weights && cfg.precision.compute != DType::f32;
  const size_t master_s = cfg.precision.master_weights ? 4 : s;
  p.weights = static_cast<size_t>(P) * (master_s + (copies ? s : 0));
  p.gradients = static_cast<size_t>(P) * 4;
  switch (cfg.optimizer.kind) {
    case OptimizerKind::adamw: p.optimizer_state = static_cast<size_t>(P) * 8; break;
    case OptimizerKind::sgd: p.optimizer_state = cfg.optimizer.sgd.momentum != 0.f ? static_cast<size_t>(P) * 4 : 0; break;
    case OptimizerKind::custom: p.optimizer_state = 0; break;  // not modelled
  }
  nlohmann::json& b = p.breakdown;
  const double S = static_cast<double>(s);

  if (cfg.model == ModelKind::mlp) {
    const MlpConfig& m = cfg.mlp;
    const double N = static_cast<double>(cfg.micro_batch), W = static_cast<double>(m.width);
    if (m.norm == NormKind::batchnorm) p.weights += static_cast<size_t>(m.layers - 1) * 2 * static_cast<size_t>(m.width) * 4;
    // Per block, besides its input: linear out N W s; with a norm its output N W s
    // and its statistics (LayerNorm: mean, rstd fp32 per row, 8 N; BatchNorm: fp32
    // per channel per virtual batch, 8 W * chunks).
    double own = N * W * S;
    if (m.norm == NormKind::layernorm) own += N * W * S + 8 * N;
    if (m.norm == NormKind::batchnorm) {
      const int64_t vb = m.bn_virtual_batch > 0 ? m.bn_virtual_batch : cfg.micro_batch;
      own += N * W * S + 8 * W * static_cast<double>(cfg.micro_batch / vb);
    }
    const double boundary = N * W * S;                                  // block output (GELU [+ dropout])
    const double input = N * static_cast<double>(m.in_dim) * S;         // the input cast to the compute dtype
    const double head = N * static_cast<double>(m.out_dim) * S;         // the prediction
    b = {{"per_block_own", own}, {"per_block_output", boundary}, {"input", input}, {"head", head}};
    p.activations = static_cast<size_t>(stack_peak(m.layers - 1, cfg.checkpoint.every_k_blocks, own, boundary,
                                                    input, head, b));
    return p;
  }

  // Transformer, per micro-batch of b rows of T tokens: N = b T, C = d_model,
  // H heads, r = mlp_ratio, V = vocab.
  const TransformerConfig& t = cfg.transformer;
  const double bsz = static_cast<double>(cfg.micro_batch), T = static_cast<double>(cfg.seq_len);
  const double N = bsz * T, C = static_cast<double>(t.d_model), H = static_cast<double>(t.heads);
  const double r = static_cast<double>(t.mlp_ratio), V = static_cast<double>(t.vocab);
  // Per block, besides its input x:
  //   LN1 out, q, k, v, attention out, x1, LN2 out      7 N C s
  //   fc out and GELU out                               2 r N C s
  //   LN1 and LN2 mean, rstd (fp32)                     16 N
  //   attention: naive keeps the probabilities          b H T T s
  //              memory-efficient keeps the row LSE     b H T 4
  // = N C s (7 + 2r) + 16 N + attention; with the block output (N C s) that is
  // s b T C (8 + 2r + 16/(C s) + H T / C) for naive attention: the
  // Korthikanti form s b h (34 + 5 a s / h) without masks (dropout is replayed)
  // and with one copy of the scores (the softmax keeps only its output).
  const double attention = t.memory_efficient_attention ? bsz * H * T * 4 : bsz * H * T * T * S;
  const double own = N * C * S * (7 + 2 * r) + 16 * N + attention;
  const double boundary = N * C * S;  // block output = next block's input
  const double input = N * C * S;     // embedding output
  // Final LayerNorm out (N C s) + its mean, rstd (8 N) + logits (N V s).
  const double head = N * C * S + 8 * N + N * V * S;
  b = {{"per_block_own", own}, {"per_block_attention", attention}, {"per_block_output", boundary},
       {"input", input},       {"head", head}};
  p.activations =
      static_cast<size_t>(stack_peak(t.layers, cfg.checkpoint.every_k_blocks, own, boundary, input, head, b));
  return p;
}

}  // namespace hr
