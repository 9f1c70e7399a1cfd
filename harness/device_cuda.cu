// The CUDA backend's Device: one stream, one cuBLAS handle, and a private
// stream-ordered memory pool whose own high-water mark cross-checks the tracker.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <vector>

#include "harness/cuda_check.cuh"
#include "harness/device.hpp"
#include "harness/device_health.hpp"

namespace hr {
namespace {

class CudaTimer final : public Timer {
 public:
  explicit CudaTimer(cudaStream_t s) : stream_(s) {
    HR_CUDA_CHECK(cudaEventCreate(&start_));
    HR_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~CudaTimer() override {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  void start() override { HR_CUDA_CHECK(cudaEventRecord(start_, stream_)); }
  void stop() override { HR_CUDA_CHECK(cudaEventRecord(stop_, stream_)); }
  double seconds() override {
    HR_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0.f;
    HR_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_{}, stop_{};
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : Device(BackendKind::cuda), ordinal_(ordinal) {
    HR_CUDA_CHECK(cudaSetDevice(ordinal));
    cudaDeviceProp p{};
    HR_CUDA_CHECK(cudaGetDeviceProperties(&p, ordinal));
    record_.backend = "cuda";
    record_.name = p.name;
    record_.ordinal = ordinal;
    record_.cc_major = p.major;
    record_.cc_minor = p.minor;
    record_.sm_count = p.multiProcessorCount;
    record_.memory_bytes = p.totalGlobalMem;
    record_.memory_bus_bits = p.memoryBusWidth;
    record_.ecc = p.ECCEnabled != 0;
    // Clock rates left cudaDeviceProp in CUDA 13: ask the attributes.
    // Either may be missing on a device; its error is not left for the next launch's check.
    if (cudaDeviceGetAttribute(&record_.sm_clock_khz, cudaDevAttrClockRate, ordinal) != cudaSuccess)
      (void)cudaGetLastError();
    if (cudaDeviceGetAttribute(&record_.memory_clock_khz, cudaDevAttrMemoryClockRate, ordinal) != cudaSuccess)
      (void)cudaGetLastError();
    HR_CUDA_CHECK(cudaDriverGetVersion(&record_.driver_version));
    HR_CUDA_CHECK(cudaRuntimeGetVersion(&record_.runtime_version));
    char uuid[64];
    const auto* u = reinterpret_cast<const unsigned char*>(p.uuid.bytes);
    std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                  u[14], u[15]);
    record_.uuid = uuid;
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) == cudaSuccess)
      record_.pci_bus_id = bus;
    else
      (void)cudaGetLastError();

    HR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    HR_CUDA_CHECK(cudaEventCreateWithFlags(&newest_readback_, cudaEventDisableTiming));
    HR_CUBLAS_CHECK(cublasCreate(&blas_));
    HR_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    HR_CUBLAS_CHECK(cublasGetVersion(blas_, &record_.cublas_version));
    // Bitwise repeatable: no routine may use atomics (cuBLAS's default, pinned here)
    // and every product goes to one stream, so the same product gives the same bits
    // on every run of a device of the same architecture and SM count (cuBLAS's
    // reproducibility rule): DET-1 and the step digest of `headroom fleet` rely on it.
    HR_CUBLAS_CHECK(cublasSetAtomicsMode(blas_, CUBLAS_ATOMICS_NOT_ALLOWED));
    // Reference mode: products accumulate in fp32 throughout (no reduced-precision
    // reductions); fp32 products ask for CUBLAS_COMPUTE_32F, so no TF32 either.
    HR_CUBLAS_CHECK(cublasSetMathMode(
        blas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));

    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal;
    HR_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    // Keep freed memory in the pool: steady-state steps do not go to the driver.
    uint64_t threshold = std::numeric_limits<uint64_t>::max();
    HR_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  }

  ~CudaDevice() override {
    // Every read-back has landed once the stream is done; one that outlives the
    // device returns its bytes without asking it, and gives its block back to the
    // pool, which lives until the last block is home.
    cudaStreamSynchronize(stream_);
    retire_readbacks();
    if (newest_readback_ != nullptr) cudaEventDestroy(newest_readback_);
    if (flush_buffer_ != nullptr) cudaFree(flush_buffer_);
    cublasDestroy(blas_);
    cudaMemPoolDestroy(pool_);
    cudaStreamDestroy(stream_);
  }

  void copy_on_device(void* dst, const void* src, size_t n) override {
    HR_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_zero(void* dst, size_t n) override { HR_CUDA_CHECK(cudaMemsetAsync(dst, 0, n, stream_)); }

  std::shared_ptr<HostReadback> read_back(const void* src, size_t n) override {
    PinnedBlock b = take_pinned(n);
    cudaError_t e = n > 0 ? cudaMemcpyAsync(b.ptr, src, n, cudaMemcpyDeviceToHost, stream_) : cudaSuccess;
    if (e == cudaSuccess) e = cudaEventRecord(b.done, stream_);
    if (e == cudaSuccess) e = cudaEventRecord(newest_readback_, stream_);
    if (e != cudaSuccess) {
      settle_and_return(b);
      HR_CUDA_CHECK(e);
    }
    return std::make_shared<PinnedReadback>(*this, pinned_, b);
  }
  std::unique_ptr<Timer> make_timer() override { return std::make_unique<CudaTimer>(stream_); }
  void flush_caches() override {
    if (flush_buffer_ == nullptr) {
      int l2_bytes = 0;
      HR_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, ordinal_));
      // Outside the tracked pool: a timing aid, not part of what a step holds.
      flush_bytes_ = 2 * static_cast<size_t>(std::max(l2_bytes, 1 << 20));
      HR_CUDA_CHECK(cudaMalloc(&flush_buffer_, flush_bytes_));
    }
    HR_CUDA_CHECK(cudaMemsetAsync(flush_buffer_, flush_value_++ & 0xff, flush_bytes_, stream_));
  }
  void* cuda_stream() const override { return stream_; }
  void* cublas_handle() const override { return blas_; }

  std::optional<size_t> pool_used_high_bytes() override {
    uint64_t v = 0;
    HR_CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &v));
    return static_cast<size_t>(v);
  }
  void reset_pool_high_water() override {
    uint64_t zero = 0;
    HR_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
  }

 protected:
  // Small uploads (a micro-batch's index lists) go through a pinned staging block, so
  // the copy is truly asynchronous and the host does not wait for the stream; the
  // block is reused only once its copy is done. Large ones (parameters at start-up)
  // copy from the caller's memory and wait: no pinned memory of their size is kept.
  void do_copy_to_device(void* dst, const void* src, size_t n) override {
    if (n == 0) return;
    if (n > kMaxStagedUpload) {
      HR_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
      HR_CUDA_CHECK(cudaStreamSynchronize(stream_));
      count_host_sync();
      return;
    }
    PinnedBlock b = take_pinned(n);
    std::memcpy(b.ptr, src, n);
    cudaError_t e = cudaMemcpyAsync(dst, b.ptr, n, cudaMemcpyHostToDevice, stream_);
    if (e == cudaSuccess) e = cudaEventRecord(b.done, stream_);
    if (e != cudaSuccess) {
      settle_and_return(b);
      HR_CUDA_CHECK(e);
    }
    pinned_->give(b);
  }
  void do_copy_to_host(void* dst, const void* src, size_t n) override {
    HR_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_));
    HR_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void do_synchronize() override { HR_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  // One stream: the newest read-back's event follows every older one's.
  void wait_for_newest_readback() override { HR_CUDA_CHECK(cudaEventSynchronize(newest_readback_)); }

  void* raw_allocate(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the error so the caller can recover
      if (const PoolFault* keep = faults::active<PoolFault>(); keep != nullptr && keep->keep_pieces_on_oom)
        return nullptr;
      // The pool keeps what was freed (release threshold: all of it), in the sizes it
      // was freed in: after a step that failed part-way, or a larger configuration,
      // those pieces can hold the memory a new request needs in one piece. Once the
      // frees have landed, the pool gives back all it does not use and the request is
      // made once more, now against the driver's whole free memory.
      release_cached();
      ++releases_on_oom_;
      e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return nullptr;
      }
    }
    HR_CUDA_CHECK(e);
    return p;
  }
  void raw_free(void* p) noexcept override { cudaFreeAsync(p, stream_); }

 public:
  void release_cached() override {
    HR_CUDA_CHECK(cudaStreamSynchronize(stream_));
    HR_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
  }
  size_t pool_releases_on_oom() const override { return releases_on_oom_; }

 private:
  static constexpr size_t kMaxStagedUpload = size_t{1} << 20;
  static constexpr size_t kMinPinnedBlock = size_t{1} << 12;
  static constexpr size_t kMaxPinnedBlocks = 256;

  // Page-locked host memory for stream-ordered copies, with the event that marks
  // the end of the last copy that used it.
  struct PinnedBlock {
    void* ptr = nullptr;
    size_t capacity = 0;
    cudaEvent_t done{};
  };

  // The idle blocks, shared by the device and its read-backs: a read-back that
  // outlives the device gives its block back here, and the last owner frees them.
  struct PinnedPool {
    std::mutex mutex;
    std::vector<PinnedBlock> idle;
    size_t blocks = 0;  // idle or in use
    ~PinnedPool() {
      for (const PinnedBlock& b : idle) {
        cudaEventDestroy(b.done);
        cudaFreeHost(b.ptr);
      }
    }
    void give(const PinnedBlock& b) noexcept {
      const std::lock_guard<std::mutex> lock(mutex);
      idle.push_back(b);
    }
  };

  class PinnedReadback final : public HostReadback {
   public:
    PinnedReadback(CudaDevice& dev, std::shared_ptr<PinnedPool> pool, PinnedBlock b)
        : HostReadback(dev), pool_(std::move(pool)), block_(b) {}
    ~PinnedReadback() override { pool_->give(block_); }

   protected:
    bool landed() override {
      const cudaError_t q = cudaEventQuery(block_.done);
      if (q == cudaErrorNotReady) return false;
      HR_CUDA_CHECK(q);
      return true;
    }
    void block() override { HR_CUDA_CHECK(cudaEventSynchronize(block_.done)); }
    const void* bytes() const override { return block_.ptr; }

   private:
    std::shared_ptr<PinnedPool> pool_;
    PinnedBlock block_;
  };

  // Blocks until `b`'s last copy is done, counting a host sync only when it was not.
  void wait_for_block(const PinnedBlock& b) {
    const cudaError_t q = cudaEventQuery(b.done);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) HR_CUDA_CHECK(q);
    count_host_sync();
    HR_CUDA_CHECK(cudaEventSynchronize(b.done));
  }

  // A block whose copy was enqueued but whose event may not mark it (a failed
  // record): back to the pool only once the stream has finished with it.
  void settle_and_return(const PinnedBlock& b) noexcept {
    cudaStreamSynchronize(stream_);
    pinned_->give(b);
  }

  // Idle blocks are kept in the order they came back, close to the order of their
  // copies on the one stream, so the first that holds n bytes is the likeliest to be
  // done: one event query. Taken when done; otherwise a new block of the next power
  // of two, so the host does not wait for the stream. At kMaxPinnedBlocks no block
  // is added: the first idle block that fits is waited for, or, if none fits, the
  // oldest idle one is waited for and replaced by one of the size asked for. (Blocks
  // held by live read-backs cannot be waited for; with none idle, one is added.)
  PinnedBlock take_pinned(size_t n) {
    std::unique_lock<std::mutex> lock(pinned_->mutex);
    std::vector<PinnedBlock>& idle = pinned_->idle;
    const bool at_cap = pinned_->blocks >= kMaxPinnedBlocks;
    const auto fit = std::find_if(idle.begin(), idle.end(), [n](const PinnedBlock& b) { return b.capacity >= n; });
    if (fit != idle.end() && (at_cap || cudaEventQuery(fit->done) == cudaSuccess)) {
      const PinnedBlock b = *fit;
      idle.erase(fit);
      lock.unlock();
      wait_for_block(b);
      return b;
    }
    PinnedBlock b;
    // Before the count changes: a throw here leaves the pool as it was.
    const ScopedCudaDevice current(ordinal_);  // the event belongs to this device
    if (at_cap && !idle.empty()) {
      b = idle.front();
      idle.erase(idle.begin());
      lock.unlock();
      wait_for_block(b);
      HR_CUDA_CHECK(cudaFreeHost(b.ptr));
      b.ptr = nullptr;
    } else {
      ++pinned_->blocks;
      lock.unlock();
    }
    b.capacity = kMinPinnedBlock;
    while (b.capacity < n) b.capacity *= 2;
    cudaError_t e = cudaMallocHost(&b.ptr, b.capacity);
    if (e == cudaSuccess && b.done == nullptr) e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      if (b.ptr != nullptr) cudaFreeHost(b.ptr);
      if (b.done != nullptr) cudaEventDestroy(b.done);
      const std::lock_guard<std::mutex> relock(pinned_->mutex);
      --pinned_->blocks;
      HR_CUDA_CHECK(e);
    }
    return b;
  }

  int ordinal_;
  cudaStream_t stream_{};
  cublasHandle_t blas_{};
  cudaMemPool_t pool_{};
  size_t releases_on_oom_ = 0;
  void* flush_buffer_ = nullptr;
  size_t flush_bytes_ = 0;
  int flush_value_ = 0;
  std::shared_ptr<PinnedPool> pinned_ = std::make_shared<PinnedPool>();
  cudaEvent_t newest_readback_ = nullptr;  // recorded after every read-back's copy
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // leave no error set for the next call
    return 0;
  }
  return n;
}

bool cuda_device_available(std::string* reason) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (reason) *reason = fmt::format("no CUDA device: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
    return false;
  }
  if (n == 0) {
    if (reason) *reason = "no CUDA device: the driver reports 0 devices";
    return false;
  }
  return true;
}

bool cuda_context_lost(std::string* why) {
  // Wait for the device, then clear the error: a sticky one comes back at once.
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return false;
  cudaGetLastError();
  const cudaError_t again = cudaDeviceSynchronize();
  if (again == cudaSuccess) return false;
  e = again;
  if (why) *why = fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  return true;
}

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  std::string why;
  if (!cuda_device_available(&why)) throw Error(why);
  return std::make_unique<CudaDevice>(ordinal);
}

}  // namespace hr
