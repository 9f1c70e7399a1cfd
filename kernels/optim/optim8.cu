// CUDA 8-bit optimizer state: the launches of the kernels of optim8_kernels.cuh,
// and the codebooks each device holds.
#include <cstring>
#include <mutex>
#include <vector>

#include "harness/cuda_check.cuh"
#include "kernels/common/cuda_launch.cuh"
#include "kernels/common/dtype_dispatch.hpp"
#include "kernels/optim/optim8_cuda.hpp"
#include "kernels/optim/optim8_kernels.cuh"

namespace hr::ops::cuda {

using namespace q8k;

namespace {

// The slot of `map` on the device of `on`, uploaded on first use (into that
// device's copy of the array, on the tensor's stream, then waited for once, a
// counted host wait, so that any stream of the device may read it).
int codebook_slot(const q8::Codebook& map, const Tensor& on) {
  struct Held {
    int device;
    int slot;
    q8::Codebook map;
  };
  static std::mutex mutex;
  static std::vector<Held> held;
  const int device = on.device().record().ordinal;
  const std::lock_guard<std::mutex> lock(mutex);
  int used = 0;
  for (const Held& h : held) {
    if (h.device != device) continue;
    ++used;
    if (std::memcmp(h.map.value, map.value, sizeof map.value) == 0) return h.slot;
  }
  HR_CHECK(used < kCodebookSlots, "8-bit state: more than {} codebooks on device {}", kCodebookSlots, device);
  {
    const ScopedCudaDevice current(device);
    HR_CUDA_CHECK(cudaMemcpyToSymbolAsync(g_codebooks, &map, sizeof map, static_cast<size_t>(used) * sizeof map,
                                          cudaMemcpyHostToDevice, gpu::stream_of(on)));
  }
  on.device().synchronize();
  held.push_back({device, used, map});
  return used;
}

}  // namespace

void quantize_blockwise(const Tensor& x, Tensor& codes, Tensor& absmax, int64_t block_size, const q8::Codebook& map) {
  const int64_t n = x.numel();
  if (n == 0) return;
  // Before the launch: a first use uploads the codebook (CUDA calls, a possible throw),
  // which must not fall between the launch's configuration and its call.
  const int slot = codebook_slot(map, x);
  quantize_kernel<<<static_cast<unsigned>(absmax.numel()), kQ8Threads, 0, gpu::stream_of(x)>>>(
      x.data_as<float>(), codes.data_as<uint8_t>(), absmax.data_as<float>(), n, block_size, slot);
  HR_CUDA_CHECK_LAUNCH();
}

void dequantize_blockwise(const Tensor& codes, const Tensor& absmax, Tensor& out, int64_t block_size,
                          const q8::Codebook& map) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const int slot = codebook_slot(map, out);  // before the launch, as above
  dequantize_kernel<<<gpu::grid_for(n), gpu::kThreads, 0, gpu::stream_of(out)>>>(
      codes.data_as<uint8_t>(), absmax.data_as<float>(), out.data_as<float>(), n, block_size, slot);
  HR_CUDA_CHECK_LAUNCH();
}

void adamw8bit_step(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes,
                    Tensor& v_absmax, int64_t block_size, const q8::Codebook& m_map, const q8::Codebook& v_map,
                    const optim::AdamWScalars& s) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const MapSlots maps{codebook_slot(m_map, param), codebook_slot(v_map, param)};
  dispatch_float2(param.dtype(), grad.dtype(), "adamw8bit_step", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    TP* p = param.data_as<TP>();
    const TG* g = grad.data_as<TG>();
    uint8_t* mq = m_codes.data_as<uint8_t>();
    uint8_t* vq = v_codes.data_as<uint8_t>();
    if (tiles(block_size, p, g, mq, vq)) {
      adamw8_tiled_kernel<TP, TG><<<tiled_grid(n), kTileThreads, 0, gpu::stream_of(param)>>>(
          p, g, mq, m_absmax.data_as<float>(), vq, v_absmax.data_as<float>(), n, static_cast<int>(block_size), maps,
          s);
    } else {
      adamw8_kernel<TP, TG><<<static_cast<unsigned>(m_absmax.numel()), kQ8Threads, 0, gpu::stream_of(param)>>>(
          p, g, mq, m_absmax.data_as<float>(), vq, v_absmax.data_as<float>(), n, block_size, maps, s);
    }
    HR_CUDA_CHECK_LAUNCH();
  });
}

void adamw8bit_step_many(const std::vector<AdamW8bitArgs>& ts, int64_t block_size, const q8::Codebook& m_map,
                         const q8::Codebook& v_map) {
  if (ts.empty()) return;
  const Tensor& first = *ts.front().param;
  const MapSlots maps{codebook_slot(m_map, first), codebook_slot(v_map, first)};
  const cudaStream_t stream = gpu::stream_of(first);
  for (const AdamW8bitArgs& a : ts) {
    HR_CHECK(&a.param->device() == &first.device() && a.param->dtype() == first.dtype() &&
                 a.grad->dtype() == ts.front().grad->dtype() &&
                 tiles(block_size, a.param->data(), a.grad->data(), a.m_codes->data(), a.v_codes->data()),
             "adamw8bit_step_many: the tensors of one launch must share device and dtypes and take the tiled kernel");
  }
  dispatch_float2(first.dtype(), ts.front().grad->dtype(), "adamw8bit_step_many", [&](auto tp, auto tg) {
    using TP = decltype(tp);
    using TG = decltype(tg);
    std::vector<Q8TensorArg> args;
    for (const AdamW8bitArgs& a : ts) args.push_back(q8_arg(a));
    for_each_q8_launch(args, [&](const Q8Launch& L) {
      adamw8_multi_kernel<TP, TG><<<static_cast<unsigned>(L.start[L.count]), kTileThreads, 0, stream>>>(
          L, static_cast<int>(block_size), maps);
      HR_CUDA_CHECK_LAUNCH();
    });
  });
}

void upload_codebooks(const q8::Codebook& m_map, const q8::Codebook& v_map, const Tensor& on) {
  codebook_slot(m_map, on);
  codebook_slot(v_map, on);
}

int adamw8bit_tensors_per_launch() { return kQ8MaxTensorsPerLaunch; }

bool adamw8bit_tiled(const Tensor& param, const Tensor& grad, const Tensor& m_codes, const Tensor& v_codes,
                     int64_t block_size) {
  return tiles(block_size, param.data(), grad.data(), m_codes.data(), v_codes.data());
}

}  // namespace hr::ops::cuda
