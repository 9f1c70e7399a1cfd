// Every numerical bound headroom asserts (test suites and run-time properties), in
// one place, each with its reason. Op bounds are normalised mean squared errors,
// NMSE = sum (a - b)^2 / sum b^2, of a result against its float64 reference (the
// anchor: ggml test-backend-ops, 1e-7 for most ops, 5e-4 for matrix products).
#pragma once

#include <cmath>
#include <cstdint>

#include "harness/dtype.hpp"

namespace hr::tol {

// ---- Check power (docs/catalogue.md POWER) ----
// A subtle negative control injects a fault whose error lies within this many
// times the check's bound: a check that catches it can see errors near its bound,
// not only the gross failure mode. A larger error is not a subtle control. For a
// bitwise check (bound 0, mismatching elements counted) it means a fault that
// changes at most this many elements.
inline constexpr double kSubtleControlMaxPower = 100.0;

// A bound per storage dtype.
struct PerDType {
  double f32, f16, bf16;
  constexpr double operator()(DType t) const {
    return t == DType::f16 ? f16 : t == DType::bf16 ? bf16 : f32;
  }
};

// Row-wise ops (layernorm, batchnorm, softmax, embedding, cross-entropy), forward
// and backward. The reference is fed the same (already rounded) inputs, so what
// remains is fp32 arithmetic plus one rounding of each stored output:
// - fp32: anchor ggml's 1e-7; fp32 accumulation over rows of up to 50304 values
//   measures ~1e-13, so the bound has wide headroom and still fails on any wrong
//   term (a missing mask or a wrong normaliser moves NMSE to >= 1e-4).
// - fp16: rounding a value to 11 significant bits has a mean squared relative
//   error of u^2 / 3 with u = 2^-11, about 8e-8; 1e-6 leaves ~12x for the outputs
//   that go through a second stored tensor (probabilities, then their gradient).
// - bf16: the same with u = 2^-8 gives 5.1e-6; 5e-5 leaves ~10x.
inline constexpr PerDType kRowwiseNmse{1e-7, 1e-6, 5e-5};

// Backward passes against float64 central finite differences of the reference
// forward (OPS-2). Finite differences with h = 1e-6 in double are accurate to
// ~1e-9 relative, far below these; the bound is the dtype's storage error as above,
// with 4x for the two stored tensors a gradient passes through (inputs and dy).
inline constexpr PerDType kRowwiseGradNmse{1e-7, 4e-6, 2e-4};

// Matrix products (matmul, matmul_batched, linear) against float64 (OPS-1). The
// anchor, ggml's 5e-4, is a ceiling; ours are tighter because accumulation is
// fp32 everywhere (no TF32, no reduced-precision reductions):
// - fp32: rounding over K <= 1031 terms is ~sqrt(K) 2^-24 relative and measures
//   ~1e-13 NMSE; 1e-9 leaves room for any summation order (cuBLAS splits K).
// - fp16 / bf16: one rounding of the output dominates (u^2 / 3: 8e-8 resp. 5e-6,
//   measured 7e-8 resp. 4e-6); 1e-6 resp. 5e-5 as for the row-wise ops. A linear
//   layer's output is rounded twice (the product, then its sum with the bias):
//   measured 9e-8 resp. 5.5e-6, within the same bounds.
inline constexpr PerDType kMatmulNmse{1e-9, 1e-6, 5e-5};

// Attention forward (naive and memory-efficient) against float64 (OPS-1). Naive
// attention in fp16 / bf16 stores the scores and probabilities in the storage
// dtype before the second product (as eager PyTorch does): three stored roundings
// compound and exp() turns an absolute rounding of a score into a relative error
// of the probability, so 10x the matmul bound; fp32 as for the matmul. Measured
// (CPU, T up to 129, every mask): 1e-13, 4e-7, 2.5e-5.
inline constexpr PerDType kAttentionNmse{1e-9, 1e-5, 5e-4};

// Backward of the matrix products and of attention against float64 central finite
// differences (OPS-2), NMSE. fp32: the op's own rounding (~1e-12 measured) with
// room for summation order. fp16 / bf16: inputs, incoming gradient, saved
// activations and every stored intermediate (dscores, dprobs) are rounded, each
// ~u^2 / 3; up to ~10 such roundings compound in attention's backward. Measured
// for attention (CPU, both forms, every mask): 6e-14, 3e-7, 1.8e-5. Attention's
// also bounds one GPU kernel's gradients against another's (tensor-core or cuDNN
// against the scalar kernels): each side carries those roundings, in its own order.
inline constexpr PerDType kMatmulGradNmse{1e-9, 1e-5, 5e-4};
inline constexpr PerDType kAttentionGradNmse{1e-9, 1e-5, 5e-4};

// ---- Gradient accumulation (GA) and normalisation across the batch (BN) ----
// GA-1: the gradient accumulated over K micro-batches (each loss divided by K)
// against the full batch's, norm-wise relative L2 per tensor, the maximum over
// tensors. Both runs do the same per-row arithmetic; they differ in the order of
// the fp32 sums over rows (weight and bias gradients, K partial sums added into
// the fp32 buffer) and, with 16-bit storage, in the roundings that such an order
// change can flip upstream of a store (a matrix product's kernel may block a
// 1-row product differently from a 32-row one).
// - fp32: anchor docs/catalogue.md GA-1 (1e-5); summation order alone measures
//   <= 1.1e-6 on the quick models.
// - fp16 / bf16: the fp32 value a stored activation is rounded from can differ in
//   its last bits between the runs (a 1-row and a 32-row product take different
//   kernel paths), and where it straddles a rounding boundary the stored value
//   moves by one ulp; the flip propagates downstream. Flips touch a fraction of
//   the elements, so the norm-wise error of the whole gradient stays far under
//   one unit roundoff u (2^-11 fp16, 2^-8 bf16): <= 1.2e-4 fp16, <= 2e-4 bf16.
//   The check takes the worst tensor, though, and a small tensor whose gradient
//   is a sum with cancellation (the first block's LayerNorm bias, in 58 of 155
//   fp16 cases the worst) shows a flip in full: measured over 50 seeds on both
//   quick models <= 6.5e-4 fp16 (1.33 u) and <= 5.8e-4 bf16 (0.15 u; bf16
//   products are exact in fp32, so flips are rarer). Bounds: 2u for fp16 (9.8e-4,
//   1.5x the worst seen) and u / 2 for bf16 (2e-3, 3.4x).
// The broken variants (no division: error K - 1 >= 1; per-micro-batch token means
// on padded rows: >= 1e-2) stay orders of magnitude above every bound.
inline constexpr PerDType kGradAccumRelL2{1e-5, 9.8e-4, 2e-3};
inline constexpr const char* kGradAccumReason =
    "GA-1 (docs/catalogue.md): fp32 1e-5; fp16 2u, bf16 u/2: the order of fp32 row sums flips a fraction of "
    "16-bit roundings, a 16-bit buffer rounds them all (harness/tolerances.hpp kGradAccumRelL2)";

// GA's subtle controls (docs/catalogue.md POWER): faults whose error lies within
// kSubtleControlMaxPower times the bound, so the checks are shown to see errors of
// that size, not only the gross failure modes.
// - A 16-bit gradient buffer: every micro-batch's addition is rounded to 16 bits
//   (each tensor scaled by a power of two first, so what is lost is significand,
//   not underflow): a relative error of ~u / sqrt(12) per element per addition
//   (u = 2^-10 fp16, 2^-7 bf16, the spacing), adding up over K additions, the
//   fault fp32 accumulation exists to avoid (docs/catalogue.md GA-1). fp32 compute
//   takes an fp16 buffer at K = 4 (measured over 31 seeds 3.1e-4..7.2e-4, 31-72x
//   the bound, moments and updates included; at K = 8 the transformer's reached
//   101x); fp16 compute a bf16 buffer and bf16 compute a buffer of its own dtype,
//   both at K = 32, where they stand furthest above the 16-bit runs' own noise
//   (an fp16 buffer, 8.7e-4..1.9e-3, would hide in fp16's own flips).
// GA-1's buffer check: the accumulated gradient against the float64 sum of its K
// micro-batches' gradients, each computed alone by the same step with the window's
// loss divisor (so the 16-bit compute's rounding and fp16's underflow are the same on
// both sides; what is left is the buffer's). A right fp32 buffer rounds each of the K
// additions at 2^-24: measured at seeds 1-3 (quick, CPU) at most 1.9e-7 (0.004 of the
// bound) in every dtype and model, and 1.3e-7 at the full preset. (With each
// micro-batch's own divisor, K times the window's magnitudes, the fp16 transformer
// read 1.45e-5 at the quick preset and 4.4e-4, 9x the bound, at the full one, CPU and
// H100 alike: gradients fp16 loses below its range inside the window and keeps
// alone.) An fp16 buffer (every addition rounded at 2^-11) errs 3.3e-4 at K = 4 up to
// 1.7e-3 at K = 32: powers 6.6-34, caught at K = 4, 8 and 32 in every compute dtype
// and model at every seed.
inline constexpr double kGradAccumBufferRelL2 = 5e-5;
inline constexpr const char* kGradAccumBufferReason =
    "GA-1's buffer check: an fp32 buffer's K roundings at 2^-24, far below a 16-bit buffer's at 2^-11 "
    "(harness/tolerances.hpp kGradAccumBufferRelL2)";
inline constexpr int64_t kGradAccumBufferKs[] = {4, 8, 32};
constexpr int64_t kGradAccumSubtleBufferMicroBatch(DType t) { return t == DType::f32 ? 8 : 1; }
inline constexpr const char* kGradAccumSubtleBufferReason =
    "a 16-bit gradient buffer rounds every micro-batch's addition (harness/tolerances.hpp "
    "kGradAccumSubtleBufferMicroBatch)";
// - Dividing by K + 1 (GA-2), error 1 / (K + 1): 1 / 33 = 31x fp16's bound at
//   K = 32, 1 / 9 = 56x bf16's at K = 8; in fp32 (1e-5) no K <= 32 comes within
//   100x, so fp32 uses the 16-bit buffer. Returns K.
constexpr int64_t kGradAccumSubtleCountK(DType t) { return t == DType::bf16 ? 8 : 32; }
// - The window's real-token count off by one (GA-4, 16-bit), error 1 / (N + 1)
//   with N ~ 100-150 real tokens in the quick window of long-tailed rows: 3-10x
//   the 16-bit bounds; fp32 uses the 16-bit buffer.

// GA-3 compares updates (p_after - p0), not parameters: one SGD step at lr 0.1
// moves hidden weights by ~3e-4 of their norm, so a parameter-relative error would
// pass an update that is 3% wrong. For SGD the update is -lr g, linear in lr, and
// nothing runs after the step, so the learning rate is a probe: large enough that
// the fp32 rounding of p0 + update (2^-23 ||p0|| / ||update|| per tensor, the
// comparison's resolution; LayerNorm gains have the smallest gradients) stays
// under kGradAccumMaxFloorShare of the bound.
inline constexpr float kGradAccumSgdLr = 1e4f;
inline constexpr double kGradAccumMaxFloorShare = 0.1;

// GA-3 with AdamW, the updates of two steps (p_after - p0), norm-wise over all
// parameters. Adam's update is lr m / (sqrt(v) + eps), about lr sign(g) where
// |g| >> eps: insensitive to a small gradient error except where g is within that
// error of zero, where the sign can flip and the element moves 2 lr the other
// way. With a norm-wise gradient error e, at most a fraction ~e of the elements
// lie that close to zero, so the update's error is at most ~2 sqrt(e): with e =
// GA-1's bound, 6.3e-3 / 4.4e-2 / 8.9e-2. Measured over 20 seeds: <= 1.1e-4 fp32,
// 6.3e-3 fp16, 4.7e-3 bf16. Per tensor it is coarser still (one flip in a 32-wide
// bias is 35%), hence the norm over all parameters. Adam's moments after the first
// step carry GA-1's bound (m = (1 - b1) g) and twice it (v = (1 - b2) g^2): the
// check with the power to see a gradient error.
inline double grad_accum_adam_update_rel_l2(DType t) { return 2.0 * std::sqrt(kGradAccumRelL2(t)); }
inline constexpr const char* kGradAccumAdamStepReason =
    "GA-3 AdamW: 2 sqrt(GA-1's bound): a gradient error e flips the sign-like update of at most ~e of "
    "the elements (harness/tolerances.hpp grad_accum_adam_update_rel_l2)";

// ---- BN: BatchNorm under accumulation and checkpointing (batch_norm.cpp) ----
// BN-1: BatchNorm with 16 micro-batches of 2 against one batch of 32 must diverge
// by at least this (gradients and running statistics: max relative L2 over
// tensors). Statistics of 2 rows instead of 32 change every normalised value by
// O(1): measured >= 7.6 (gradients) and >= 8.4 (statistics) over seeds 1-300.
// 2e-2 is twice the loosest rounding bound a divergence could be confused with
// (GA-1's bf16 1e-2), and still sees the smallest divergence accumulation causes:
// 2 micro-batches of 16, 0.52-0.87 (the subtle control, power 26-44).
inline constexpr double kBatchNormAccumMinRelL2 = 2e-2;

// BN-2: ghost BatchNorm against accumulation, gradients (max relative L2 over
// tensors). Both runs do the same arithmetic but for the last bits of each linear
// layer's product (a 2-row and a 32-row product round differently), and BatchNorm
// amplifies those bits by its conditioning, which depends on the data:
// - A relative perturbation of a BatchNorm input h reaches the normalised output
//   multiplied by A = |gamma| max|h| ||J||, J the Jacobian of the normalisation:
//   ||J|| = rstd for more than 2 rows; for 2 rows the normalised values are
//   +-sqrt(var / (var + eps)), they move only through eps and ||J|| =
//   rstd eps / (var + eps), up to 1 / sqrt(eps) ~ 316 where the two rows nearly
//   agree (BatchNorm over 2 rows divides by the spread of two values). A
//   difference entering the first layer passes through all of them, so the
//   conditioning is kappa = prod over BatchNorm layers of max A, computed on the
//   batch itself from a float64 forward (batch_norm.cpp batchnorm_conditioning).
//   On the quick MLP (3 BatchNorms) kappa ~ 1e5-4e6 at virtual batch 2, ~1e2-1e3
//   at 4, ~50 at 8; it differs from seed to seed by 10x and more.
// - fp32: every product differs in its last bit (u = 2^-24 relative per run,
//   2u between two runs): bound 2 u kappa. Measured error / bound over seeds
//   1-300 at most 0.25 (virtual batch 2), 0.38 (4), 0.18 (8); the errors
//   themselves span four decades (3.8e-6..5.4e-2 at virtual batch 2), so a
//   fixed bound either fails at some seed (1e-3 failed at 19 of 100) or sits
//   ~1000x above most of them.
// - fp16 / bf16: the fp32 differences are rounded away into the 16-bit
//   activations except where a value straddles a rounding boundary and flips by
//   one ulp (u16 = 2^-11 / 2^-8): 8 u16 for such flips on well-conditioned
//   channels (measured <= 5.2 u16 resp. 2.2 u16 over seeds 1-500), plus the fp32
//   term, which a flip on a near-degenerate channel at virtual batch 2 reaches
//   (fp16: 3.7e-2 at seed 135, 0.44 of the bound). Error / bound over seeds
//   1-300 at most: fp16 0.44, 0.62, 0.21; bf16 0.002, 0.10, 0.13.
inline double kGhostBatchNormGradRelL2(DType t, double kappa) {
  const double fp32 = 2.0 * 0x1p-24 * kappa;
  if (t == DType::f32) return fp32;
  return fp32 + 8.0 * (t == DType::f16 ? 0x1p-11 : 0x1p-8);
}
inline constexpr const char* kGhostBatchNormGradReason =
    "BN-2: fp32 2u kappa, kappa = the batch's BatchNorm conditioning (prod over layers of max |gamma| |h| "
    "||J||); fp16/bf16: + 8 ulp for flipped 16-bit roundings (harness/tolerances.hpp kGhostBatchNormGradRelL2)";

// BN-2: ghost BatchNorm against accumulation, running statistics (max relative
// L2 over the running mean and variance tensors). Momentum-weighted means and
// variances of the same rows, with the same last-bit differences as above but no
// backward pass: a statistic sees the conditioning of the BatchNorms before it,
// not its own. fp32: measured <= 6.0e-6 (100 u) at virtual batch 2, where the
// upstream BatchNorms' near-degenerate channels feed it, <= 3.0e-7 (5 u) at 4 and
// 1.2e-7 at 8 (seeds 1-300): 1e-5 and 1e-6. fp16 / bf16: a flipped rounding
// moves one channel's statistic by one ulp / virtual batch and the tensor norm
// dilutes it over the channels: measured <= 8.2e-5 (0.17 u16) resp. 3.5e-4
// (0.09 u16, seed 244; <= 1.3e-4 elsewhere): u16 / 2 resp. u16 / 4.
inline double kGhostBatchNormStatsRelL2(DType t, int64_t virtual_batch) {
  if (t == DType::f32) return virtual_batch == 2 ? 1e-5 : 1e-6;
  return t == DType::f16 ? 0x1p-11 / 2 : 0x1p-8 / 4;
}
inline constexpr const char* kGhostBatchNormStatsReason =
    "BN-2 running statistics: fp32 1e-5 at virtual batch 2, 1e-6 above; fp16 u/2; bf16 u/4 "
    "(harness/tolerances.hpp kGhostBatchNormStatsRelL2)";

// BN-3: checkpointed BatchNorm against the plain run, bitwise: the recompute runs
// the same kernels on the same inputs, so its batch statistics, and with them the
// gradients, are bit for bit the first forward's, and the running statistics must
// not be touched at all. The error is the number of mismatching elements; the
// bound 0.5 says "none" (a count cannot lie between 0 and 1) while keeping
// error / bound defined for the power of a control: one channel of each of the 3
// BatchNorms updated again differs in 6 elements (power 12), every channel in 384.
// The bound is kBitwiseMismatches (below, with DET-1 and OPS-3).
inline constexpr const char* kBitwiseMismatchesReason =
    "BN-3: bitwise, no element may differ (harness/tolerances.hpp kBitwiseMismatches)";

// PK-4: memory-efficient attention against naive attention in fp32, outputs and
// gradients, norm-wise relative L2. Anchor: docs/catalogue.md PK-4 (<= 1e-5): the two
// differ only in summation order and in when the softmax normalises.
inline constexpr double kAttentionImplsRelL2 = 1e-5;
// PK-4's subtle control: the memory-efficient form's saved log-sum-exp off by this
// (ops::OpFault::lse_offset). Every probability the backward pass recomputes is
// then e^-offset of its value, so the gradients through attention are off by about
// the offset: 2^-12 = 2.4e-4, 24x the bound above.
inline constexpr double kAttentionSubtleLseOffset = 0x1p-12;

// PK-4 scaling exponents of peak activation bytes against T (log-log least
// squares): naive keeps the T x T probabilities (exponent -> 2; > 1.8 once T is
// well above the head dimension), memory-efficient keeps O(T) (exponent 1; < 1.2
// leaves room for terms that do not grow with T). In the model (PK-4, one row of
// one layer, T = 256..2048, the pass peak with workspace) measured 1.835 naive and
// 1.000 memory-efficient on the CPU (byte counts: the same at every seed).
inline constexpr double kNaiveAttentionMinExponent = 1.8;
inline constexpr double kMemEfficientAttentionMaxExponent = 1.2;
inline constexpr const char* kSeqExponentReason =
    "least-squares slope of log peak bytes on log T; docs/catalogue.md PK-4: ~2 naive (> 1.8), ~1 memory-efficient "
    "(< 1.2) (harness/tolerances.hpp kNaiveAttentionMinExponent, kMemEfficientAttentionMaxExponent)";

// Element-wise ops (add, scale, axpy, cast, add_bias, GELU, dropout), forward and
// backward: each output is one fp32 expression of its inputs, stored once.
// - fp32: a few ulp per element gives NMSE ~1e-15 (add, scale, axpy); GELU's
//   negative tail is ill-conditioned (relative condition number ~15 at x = -4, so
//   ~1e-6 relative in fp32 whatever the formula; 6.7e-13 measured on a single
//   tail element). 1e-11 leaves 15x over that and stays far inside ggml's 1e-7;
//   the erf form of GELU in place of the tanh form (~1e-9) is still caught.
// - fp16 / bf16: one round-to-nearest store has relative error at most u = 2^-11
//   (2^-8), so NMSE <= u^2 = 2.4e-7 (1.5e-5) from the store alone; 2 u^2 leaves
//   room for the fp32 math before it. Measured: ~7e-8 and ~5e-6.
inline constexpr PerDType kElementwiseNmse{1e-11, 2.0 / (2048.0 * 2048.0), 2.0 / (256.0 * 256.0)};

// Sums stored once (bias gradient columns, reduce::sum / squared_norm): fp32
// accumulation of up to ~1e6 terms, relative error ~sqrt(n) 2^-24, squared ~1e-11;
// 16-bit results as for row-wise ops.
inline constexpr PerDType kSumNmse{1e-10, 1e-6, 5e-5};

// Optimizer steps against a float64 reference of several steps (SGD, AdamW):
// fp32 parameters carry a few ulp per step (sqrt, division), ~1e-14 measured;
// a 16-bit parameter is rounded once per step, so k steps allow up to k u^2
// (u = 2^-11 or 2^-8); the tests run 5 steps and the bound allows 16 u^2.
inline constexpr PerDType kOptimizerNmse{1e-11, 16.0 / (2048.0 * 2048.0), 16.0 / (256.0 * 256.0)};

// Dropout keep fraction: |kept/n - (1-p)| within this many binomial standard
// deviations sqrt(p (1-p) / n); 5 sigma fails a correct generator ~6e-7 of the time.
inline constexpr double kBinomialSigmas = 5.0;

// ---- Controlled models and the training step ----
// Full-model gradient (fp32 forward + backward) against float64 central finite
// differences of the float64 reference model, relative L2 over sampled
// elements. fp32 rounding through ~30 ops compounds to a few 1e-7 (measured
// 2.3e-7 on the tiny transformer); FD error ~1e-9. 1e-5 leaves ~40x; a wrong
// term in any backward (a missing residual, a transposed weight, a wrong mask)
// moves the error above 1e-2.
inline constexpr double kModelGradFdRelL2 = 1e-5;
// A whole step's gradients in fp16 compute (loss-scaled, unscaled once) against
// the fp32 step's: every stored activation and activation gradient rounds to
// 2^-11 relative and the roundings compound over ~30 ops (measured 6.1e-4 on
// the tiny transformer); 1e-2 bounds it and a missing unscale (error ~1) or an
// underflowed gradient tensor (error >= its share of the norm) fails.
inline constexpr double kFp16StepGradRelL2 = 1e-2;
// The fp32 model's loss against the float64 reference's: fp32 rounding only.
inline constexpr double kModelLossRel = 1e-5;
// "The loss decreases" on the learnable synthetic tasks: after a few steps the
// loss is below this fraction of the first step's (a stuck or diverging run
// stays near or above 1).
inline constexpr double kTrainingLossDropFactor = 0.9;
// CK-2: gradients with a fresh dropout state on recompute differ from the
// correct run by more than this (docs/catalogue.md CK-2's anchor, 1e-3 relative).
inline constexpr double kCheckpointFreshRngMinRelL2 = 1e-3;

// ---- The MLP against its float64 reference (suites/common/ref_mlp.hpp) ----
// The fp32 model's loss and gradients are held to kModelLossRel and
// kModelGradFdRelL2 (fp32 rounding only); measured on 2048 rows, every task and
// norm slot (CPU): loss <= 1.5e-8, worst parameter's gradient <= 5.1e-7.
// The reference's analytic backward against its own float64 central differences
// (h = 1e-6 relative), relative L2 over sampled elements: truncation ~h^2 ~1e-12;
// rounding ~u64 |loss| / h ~1e-10 relative to the loss, which for the smaller
// gradient elements (~1e-3 of the loss) is ~1e-7 of them. Measured <= 4.4e-8
// (256 rows, every task and norm slot); 1e-6 leaves >= 20x and still sees eps
// missing from one term of a norm's backward (2.2e-5 .. 3.6e-5) and the erf
// GELU's derivative under the tanh forward (5e-6 .. 8e-6).
inline constexpr double kMlpRefGradFdRelL2 = 1e-6;
// BatchNorm running statistics (fp32 model against float64), relative L2 over
// every block's mean and variance: fp32 batch statistics over groups of up to
// 1024 rows (~sqrt(n) 2^-24 ~ 2e-6 at worst) and a few ulp per fold. Measured
// 1.1e-7; the biased variance estimator on 512-row groups moves them by 2e-4.
inline constexpr double kMlpRunningStatsRelL2 = 1e-5;

// ---- Bitwise properties (DET-1, OPS-3) ----
// Zero mismatching elements (bytes, draws). The counts are integers, so the bound
// is written as 0.5: a count passes exactly when it is zero, and the smallest
// possible fault, one element one ulp or one bit off, is an error of 1, twice the
// bound, which a subtle control (kSubtleControlMaxPower) can show being caught.
inline constexpr double kBitwiseMismatches = 0.5;

// ---- MEM: memory by consumer ----
// MEM-1 (and MEM-2's flip budgets, which are total peaks): the analytical bytes
// against the tracker, relative to the measured bytes. Nothing here is an
// estimate: the tracker counts the bytes each allocation requests (what an
// allocator rounds them to is MEM-3's business) and the model counts the same
// tensors from shapes and dtypes, integers summed exactly in double (< 2^53). On the
// CPU the error is therefore 0: measured 0 on every configuration of the quick grid
// (19 configurations, 3 checks each) at 20 seeds, and on every MEM-2 flip. On a GPU
// the kernels' own buffers differ (no fp32 copies of 16-bit operands; partial-sum
// buffers of the reductions) and are predicted per backend from the same shapes;
// cuBLAS's workspace is not ours and never reaches the tracker; the one
// data-dependent buffer (the embedding gradient's index of distinct ids) is bounded
// and comes after every activation is freed, never at a peak. So the bound is no
// noise allowance but the resolution the check must have: the smallest term the
// model predicts, one LayerNorm's fp32 statistics (8 bytes a row), is >= 4.0e-4 of
// the activations at the boundary on the quick grid (d_model 128), so >= 4x this
// bound; the subtle controls (every LayerNorm's statistics forgotten or charged to
// workspace) are caught at 9-56x. At the full grid's sizes (d_model 512) one
// LayerNorm's statistics are ~1e-4 of the activations: there the check resolves a
// block's statistics.
inline constexpr double kMemoryModelRelError = 1e-4;
// MEM-2: how finely the flip of the triage's verdict is searched for, as a fraction of
// MEM-1's bound: the search stops once the flip is bracketed within predicted peak x
// kMemoryModelRelError x this many bytes (~24 KB on the full preset's ~1.9 GB
// configurations, instead of one byte: 15 halvings of the 25% bracket instead of 29).
// A bracketed flip's error is the prediction's distance to the bracket's nearer end for
// a control (its farther end for the check), so a control's power is understated by at
// most 1/8 (the weakest subtle control, the quick preset's batch outside the budget at
// 5.5x, reads >= 5.4x) and is never overstated. No verdict depends on the fraction: the
// budgets where the error crosses the bound and the subtle cap are tried exactly.
inline constexpr double kMemoryFlipResolutionOfBound = 1.0 / 8;
// MEM-3: the tracker's total peak against the CUDA pool's own high-water mark of
// used bytes over a training step. The pool hands out each allocation rounded up to
// its granularity (cudaMallocAsync aligns to 256 bytes), so 0 <= pool - tracker <
// live allocations x granularity. MEM-3's quick step holds 346 allocations at its
// 171 MB peak: on a CPU emulation of such a pool that is 2.2e-5 at a 256-byte
// granularity and 8.8e-4 at 2 KiB; docs/catalogue.md MEM-3's 1% admits up to 4.9 KiB
// per live allocation. The details report the rounding per live allocation.
inline constexpr double kPoolPeakRelError = 0.01;

// ---- MP: mixed precision (fp16 underflow, bf16, the loss scaler, master weights) ----
// MP-1 / MP-2 measure the quick MLP's weight gradients at loss multiplier 2^-9
// (harness/properties/mixed_precision.hpp kMpLossMultiplier): their exponents
// span 2^-14..2^-36 (bulk at 2^-22), 9-11% of the values under 2^-24.
// The loss scale MP-1 checks (docs/catalogue.md MP-1: 2^16, GradScaler's initial scale).
inline constexpr double kMpLossScale = 0x1p16;
// Lost fraction: of the non-zero fp32 gradient values (above kMpLostValueFloorRms),
// those a real 16-bit step returns as zero or off by more than half. Storing the
// fp32 values in fp16 would flush 4.1%..5.4% of them (everything under 2^-25); the
// fp16 step at scale 2^16 and the bf16 step lose none at seeds 1-4, the fp16 step
// at scale 1 loses 7.4%..8.3%, at 2^2 1.1%..1.2%. The bound allows the far tail of a
// wider histogram, 0.1% of the values.
inline constexpr double kMpUnderflowFraction = 1e-3;
inline constexpr const char* kMpUnderflowFractionReason =
    "MP-1/MP-2: the 16-bit step may lose (return as zero, or off by more than half) at most 0.1% of the non-zero "
    "fp32 gradient values (harness/tolerances.hpp kMpUnderflowFraction)";
// MP-1/MP-2 count a real 16-bit step's lost gradient values (zero, or off by more
// than half) among those of at least this share of their tensor's RMS: smaller ones
// can be sums that cancel, which rounding their terms to bf16 (2^-9 relative) moves
// by half (measured: at a floor of 1% of the RMS bf16 lost 0.04%..0.16% of the values
// at seeds 1-4, at 3% none; fp16 at 2^16 none at either).
inline constexpr double kMpLostValueFloorRms = 0.03;
// MP-1's and MP-2's subtle control: the step's loss scale held at 2^2 (the scaler's
// fault switch), too small for these gradients: the real fp16 step loses 1.1%..1.2%
// of the values at seeds 1-4 (11-12x the bound).
inline constexpr double kMpSubtleLossScale = 0x1p2;
// The 16-bit step's unscaled gradients against the fp32 step's, max relative L2
// over tensors (no loss scale for bf16; 2^16 for fp16). Every stored activation
// and activation gradient is rounded (u/sqrt(3) rms, u = 2^-11 fp16, 2^-8 bf16),
// ~2 per layer, compounding through the 4 layers to the first layer's weight
// gradient: measured (seeds 1-20) 6.3e-4..8.8e-4 = 1.3u..1.8u fp16 and
// 5.0e-3..7.4e-3 = 1.3u..1.9u bf16. Bounds: 8u fp16 (3.9e-3), 4u bf16 (1.6e-2).
// Unscaled fp16 gradients (the gross control) lose 19%..27%: the activation
// gradients go subnormal and keep a few bits (only ~0.04% become exactly zero).
inline constexpr PerDType kMpGradRelL2{1e-5, 8.0 * 0x1p-11, 4.0 * 0x1p-8};
inline constexpr const char* kMpGradRelL2Reason =
    "MP-1/MP-2: the 16-bit step's gradients against fp32: 8u fp16 (at loss scale 2^16), 4u bf16 "
    "(harness/tolerances.hpp kMpGradRelL2)";

// MP-3 / GA-5: the scaler's state machine and the skipped step are exact: no
// state element may change, every step's scale is GradScaler's rule to the bit,
// the step counts are integers. Violations are counted (elements changed, steps
// whose scale or skip differ, a step not skipped); the bound is
// kBitwiseMismatches (0.5: none).
inline constexpr const char* kMpScalerReason =
    "MP-3/GA-5: exact: no state element changes on a skipped step, the scale follows GradScaler's rule "
    "(harness/tolerances.hpp kBitwiseMismatches)";
// The growth interval the trajectory runs at (GradScaler's 2000 would take 2000
// steps to show a growth), its length and the steps that overflow.
inline constexpr int64_t kMpGrowthInterval = 3;
inline constexpr int64_t kMpTrajectorySteps = 12;
inline constexpr int64_t kMpTrajectoryOverflowSteps[] = {1, 6};
// GA-5: a micro-batch ran at its window's loss scale when the least-squares factor
// between its fp16 contribution to the gradient buffer and an fp32 step's at the same
// parameters is within 1% of that scale. fp16 rounding moves the factor by 3e-5..1e-4
// (measured, 2 seeds; the factors are in the details); a wrong scale is a power of two
// away (0.5, 2).
inline constexpr double kGa5ScaleRelTol = 0.01;
// GA-5's unscale check also runs with every gradient 2^-12 as large (a loss
// multiplier), where an unscale into fp16 (its subtle control) leaves the small
// gradients subnormal: 0.0004 -> 0.2 between multipliers 1 and 1e-4, 0.09 (23x the
// bound) at 2^-12; a right step errs 3.8e-4 at both (seed 1234).
inline constexpr double kGa5SmallGradientMultiplier = 0x1p-12;
// The loss multiplier that makes one micro-batch overflow fp16 at scale 2^16.
inline constexpr double kMpOverflowMultiplier = 0x1p24;
// MP-3's run with one overflowing step against fp32 leaving it out: SGD steps,
// their updates compared under kMpGradRelL2's fp16 bound (the updates are sums of
// fp16-step gradients). 16 steps, so one step is a small part of the run: measured
// 2.8e-4..3.5e-4 (0.09 of the bound) at three seeds; against fp32 applying every step
// 0.096..0.114 (the gross control); a step applying all but its overflowing micro-batch
// 0.088..0.101 (the subtle one, 23-26 bounds).
inline constexpr int64_t kMpEquivalenceSteps = 16;

// MP-4: of the weights whose SGD update lies between 2 fp32 ulps (2^-22 |w|) and
// a quarter fp16 ulp, the fraction the step leaves unchanged. With fp32 masters
// none can be lost (the update exceeds half an fp32 ulp); in fp16 each rounds back
// to the weight. The bound is the check's resolution: one tensor of the quick MLP
// (the last layer's 1024 weights, ~10% of the window) without a master must be seen.
inline constexpr double kMpLostUpdateFraction = 2e-3;
inline constexpr const char* kMpLostUpdateReason =
    "MP-4: no update larger than 2 fp32 ulps may be lost with fp32 masters; 0.2% resolves one tensor "
    "(harness/tolerances.hpp kMpLostUpdateFraction)";
// The step's learning rate: |lr g| ~ 2^-17 |w| for the bulk of the quick MLP's
// weights, under a quarter fp16 ulp and far above fp32's. Measured (seeds 1-2):
// ~10300 of the 11264 weights in the window; 0 lost with masters, all without,
// 7.1%..7.5% with the last layer's weights in fp16 only (36x the bound).
inline constexpr double kMpMasterLr = 0x1p-7;
inline constexpr const char* kMpNoMasterParam = "layers.3.weight";
// MP-5: activation bytes of a 16-bit run over fp32's, |ratio / 0.5 - 1|. Every
// kept activation halves, except the fp32 statistics of LayerNorm (8 bytes a
// row in both runs) and integer tensors (masks, ids): measured exactly 0.5 on the
// quick MLP (no norm) and 0.5035 (0.7%) on the quick transformer, at every seed
// (the bytes depend on shapes only). The subtle control, each block's MLP hidden
// activation charged to workspace, moves the transformer's ratio to 0.413 (8.7x).
inline constexpr double kMpActivationRatioRel = 0.02;
inline constexpr const char* kMpActivationRatioReason =
    "MP-5 (docs/catalogue.md): 0.5 within 2% (harness/tolerances.hpp kMpActivationRatioRel)";

// ---- CK: activation checkpointing (CK-1..CK-5, GA-6) ----
// CK-1, CK-2's subtle control, CK-4 and CK-5 are exact (kBitwiseMismatches): a
// recompute replays the same kernels on the same inputs with the same dropout
// draws, so the gradients and masks are the plain run's bit for bit, and forward
// counts are integers. GA-6 holds K micro-batches with dropout on to GA-1's bound
// (kGradAccumRelL2): with masks keyed by sample the only difference from the full
// batch is the order of the fp32 sums.
// Measured at seeds 1-20, 42 and 4294967297 (quick, CPU): CK-1 and CK-5 errors 0 at
// every k; GA-6 at most 0.30 of its bound (bf16 transformer, K = 32). Controls: a
// fresh RNG state 2.6e4-1.1e5 mismatching gradient values (CK-2: 135-513x 1e-3
// relative); one mask element flipped in a recompute 33 gradient values on the MLP
// (power 66; in the transformer it reaches every earlier parameter, so CK-5 counts
// mask elements instead: 2, power 4); one extra block forward 1 block (power 2);
// running-offset masks under accumulation 130-99000x GA-1's bound; a 16-bit buffer
// with dropout on 3.0-68x.
// CK-3: the exponent b of a least-squares fit of log peak on log depth, L in {4, 8,
// 16, 32}. Plain: what does not grow with depth (embedding output, final LayerNorm,
// logits, the loss's buffers) is ~1/20 of one block's activations at these sizes,
// which flattens the fit below 1 by ~0.02; a slack of 0.1 admits that and a model
// constant twice as large, while a schedule that keeps half the blocks (b ~0.9 at
// small L) or nothing that grows (b ~0) is outside it.
inline constexpr double kCkDepthLinearExponentSlack = 0.1;
// sqrt(L) segments: sqrt(L) kept segment inputs plus one segment's recomputed
// activations, ~2 sqrt(L) blocks' worth, so b ~0.5 (ceil(sqrt L) makes the
// segments at L = 8 and 32 a little longer); docs/catalogue.md CK-3's bound 0.65.
// Measured on the CPU (byte counts, the same at every seed): plain 0.98, sqrt(L)
// 0.52 (the pass peak, workspace included, 0.48), every block 0.38; the controls
// no checkpointing 0.98 and L/4-block segments 0.94 (power 1.5 and 1.45).
inline constexpr double kCkDepthSqrtExponentMax = 0.65;
// Every block checkpointed: L kept block inputs plus one block's recomputed
// activations. With an input r of one block's activations, the fit over L = 4..32
// gives b = 0.37 (r = 1/20, these models), 0.53 (1/10), 0.62 (1/6.7): under the
// sqrt(L) bound while the inputs weigh under ~1/6 of a block. A recompute that keeps
// what it recomputed (the subtle control) holds every block again: b ~ 0.99.
inline constexpr double kCkDepthEveryBlockExponentMax = kCkDepthSqrtExponentMax;
inline constexpr const char* kCkDepthEveryBlockReason =
    "L block inputs (~1/20 of a block each here) plus one recomputed block: b ~0.4, under 0.65 while an input "
    "weighs under ~1/6 of a block (harness/tolerances.hpp kCkDepthEveryBlockExponentMax)";
inline constexpr const char* kCkDepthExponentReason =
    "least-squares slope of log peak bytes on log depth; docs/catalogue.md CK-3: ~1 without checkpointing, <= 0.65 with "
    "sqrt(L) segments (harness/tolerances.hpp kCkDepth*)";


// ---- PK-1 / PK-2: packed sequences against the same sequences alone ----
// Norm-wise relative error of each loss and gradient tensor (the worst), packed
// rows against one sequence per padded row and against a sequence run on its own.
// The layouts compute the same sums over the same real tokens; what differs is the
// row a token sits in, hence the product shapes and the masked keys the attention
// skips: fp32 reorderings only. fp32: docs/catalogue.md PK-1's 1e-5 (measured over
// seeds 1-20, both attention forms, <= 2.0e-6). fp16 / bf16: a reordered fp32 sum
// flips a fraction of the stored 16-bit roundings, and the worst tensor is a
// LayerNorm bias, whose gradient is a sum over tokens with cancellation, so a flip
// shows nearly in full: measured (seeds 1-20, 48 and 56 sequences, both forms)
// <= 1.16e-3 = 2.4u fp16 (u = 2^-11) and <= 6.1e-3 = 1.6u bf16 (u = 2^-8). Bounds
// 4u fp16 (1.95e-3, 1.7x the worst seen) and 3u bf16 (1.17e-2, 1.9x).
inline constexpr PerDType kPackedRelL2{1e-5, 4.0 * 0x1p-11, 3.0 * 0x1p-8};
inline constexpr const char* kPackedReason =
    "PK-1: fp32 1e-5 (docs/catalogue.md); fp16 4u, bf16 3u: a different row layout reorders fp32 sums and flips 16-bit "
    "roundings, shown in full by a LayerNorm bias's cancelling sum (harness/tolerances.hpp kPackedRelL2)";
// PK-1's subtle control: the loss normaliser counts `extra` tokens that carry no
// target, error extra / (N + extra) with N ~ 48 x 35 real tokens (quick). fp32: one
// extra token (power 53-71 over seeds 1-20); 16-bit: each sequence's last token
// (extra = the number of sequences, ~1/36: power 13-17 fp16, 2.3-3.5 bf16, whose
// own noise leaves no room for a fault of 10x its bound that is not gross).
constexpr int64_t kPackedSubtleExtraTokens(DType t, int64_t sequences) { return t == DType::f32 ? 1 : sequences; }

// ---- Q8: 8-bit optimizer state ------------------------------------------------------
// Q8-1: the round-trip error of each element, divided by half the gap between the
// map's two codes around its normalised value (times the block's absmax), is at most
// 1 for a nearest-code quantiser in exact arithmetic. fp32 adds at most a few ulp of
// the value (the division by absmax, the stored code, the product code * absmax):
// ~4 * 2^-24 against the narrowest relative half-gap (0.007 of the top decade), ~1e-5.
// Measured (quick, CPU, 39 seeds): worst 0.99991; controls: a linear map 34-14000x,
// the code below instead of the nearest 2.0x.
inline constexpr double kQ8RoundTripRatio = 1.0 + 1e-4;
inline constexpr const char* kQ8RoundTripReason =
    "nearest code: |x - dequant(quant(x))| <= half the map's gap at x/absmax, times absmax; 1e-4 for fp32 rounding "
    "of the division and the product (harness/tolerances.hpp kQ8RoundTripRatio)";
// Q8-2: bitsandbytes' test_optimizer8bit (blockwise Adam8bit against torch.optim.Adam,
// states resynced every step): mean absolute parameter error below 6e-5 after each
// step, p = 0.1 randn, g = 0.01 randn, lr 1e-3; and its state check (atol 3e-3, rtol
// 1e-3, fewer than 20 elements outside), with states resynced and no outlier block.
// Measured (CPU, 39 seeds): at most 5.0e-6 (0.083 of the bar), quick and full shapes;
// controls: one absmax per tensor with a 1e5x outlier block 88-403x, blocks of 32 x 256
// with it 11-43x (4 seeds), the first moment in the unsigned map 2.9x. The state check:
// 0 elements outside with states resynced; the unsigned first moment 4590-4797; the
// signed map's lowest code stored as zero (its subtle control) 137-162 (seeds 1-6):
// bitsandbytes' atol (3e-3) is above most moments (|m| ~ 1e-3), so only an error
// of a block's largest moments can show, one element per block here.
inline constexpr double kQ8TrackParamMeanAbs = 6e-5;
inline constexpr double kQ8TrackStateAtol = 3e-3, kQ8TrackStateRtol = 1e-3;
// Its state check as a check: fewer than 20 of the moments' elements outside
// atol + rtol |m| (a count: the bound 19.5 is "at most 19").
inline constexpr double kQ8TrackStateMaxOutside = 19.5;
// The rows of that subtle control's tensor (of 1024 columns): 256 blocks of 256, the
// quick preset's shape. Its count is about 0.57 per block (137-162 at 256 blocks,
// 7-8x the bound); at the full preset's 1024 rows (4096 blocks) it was 2354, 121x,
// past what a subtle control may be.
inline constexpr int64_t kQ8LowestCodeRows = 64;
inline constexpr const char* kQ8TrackStateReason =
    "bitsandbytes test_optimizer8bit: fewer than 20 state elements outside atol 3e-3 + rtol 1e-3 "
    "(harness/tolerances.hpp kQ8TrackStateMaxOutside)";
inline constexpr const char* kQ8TrackReason =
    "bitsandbytes test_optimizer8bit (blockwise): mean |p_8bit - p_fp32| < 6e-5 per step with states resynced "
    "(harness/tolerances.hpp kQ8TrackParamMeanAbs)";
// Q8-3: docs/catalogue.md: the final loss of 8-bit AdamW within 5% of fp32 AdamW's after
// the long run without resync (Dettmers et al. 2022 report parity of final metrics).
// Measured (least squares, 200 steps quick / 500 full, 39 seeds): at most 0.009
// (0.18 of the bound); controls: linear maps 1e4-7e7x, the first moment unsigned 27-33x.
inline constexpr double kQ8LongHorizonRelLoss = 0.05;
inline constexpr const char* kQ8LongHorizonReason =
    "docs/catalogue.md Q8-3: |loss_8bit - loss_fp32| / loss_fp32 <= 5% after the run, no resync "
    "(harness/tolerances.hpp kQ8LongHorizonRelLoss)";
// Q8-4: the tracker counts bytes exactly; 1e-4 relative admits no layout change (one
// absmax of one moment per 256 elements alone is 7.7e-3 of the state).
inline constexpr double kQ8StateBytesRelError = 1e-4;
inline constexpr const char* kQ8StateBytesReason =
    "2 bytes per parameter + 4 bytes per block per moment (fp32 8 bytes under 4096 elements), counted exactly by the "
    "tracker (harness/tolerances.hpp kQ8StateBytesRelError)";

// ---- LR: low-rank adapters ----
// LR-2: merged W + (alpha/r) B A (one fp32 rounding per weight element, relative
// 6e-8) against the adapter path (two extra fp32 products and an add): every logit
// of the 2-layer d32 transformer, relative L2, differs by a few units of fp32
// roundoff. docs/catalogue.md bound 1e-6 relative. Measured (5 seeds): 1.50e-7..1.64e-7;
// gross control (scale alpha) 0.37-0.46; subtle (scale 2e-4 too large) 25-34 bounds.
inline constexpr double kLoraMergedRel = 1e-6;
inline constexpr const char* kLoraMergedReason =
    "docs/catalogue.md LR-2: merged weights give the adapter path's output to 1e-6 relative (fp32 roundoff of one "
    "merge and two products; harness/tolerances.hpp kLoraMergedRel)";
// LR-2's B draw: the adapter moves the loss by ~1e-4..5e-3 relative (measured, 5 seeds).
inline constexpr float kLoraMergeBStd = 0.05f;
// LR-2's subtle control: the merge's scale this much too large (a fixed offset).
inline constexpr double kLoraMergeSubtleOffset = 2e-4;
// LR-1's subtle control: B this small changes each loss by ~1e-6 relative (bitwise
// check: the power is the number of the 4 losses that differ).
inline constexpr float kLoraSubtleBStd = 1e-4f;
// LR-3 (suites/correctness/test_lora.cpp) holds the adapter gradients to
// kModelGradFdRelL2; its subtle control merges the reference at a scale off by this
// relative amount, which moves the gradients by about that much (~30x the bound).
inline constexpr double kLoraFdSubtleScale = 3e-4;

// ---- TRADE / BM-FIT: the trade table and the largest micro-batch that fits ----
// TRADE: the loss after 4 AdamW steps of a row (every technique up to it) against the
// reference's (the fp32 baseline; for LoRA the baseline with the same adapters),
// |L_row - L_ref| / (L_ref(0) - L_ref(4)): the fraction of the reference's progress
// the row misses or overshoots. bf16 storage rounds weights and activations at
// 2^-8 relative, and AdamW's first steps move every weight by ~lr whatever the
// gradient's size, so a rounding that flips the sign of a small gradient element
// moves that element by 2 lr: the rows' trajectories part by a few percent of the
// progress. 8-bit moments add their quantisation (Q8-3). Measured over 20 seeds
// (quick, lr 1e-3): at most 0.0065 (seq/padding), 0.0080 (LoRA against LoRA alone):
// 0.40 of the bound. Controls: one of the 4 steps skipped 0.13-0.25 (6.4-12.7x),
// LoRA scaled by alpha instead of alpha / r 4.1-5.5 (205-277x).
inline constexpr double kTradeLossProgress = 0.02;
// TRADE's consumer checks: each row's targeted consumer peak over the previous row's
// must be at most this (a row that skipped its technique reads ~1). Expected and
// measured (quick, CPU): 16-bit activations 0.50 of fp32's; packing with
// memory-efficient attention 0.10 (most slots were padding, and no T x T); 4
// micro-batches 0.25; checkpointing every block 0.27; 8-bit moments 0.26 (2 bytes and
// an absmax per 256 of 8); LoRA r8 on q, v 0.017 of the gradients and the state. Each
// bound leaves the expected ratio room (other shapes keep different fixed parts) and
// stays below 1 by at least a third.
inline constexpr double kTradeShrinkMixedPrecision = 0.6;
inline constexpr double kTradeShrinkSeqPadding = 0.75;
inline constexpr double kTradeShrinkAccumulation = 0.5;
inline constexpr double kTradeShrinkCheckpointing = 0.75;
inline constexpr double kTradeShrink8bit = 0.5;
inline constexpr double kTradeShrinkLora = 0.25;
inline constexpr const char* kTradeShrinkReason =
    "the row's targeted consumer at most this share of the previous row's (harness/tolerances.hpp kTradeShrink*)";
inline constexpr const char* kTradeLossProgressReason =
    "bf16 rounding (2^-8) of weights and activations and 8-bit moments move AdamW's first steps by a few percent "
    "of the loss's progress, under 0.8% measured over 20 seeds; 2% of the progress is the bound (harness/tolerances.hpp kTradeLossProgress)";
// BM-FIT: the tracker counts bytes exactly and the memory model replays the same
// allocations (MEM-1 is exact on the CPU), so the micro-batch found by real steps
// under the budget and the model's answer must be equal.
inline constexpr double kFitMicroBatch = 0.0;
inline constexpr const char* kFitMicroBatchReason =
    "bytes are counted exactly on the CPU and MEM-1's model is exact there: the same micro-batch "
    "(harness/tolerances.hpp kFitMicroBatch)";

// ---- DP: data parallel across processes (harness/properties/data_parallel.cpp) ----
// DP-1 and DP-2 use GA-1's fp32 bound (kGradAccumRelL2): N ranks x K micro-batches
// differ from the full batch only in the order of fp32 sums (each micro-batch's,
// the ranks' all-reduce, one division), as accumulation does.
inline constexpr const char* kDataParallelReason =
    "GA-1's fp32 bound (kGradAccumRelL2): the ranks' partial sums and the all-reduce only reorder fp32 additions "
    "(harness/tolerances.hpp kDataParallelReason)";
// DP-1's subtle control (and DP-2's, per micro-batch): gradients rounded to fp16 for
// the all-reduce (a compression hook), then the sum rounded again: about
// 2^-11 / sqrt(3) ~ 3e-4 per element, ~30x the bound (measured 33-48x; DP-2 27-74x).
inline constexpr const char* kDataParallelSubtleReason =
    "gradients all-reduced in fp16: two fp16 roundings of every element, ~30x GA-1's fp32 bound";
// DP-4's subtle control: the last rank alone rounds to fp16 what it sends and what
// it receives; its gradients carry the second rounding in full (max over ranks),
// 25-49x the bound measured at 20 seeds, N = 2 and 4.
inline constexpr const char* kDataParallelOneRankSubtleReason =
    "one rank rounds its all-reduce to fp16 (sent and received): one fp16 rounding of that rank's gradients, "
    "~30x GA-1's fp32 bound";
// DP-4's control for overlap: a bucket spanning two blocks all-reduced once the first
// of them has run its backward; the other block's gradients come out as the global
// sum of the first K - 1 micro-batches plus this rank's last one, far past the bound.
inline constexpr const char* kDataParallelEarlyBucketReason =
    "a bucket all-reduced before its second block's last backward: that block's gradients miss the other ranks' "
    "last micro-batch";

// ---- DP-3 (ZeRO-1 as a setting), DP-5, DP-6: the sharded step (harness/properties/sharding.cpp) ----
// kShardedSteps steps, each on its own batch; controls over kShardedControlSteps
// (a fault shows in the first update and stays in every later difference). Before
// every all-gather and reduce-scatter, rank r sleeps r x kShardedCollectiveDelayS, so
// the ranks enter each collective at different times (PyTorch's FSDP parity tests
// delay the collectives the same way to expose a missing wait).
inline constexpr int64_t kShardedSteps = 10;
inline constexpr int64_t kShardedControlSteps = 3;
inline constexpr double kShardedCollectiveDelayS = 2e-4;
inline constexpr int64_t kShardedAdamSteps = 3;
// The update since the start, p_s - p_0, of all trainable tensors together, against
// the single-process step's, norm-wise relative L2, maximum over steps and ranks,
// under SGD with momentum (its state sharded as AdamW's moments are; its update
// linear in the gradient). What differs from the reference is the order of fp32 sums
// in the gradients (the ranks' micro-batches, the reduce-scatter), as in DP-1, and
// each step carries the earlier steps' differences into its gradient: GA-1's bound,
// for fp32 3x over ten steps. Measured at seeds 1-14, N = 2 and 4: fp32 worst 9.7e-6
// (the MLP), bf16 7.0e-4 (the transformer; a 16-bit copy that rounds the other way
// moves one weight by 2^-8, and every later step carries it). Per tensor the
// maximum is no measure here: a norm weight whose updates cancel reached 3.8e-5 in
// fp32 and 8e-3 in bf16 while the whole stayed at 1e-6.
inline constexpr PerDType kShardedUpdateRelL2{3e-5, 2e-3, 2e-3};
inline constexpr const char* kShardedUpdateReason =
    "GA-1's bound (3x for fp32 over ten steps): the ranks' partial sums and the reduce-scatter only reorder fp32 "
    "additions, SGD's update is linear in the gradient, and each step carries the earlier ones' differences "
    "(harness/tolerances.hpp kShardedUpdateRelL2)";
// Their subtle control: every rank rounds what it sends to each reduce-scatter to
// fp16, scaled per bucket by a power of two (a compression hook): one rounding,
// 2^-11 / sqrt(3) relative, of every rank's share of every gradient.
inline constexpr const char* kShardedSubtleReason =
    "gradients reduce-scattered in fp16: one fp16 rounding of every rank's share of every gradient, a few times "
    "the trajectory bound";
// DP-6's AdamW check, ZeRO-3 against ZeRO-2: the same reduce-scatters in the same
// order and AdamW on the same pieces; the parameters are gathered copies (each rank
// rounds its own piece to the compute dtype) instead of whole ones: bitwise.
inline constexpr const char* kShardedZero3BitwiseReason =
    "exact: ZeRO-3 and ZeRO-2 reduce the same gradients in the same order and step the same pieces; gathering "
    "copies and casting element-wise change no bit (harness/tolerances.hpp kShardedZero3BitwiseReason)";
// DP-MEM's sharded rows: the tracker counts every allocation to the byte and the
// prediction is arithmetic on the configuration's tensor sizes, so they agree
// exactly (kBitwiseMismatches: under one byte).
inline constexpr const char* kShardedBytesReason =
    "exact: the tracker counts allocations to the byte; the sharded memory model (predict_sharded) is arithmetic on "
    "the configuration's tensor sizes (harness/tolerances.hpp kShardedBytesReason)";
// DP-COMM's sharded rows: collectives are counted as they are called, and their
// sizes follow from the tensor sizes and the schedule: exact, in elements.
inline constexpr const char* kShardedCommReason =
    "exact: the elements each collective moves follow from the tensor sizes and the schedule of gathers and "
    "reductions (harness/tolerances.hpp kShardedCommReason)";

}  // namespace hr::tol

namespace hr::tol {
// ---- Fleet: a device slower than the others (harness/fleet/fleet_judge.cpp) ----
// A device is slow when its throughput lies below the median of the other devices
// of its kind by more than the floor AND by more than their own spread allows:
// kFleetRobustZ standard deviations, estimated as 1.4826 times their median
// absolute deviation (Iglewicz and Hoaglin's outlier cut). The median and the MAD
// are the others', so one slow device cannot pull the median it is judged by nor
// widen the spread it hides in. GPUs: SuperBench's 5%. CPU ranks stand in for
// devices on one machine (the 2-core CI machine), timed one at a time, each
// throughput the median of its rounds (fleet_internal.hpp round_median): in 32
// four-rank fleets there, an identical rank's was up to 14% below the others'
// median (by its fastest round, up to 24%), so their floor is 15%; a rank slowed
// 1.25x (20% below) read 15-28% below in 7, close to that floor: the fleet.* tests
// run a scenario again (3 tries in all) where only throughput verdicts differ. A
// neighbour busy on the host raised a step's CPU time by up to 35% for seconds at a
// time, which can cover all three first rounds of one rank: while a rank is behind
// the fastest (kFleetBehind*), every rank is timed a round more, up to 12
// (kConfirmRounds), which leaves the floor as it is.
inline constexpr double kFleetSlowFloorGpu = 0.05;
inline constexpr double kFleetSlowFloorCpu = 0.15;
// When the rounds more start (fleet_rank.cpp ranks_behind): after the first rounds,
// a rank's median below the fastest other rank's by more than this. They then go
// on while one lies behind by more than the slow floor. GPUs: the floor itself. CPU
// ranks: half the floor. On the 2-core machine a rank's step CPU time moved by up
// to 2x from round to round (22-47 thousand tokens/s for one identical rank of one
// fleet), and after three rounds a rank slowed 1.25x could lie only 9.5% behind the
// fastest: under the floor, so no round more was timed, and it was judged ok
// (fleet.slow_subtle failed all three tries in 3 of 9 runs). Half the floor as the
// bar to go on as well kept ranks of a healthy fleet behind for all 12 rounds more
// (fleet.transient failed all three tries in 2 of 7 runs): it starts them only.
inline constexpr double kFleetBehindGpu = kFleetSlowFloorGpu;
inline constexpr double kFleetBehindCpu = kFleetSlowFloorCpu / 2;
inline constexpr double kFleetRobustZ = 3.5;
inline constexpr const char* kFleetSlowReason =
    "below the other devices' median by more than the floor (GPU 5%, as SuperBench flags a node; CPU stand-ins 15%) "
    "and by more than 3.5 of their standard deviations from their MAD (harness/tolerances.hpp kFleetSlowFloor*, "
    "kFleetRobustZ)";
}  // namespace hr::tol
