// Masked row softmax: argument checks, backend dispatch and the CPU loops.
// Row sums accumulate in double on the CPU; mask and element math are
// softmax_math.hpp's, shared with the CUDA kernels; the row loops are
// cpu_rows.hpp's, vectorised.
#include "kernels/softmax/softmax.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <initializer_list>

#include "harness/check.hpp"
#include "kernels/common/cpu_rows.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/common/op_fault.hpp"
#include "kernels/common/widen.hpp"
#include "kernels/softmax/softmax_math.hpp"
#if HEADROOM_HAVE_CUDA
#include "kernels/softmax/softmax_cuda.hpp"
#endif

namespace hr::ops {
namespace {

void check_mask(const Tensor& scores, const AttnMask& mask, const char* op) {
  const int64_t B = scores.dim(0), T = scores.dim(2), S = scores.dim(3);
  if (mask.causal) HR_CHECK(T == S, "{}: a causal mask needs T == S, got {}", op, scores.str());
  if (mask.key_valid_len.defined()) {
    HR_CHECK(mask.key_valid_len.dtype() == DType::i32 && mask.key_valid_len.numel() == B,
             "{}: key_valid_len must be int32 [{}], got {}", op, B, mask.key_valid_len.str());
    check_same_device(scores, mask.key_valid_len, op);
  }
  if (mask.segment_ids.defined()) {
    HR_CHECK(T == S, "{}: segment_ids need T == S, got {}", op, scores.str());
    HR_CHECK(mask.segment_ids.dtype() == DType::i32 && mask.segment_ids.numel() == B * T,
             "{}: segment_ids must be int32 [{}, {}], got {}", op, B, T, mask.segment_ids.str());
    check_same_device(scores, mask.segment_ids, op);
  }
}

// The CPU rows go through cpu_rows.hpp's padded float buffer: a masked key holds
// -inf there, so it adds nothing to the max or the sum and gets probability 0.
// Without segments the exponentials run only over the whole vectors up to the last
// allowed key, and the keys past them are 0 as they are: the vector expf takes a
// slow path, lane by lane, for -inf, and a causal row's keys past its query are half
// of them (expf took 6.6% of the quick transformer's CPU step that way, 2.3% without).
// The bits are the same: each vector left out added exp(-inf) = 0 to the sum.
template <typename T>
void forward_cpu(const Tensor& scores, const AttnMask& mask, float scale, Tensor& probs) {
  const int64_t B = scores.dim(0), H = scores.dim(1), Tq = scores.dim(2), S = scores.dim(3);
  const T* xp = scores.data_as<T>();
  T* pp = probs.data_as<T>();
  const int32_t* kvl = mask.key_valid_len.defined() ? mask.key_valid_len.data_as<int32_t>() : nullptr;
  const int32_t* seg = mask.segment_ids.defined() ? mask.segment_ids.data_as<int32_t>() : nullptr;
  const int64_t n = rows::padded(S);
  float* e = rows::row_buffer(n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tq; ++t) {
        const sm::RowMask m{mask.causal, static_cast<int32_t>(t), kvl ? kvl[b] : INT32_MAX,
                            seg ? seg + b * Tq : nullptr};
        const int64_t o = ((b * H + h) * Tq + t) * S;
        int64_t live = n;  // whole vectors from the first key, holding every allowed one
        if (seg == nullptr) {  // the allowed keys are a prefix
          const int64_t end = sm::allowed_end(m, static_cast<int32_t>(S));
          for (int64_t s = 0; s < end; ++s) e[s] = scale * to_float(xp[o + s]);
          live = rows::padded(end);
          std::fill(e + end, e + live, -INFINITY);
        } else {
          for (int64_t s = 0; s < S; ++s)
            e[s] = sm::allowed(m, static_cast<int32_t>(s)) ? scale * to_float(xp[o + s]) : -INFINITY;
          std::fill(e + S, e + n, -INFINITY);
        }
        const float mx = rows::max_of(e, live);
        // sm::prob's expf(x - max) * (1 / sum); a row with no allowed key is all 0.
        const float inv = mx == -INFINITY ? 0.f : static_cast<float>(1.0 / rows::exp_shifted_sum(e, live, mx));
        std::fill(e + (mx == -INFINITY ? 0 : live), e + n, 0.f);
        for (int64_t s = 0; s < S; ++s) pp[o + s] = from_float<T>(e[s] * inv);
      }
}

template <typename T>
void backward_cpu(const Tensor& probs, const Tensor& dprobs, float scale, Tensor& dscores) {
  const int64_t S = probs.dim(-1), count = probs.numel() / S;
  const T* pp = probs.data_as<T>();
  const T* dp = dprobs.data_as<T>();
  T* dsp = dscores.data_as<T>();
  float* buf = rows::row_buffer(2 * S);
  float *p = buf, *d = buf + S;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t o = r * S;
    const float* pr = floats_of(pp + o, S, p);
    const float* dr = floats_of(dp + o, S, d);
    const float dot = static_cast<float>(rows::dot(pr, dr, S));
    // dscores may be dprobs itself (in place): each element is read before it is written.
    for (int64_t s = 0; s < S; ++s) dsp[o + s] = from_float<T>(sm::dscore(pr[s], dr[s], dot, scale));
  }
}

}  // namespace

static void softmax_forward_computed(const Tensor& scores, const AttnMask& mask, float scale, Tensor& probs) {
  const char* op = "softmax_forward";
  HR_CHECK(scores.defined() && scores.ndim() == 4 && is_float(scores.dtype()),
           "{}: scores must be [B, H, T, S] float, got {}", op, scores.str());
  check_same_shape(scores, probs, op);
  check_same_device(scores, probs, op);
  HR_CHECK(probs.dtype() == scores.dtype(), "{}: probs {} must have the dtype of scores {}", op, probs.str(),
           scores.str());
  check_mask(scores, mask, op);
  if (scores.numel() == 0) return;
  HR_IF_CUDA(scores, cuda::softmax_forward(scores, mask, scale, probs));
  dispatch_float(scores.dtype(), op, [&](auto tag) { forward_cpu<decltype(tag)>(scores, mask, scale, probs); });
}

void softmax_forward(const Tensor& scores, const AttnMask& mask, float scale, Tensor& probs) {
  const OpTimer timer(scores, __func__);
  softmax_forward_computed(scores, mask, scale, probs);
  apply_output_fault("softmax_forward", probs);
}

void softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale, Tensor& dscores) {
  const char* op = "softmax_backward";
  HR_CHECK(probs.defined() && probs.ndim() >= 1 && is_float(probs.dtype()), "{}: bad probs {}", op, probs.str());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&dprobs, &dscores}) {
    check_same_shape(probs, *t, op);
    check_same_device(probs, *t, op);
    HR_CHECK(t->dtype() == probs.dtype(), "{}: {} must have the dtype of probs {}", op, t->str(), probs.str());
  }
  if (probs.numel() == 0) return;
  HR_IF_CUDA(probs, cuda::softmax_backward(probs, dprobs, scale, dscores));
  dispatch_float(probs.dtype(), op, [&](auto tag) { backward_cpu<decltype(tag)>(probs, dprobs, scale, dscores); });
}

}  // namespace hr::ops
