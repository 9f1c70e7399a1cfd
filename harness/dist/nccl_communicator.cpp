// NCCL engine of the communicator (see nccl_communicator.hpp): the few NCCL
// functions used are looked up with dlsym, typed from nccl.h, so a mismatch with
// the header is a compile error and a missing library a run-time reason.
#include "harness/dist/nccl_communicator.hpp"

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/dist/watchdog.hpp"

#if HEADROOM_HAVE_CUDA && HEADROOM_HAVE_NCCL_HEADER
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#endif

namespace hr::dist {

#if HEADROOM_HAVE_CUDA && HEADROOM_HAVE_NCCL_HEADER
namespace {

// "2.28.9" from an NCCL_VERSION_CODE (X * 10000 + Y * 100 + Z since 2.9; X * 1000
// + Y * 100 + Z before).
std::string version_string(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code / 100 % 10, code % 100);
}

// The oldest NCCL with every function used (NCCL_VERSION(2, 4, 0)).
constexpr int kOldestNccl = 2400;

struct NcclApi {
  void* handle = nullptr;
  std::string error;  // why it could not be loaded
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  int version = 0;  // the loaded library's NCCL_VERSION_CODE
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    api.handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (api.handle == nullptr) {
      const char* e = dlerror();
      api.error = std::string("libnccl.so.2 could not be loaded: ") + (e ? e : "unknown reason");
      return;
    }
    auto sym = [&](const char* name) -> void* {
      void* p = dlsym(api.handle, name);
      if (p == nullptr && api.error.empty()) api.error = std::string("libnccl.so.2 has no ") + name;
      return p;
    };
    api.get_unique_id = reinterpret_cast<decltype(api.get_unique_id)>(sym("ncclGetUniqueId"));
    api.comm_init_rank = reinterpret_cast<decltype(api.comm_init_rank)>(sym("ncclCommInitRank"));
    api.comm_destroy = reinterpret_cast<decltype(api.comm_destroy)>(sym("ncclCommDestroy"));
    api.comm_abort = reinterpret_cast<decltype(api.comm_abort)>(sym("ncclCommAbort"));
    api.get_version = reinterpret_cast<decltype(api.get_version)>(sym("ncclGetVersion"));
    api.get_async_error = reinterpret_cast<decltype(api.get_async_error)>(sym("ncclCommGetAsyncError"));
    api.all_reduce = reinterpret_cast<decltype(api.all_reduce)>(sym("ncclAllReduce"));
    api.all_gather = reinterpret_cast<decltype(api.all_gather)>(sym("ncclAllGather"));
    api.reduce_scatter = reinterpret_cast<decltype(api.reduce_scatter)>(sym("ncclReduceScatter"));
    api.broadcast = reinterpret_cast<decltype(api.broadcast)>(sym("ncclBroadcast"));
    api.error_string = reinterpret_cast<decltype(api.error_string)>(sym("ncclGetErrorString"));
    if (!api.error.empty()) return;
    // The types are the header's, checked at build time; each function is looked up
    // above. Another major version may change them; within version 2, every release
    // since 2.4 (the first with ncclCommAbort and ncclCommGetAsyncError) has all of them.
    if (api.get_version(&api.version) != ncclSuccess) {
      api.error = "libnccl.so.2 does not report its version";
    } else if (const int major = api.version >= 10000 ? api.version / 10000 : api.version / 1000;
               major != NCCL_MAJOR || api.version < kOldestNccl) {
      api.error = fmt::format("libnccl.so.2 is NCCL {}; headroom was built with {}.{}.{} and needs {}.x from {}",
                              version_string(api.version), NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_MAJOR,
                              version_string(kOldestNccl));
    }
  });
  return api;
}

std::string nccl_message(ncclResult_t rc) { return nccl().error_string ? nccl().error_string(rc) : "NCCL error"; }

void cuda_ok(cudaError_t rc, const char* what) {
  HR_CHECK(rc == cudaSuccess, "{}: {}", what, cudaGetErrorString(rc));
}

ncclDataType_t nccl_type(CommDType t) {
  switch (t) {
    case CommDType::f32: return ncclFloat32;
    case CommDType::f64: return ncclFloat64;
    case CommDType::u8: return ncclUint8;
  }
  return ncclUint8;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const std::vector<uint8_t>& id_bytes, int rank, int ranks, Device& dev)
      : rank_(rank), size_(ranks), dev_(dev), stream_(static_cast<cudaStream_t>(dev.cuda_stream())) {
    HR_ARG_CHECK(id_bytes.size() == sizeof(ncclUniqueId), "NCCL unique id of {} bytes, expected {}", id_bytes.size(),
                 sizeof(ncclUniqueId));
    HR_CHECK(dev.is_cuda(), "an NCCL communicator needs a CUDA device, not {}", dev.record().name);
    // Read before anything is made: a bad value throws with nothing to undo.
    const std::chrono::milliseconds timeout = CollectiveWatchdog::timeout_from_env();
    // NCCL binds a communicator to the current device: the rank's.
    cuda_ok(cudaSetDevice(dev.record().ordinal), "cudaSetDevice");
    // The barrier's one byte, kept: a free per barrier would synchronise the device.
    // Allocated first: a constructor that throws after the init would leave the
    // communicator to no destructor.
    cuda_ok(cudaMalloc(&barrier_byte_, 1), "cudaMalloc");
    ncclUniqueId id;
    std::memcpy(&id, id_bytes.data(), sizeof id);
    // The collectives' own stream, and the events that order it against the device's.
    cudaError_t e = cudaEventCreateWithFlags(&queued_, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      release_cuda();
      cuda_ok(e, "the communicator's stream and events");
    }
    const ncclResult_t rc = nccl().comm_init_rank(&comm_, ranks, id, rank);
    if (rc != ncclSuccess) {
      release_cuda();
      HR_CHECK(false, "ncclCommInitRank: {}", nccl_message(rc));
    }
    // From here on a collective that never finishes is aborted (watchdog.hpp).
    const int ordinal = dev.record().ordinal;
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        WatchdogHooks{[this]() -> std::optional<std::string> {
                        ncclResult_t async = ncclSuccess;
                        const ncclResult_t q = nccl().get_async_error(comm_, &async);
                        if (q != ncclSuccess) return fmt::format("ncclCommGetAsyncError: {}", nccl_message(q));
                        if (async != ncclSuccess) return nccl_message(async);
                        return std::nullopt;
                      },
                      [this, ordinal] {
                        (void)cudaSetDevice(ordinal);  // this thread's current device
                        return cudaEventQuery(queued_) == cudaErrorNotReady;
                      },
                      [this] { (void)nccl().comm_abort(comm_); }},
        timeout);
  }
  ~NcclCommunicator() override {
    // The watchdog stops first, so that nothing else touches the communicator. Then
    // the communicator goes: after a failed call, or while an error unwinds past it
    // (another rank may be gone), its kernels may never finish, and ncclCommDestroy,
    // like cudaFree, would wait for them forever: abort (unless the watchdog has).
    // Stopped before it is asked: an abort under way when the thread is joined has
    // ended by then, and is seen, so the communicator is not aborted or freed twice.
    if (watchdog_ != nullptr) watchdog_->stop();
    const bool aborted = watchdog_ != nullptr && watchdog_->aborted();
    watchdog_.reset();
    if (comm_ != nullptr && !aborted) {
      if (failed_ || std::uncaught_exceptions() > 0)
        (void)nccl().comm_abort(comm_);
      else
        (void)nccl().comm_destroy(comm_);
    }
    release_cuda();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  // The device's stream waits for the newest collective, which follows every older
  // one on the communicator's stream.
  void join() override {
    if (!deferred_) return;
    order(cudaStreamWaitEvent(stream_, queued_, 0), "cudaStreamWaitEvent (join)");
    deferred_ = false;
  }
  // Through the device, so its host-wait count sees the wait.
  void synchronize() override {
    try {
      join();
      dev_.synchronize();
    } catch (...) {
      failed_ = true;
      alive();  // the watchdog's reason, when it aborted, says more than the stream's error
      throw;
    }
    alive();
  }
  CommStats library_received() const override { return received_; }

 protected:
  void do_all_reduce_sum(void* buf, size_t count, CommDType t) override { all_reduce(buf, count, t, false); }
  void do_all_reduce_sum_deferred(void* buf, size_t count, CommDType t) override { all_reduce(buf, count, t, true); }
  void do_all_gather(const void* send, void* recv, size_t count, CommDType t) override {
    collective("ncclAllGather", false,
               [&] { return nccl().all_gather(send, recv, count, nccl_type(t), comm_, comm_stream_); });
    receive(count * comm_dtype_size(t) * static_cast<size_t>(size_));
  }
  void do_reduce_scatter_sum(const void* send, void* recv, size_t count, CommDType t) override {
    collective("ncclReduceScatter", false, [&] {
      return nccl().reduce_scatter(send, recv, count, nccl_type(t), ncclSum, comm_, comm_stream_);
    });
    receive(count * comm_dtype_size(t));
  }
  void do_broadcast(void* buf, size_t bytes, int root) override {
    collective("ncclBroadcast", false,
               [&] { return nccl().broadcast(buf, buf, bytes, ncclUint8, root, comm_, comm_stream_); });
    receive(bytes);
  }
  // NCCL has no barrier: a one-byte all-reduce, completed, is one.
  void do_barrier() override {
    collective("ncclAllReduce (barrier)", false, [&] {
      return nccl().all_reduce(barrier_byte_, barrier_byte_, 1, ncclUint8, ncclSum, comm_, comm_stream_);
    });
    synchronize();  // outside the call lock: an abort must be able to end this wait
  }

 private:
  void all_reduce(void* buf, size_t count, CommDType t, bool deferred) {
    collective("ncclAllReduce", deferred,
               [&] { return nccl().all_reduce(buf, buf, count, nccl_type(t), ncclSum, comm_, comm_stream_); });
    receive(count * comm_dtype_size(t));
  }
  // One collective on the communicator's stream. That stream first waits for the work
  // queued on the device's so far (its inputs). Under the call lock (watchdog.hpp),
  // only what touches the communicator: not after an abort, its deadline started, the
  // NCCL call and the event after it (the watchdog's "pending"). Then, unless it is
  // deferred to join(), the device's later work waits for it. The stream waits stay
  // outside the lock: one that blocks on a full launch queue (behind a hung
  // collective) must not outlast an abort's grace and then call NCCL.
  template <typename Call>
  void collective(const char* what, bool deferred, Call&& call) {
    order(cudaEventRecord(ready_, stream_), "cudaEventRecord (collective inputs)");
    order(cudaStreamWaitEvent(comm_stream_, ready_, 0), "cudaStreamWaitEvent (collective inputs)");
    {
      const std::unique_lock<std::timed_mutex> held = watchdog_->enter_call();
      alive();
      watchdog_->queuing();
      const ncclResult_t rc = call();
      if (rc != ncclSuccess) {
        failed_ = true;
        alive();
        HR_CHECK(false, "{}: {}", what, nccl_message(rc));
      }
      order(cudaEventRecord(queued_, comm_stream_), "cudaEventRecord (collective watchdog)");
    }
    if (deferred) {
      deferred_ = true;
      return;
    }
    order(cudaStreamWaitEvent(stream_, queued_, 0), "cudaStreamWaitEvent (collective result)");
    deferred_ = false;  // this collective came after every deferred one on its stream
  }
  // A failed CUDA call that orders the two streams: the communicator is not used again.
  void order(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    failed_ = true;
    cuda_ok(e, what);
  }
  void release_cuda() noexcept {
    if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (queued_ != nullptr) cudaEventDestroy(queued_);
    if (barrier_byte_ != nullptr) cudaFree(barrier_byte_);
    comm_stream_ = nullptr;
    ready_ = queued_ = nullptr;
    barrier_byte_ = nullptr;
  }
  // Throws the watchdog's reason once it has aborted the communicator.
  void alive() {
    if (!watchdog_->aborted()) return;
    failed_ = true;
    HR_CHECK(false, "NCCL rank {} of {} aborted: {}", rank_, size_, watchdog_->reason().value_or("unknown reason"));
  }
  // Counted after each NCCL call returned (its receive buffer handed to the library).
  void receive(size_t bytes) {
    ++received_.calls;
    received_.payload_bytes += bytes;
  }

  int rank_, size_;
  Device& dev_;
  cudaStream_t stream_;                // the device's: the step's kernels
  cudaStream_t comm_stream_ = nullptr;  // the collectives'
  ncclComm_t comm_ = nullptr;
  void* barrier_byte_ = nullptr;
  cudaEvent_t queued_ = nullptr;  // recorded after each collective: the watchdog's "pending", the result's order
  cudaEvent_t ready_ = nullptr;   // recorded on the device's stream before each collective: its inputs
  bool deferred_ = false;         // a deferred collective not yet joined
  std::unique_ptr<CollectiveWatchdog> watchdog_;
  bool failed_ = false;  // a call failed: the communicator is aborted, not destroyed
  CommStats received_;
};

}  // namespace

std::string nccl_unavailable_reason() {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not left for the next CUDA call to report
    return fmt::format("no CUDA device answers ({})", cudaGetErrorName(e));
  }
  if (devices == 0) return "no CUDA device answers";
  return nccl().error;
}

std::vector<uint8_t> nccl_unique_id() {
  const std::string why = nccl_unavailable_reason();
  HR_CHECK(why.empty(), "NCCL unavailable: {}", why);
  ncclUniqueId id;
  const ncclResult_t rc = nccl().get_unique_id(&id);
  HR_CHECK(rc == ncclSuccess, "ncclGetUniqueId: {}", nccl_message(rc));
  std::vector<uint8_t> out(sizeof id);
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>& unique_id, int rank, int ranks,
                                                     Device& dev) {
  const std::string why = nccl_unavailable_reason();
  HR_CHECK(why.empty(), "NCCL unavailable: {}", why);
  return std::make_unique<NcclCommunicator>(unique_id, rank, ranks, dev);
}

#else  // built without CUDA or without nccl.h

namespace {
constexpr const char* kNoNccl = HEADROOM_HAVE_CUDA ? "built without NCCL's header (nccl.h not found at configure time)"
                                                   : "built without the CUDA backend";
}

std::string nccl_unavailable_reason() { return kNoNccl; }
std::vector<uint8_t> nccl_unique_id() { throw Error(std::string("NCCL unavailable: ") + kNoNccl); }
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>&, int, int, Device&) {
  throw Error(std::string("NCCL unavailable: ") + kNoNccl);
}

#endif

}  // namespace hr::dist
