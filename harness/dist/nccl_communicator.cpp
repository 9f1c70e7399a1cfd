// NCCL engine of the communicator (see nccl_communicator.hpp): the few NCCL
// functions used are looked up with dlsym, typed from nccl.h, so a mismatch with
// the header is a compile error and a missing library a run-time reason.
#include "harness/dist/nccl_communicator.hpp"

#include "harness/check.hpp"

#if HEADROOM_HAVE_CUDA && HEADROOM_HAVE_NCCL_HEADER
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <mutex>
#endif

namespace hr::dist {

#if HEADROOM_HAVE_CUDA && HEADROOM_HAVE_NCCL_HEADER
namespace {

struct NcclApi {
  void* handle = nullptr;
  std::string error;  // why it could not be loaded
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
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
    api.all_reduce = reinterpret_cast<decltype(api.all_reduce)>(sym("ncclAllReduce"));
    api.all_gather = reinterpret_cast<decltype(api.all_gather)>(sym("ncclAllGather"));
    api.broadcast = reinterpret_cast<decltype(api.broadcast)>(sym("ncclBroadcast"));
    api.error_string = reinterpret_cast<decltype(api.error_string)>(sym("ncclGetErrorString"));
  });
  return api;
}

void nccl_ok(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  HR_CHECK(false, "{}: {}", what, nccl().error_string ? nccl().error_string(rc) : "NCCL error");
}

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
  NcclCommunicator(const std::vector<uint8_t>& id_bytes, int rank, int ranks, void* stream)
      : rank_(rank), size_(ranks), stream_(static_cast<cudaStream_t>(stream)) {
    HR_ARG_CHECK(id_bytes.size() == sizeof(ncclUniqueId), "NCCL unique id of {} bytes, expected {}", id_bytes.size(),
                 sizeof(ncclUniqueId));
    ncclUniqueId id;
    std::memcpy(&id, id_bytes.data(), sizeof id);
    nccl_ok(nccl().comm_init_rank(&comm_, ranks, id, rank), "ncclCommInitRank");
  }
  ~NcclCommunicator() override {
    if (comm_ != nullptr) (void)nccl().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string engine() const override { return "nccl"; }
  bool device_buffers() const override { return true; }
  void synchronize() override { cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  CommStats library_received() const override { return received_; }

 protected:
  void do_all_reduce_sum(void* buf, size_t count, CommDType t) override {
    nccl_ok(nccl().all_reduce(buf, buf, count, nccl_type(t), ncclSum, comm_, stream_), "ncclAllReduce");
    receive(count * comm_dtype_size(t));
  }
  void do_all_gather(const void* send, void* recv, size_t count, CommDType t) override {
    nccl_ok(nccl().all_gather(send, recv, count, nccl_type(t), comm_, stream_), "ncclAllGather");
    receive(count * comm_dtype_size(t) * static_cast<size_t>(size_));
  }
  void do_broadcast(void* buf, size_t bytes, int root) override {
    nccl_ok(nccl().broadcast(buf, buf, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
    receive(bytes);
  }
  // NCCL has no barrier: a one-byte all-reduce, completed, is one.
  void do_barrier() override {
    void* one = nullptr;
    cuda_ok(cudaMalloc(&one, 1), "cudaMalloc");
    nccl_ok(nccl().all_reduce(one, one, 1, ncclUint8, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    synchronize();
    cuda_ok(cudaFree(one), "cudaFree");
  }

 private:
  // Counted after each NCCL call returned (its receive buffer handed to the library).
  void receive(size_t bytes) {
    ++received_.calls;
    received_.payload_bytes += bytes;
  }

  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  CommStats received_;
};

}  // namespace

std::string nccl_unavailable_reason() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return "no CUDA device answers";
  return nccl().error;
}

std::vector<uint8_t> nccl_unique_id() {
  const std::string why = nccl_unavailable_reason();
  HR_CHECK(why.empty(), "NCCL unavailable: {}", why);
  ncclUniqueId id;
  nccl_ok(nccl().get_unique_id(&id), "ncclGetUniqueId");
  std::vector<uint8_t> out(sizeof id);
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>& unique_id, int rank, int ranks,
                                                     void* cuda_stream) {
  const std::string why = nccl_unavailable_reason();
  HR_CHECK(why.empty(), "NCCL unavailable: {}", why);
  return std::make_unique<NcclCommunicator>(unique_id, rank, ranks, cuda_stream);
}

#else  // built without CUDA or without nccl.h

namespace {
constexpr const char* kNoNccl = HEADROOM_HAVE_CUDA ? "built without NCCL's header (nccl.h not found at configure time)"
                                                   : "built without the CUDA backend";
}

std::string nccl_unavailable_reason() { return kNoNccl; }
std::vector<uint8_t> nccl_unique_id() { throw Error(std::string("NCCL unavailable: ") + kNoNccl); }
std::unique_ptr<Communicator> make_nccl_communicator(const std::vector<uint8_t>&, int, int, void*) {
  throw Error(std::string("NCCL unavailable: ") + kNoNccl);
}

#endif

}  // namespace hr::dist
