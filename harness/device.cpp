// Device base, the CPU backend and backend selection.
#include "harness/device.hpp"
#include "harness/device_health.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include <malloc.h>
#include <unistd.h>

#include "harness/check.hpp"

HR_DEFINE_FAULT_SLOT(hr::ReadbackFault)
HR_DEFINE_FAULT_SLOT(hr::PoolFault)

namespace hr {

const char* backend_name(BackendKind k) { return k == BackendKind::cpu ? "cpu" : "cuda"; }

void to_json(nlohmann::json& j, const DeviceRecord& r) {
  j = nlohmann::json{{"backend", r.backend}, {"name", r.name}, {"memory_bytes", r.memory_bytes}};
  if (r.backend == "cpu") {
    j["cores"] = r.cores;
  } else {
    j["ordinal"] = r.ordinal;
    j["compute_capability"] = fmt::format("{}.{}", r.cc_major, r.cc_minor);
    j["sm_count"] = r.sm_count;
    j["sm_clock_khz"] = r.sm_clock_khz;
    j["memory_clock_khz"] = r.memory_clock_khz;
    j["memory_bus_bits"] = r.memory_bus_bits;
    j["driver_version"] = r.driver_version;
    j["runtime_version"] = r.runtime_version;
    j["cublas_version"] = r.cublas_version;
    j["ecc"] = r.ecc;
    j["uuid"] = r.uuid;
    j["pci_bus_id"] = r.pci_bus_id;
  }
}

void* Device::allocate(size_t bytes, Consumer c) {
  memory_.reserve(bytes, c);  // throws on budget / injected failure
  void* p = nullptr;
  try {
    p = raw_allocate(bytes == 0 ? 1 : bytes);
  } catch (...) {
    memory_.unreserve(bytes, c);
    throw;
  }
  if (p == nullptr) {
    memory_.unreserve(bytes, c);
    throw OutOfMemory(fmt::format("out of memory on {}: {} for {}", record_.name, format_bytes(bytes),
                                  consumer_name(c)));
  }
  return p;
}

struct ReadbackOrder {
  std::mutex m;
  Device* device = nullptr;     // nullptr once the device has retired its read-backs
  uint64_t issued = 0;          // the newest read-back's number
  uint64_t landed_through = 0;  // every read-back up to this number has landed
};

Device::Device(BackendKind k) : kind_(k), readbacks_(std::make_shared<ReadbackOrder>()) {
  readbacks_->device = this;
}

Device::~Device() { retire_readbacks(); }

void Device::retire_readbacks() noexcept {
  const std::lock_guard<std::mutex> lock(readbacks_->m);
  readbacks_->device = nullptr;
  readbacks_->landed_through = readbacks_->issued;
}

Device::HostReadback::HostReadback(Device& dev) : order_(dev.readbacks_) {
  const std::lock_guard<std::mutex> lock(order_->m);
  sequence_ = ++order_->issued;
}

const void* Device::HostReadback::wait() {
  const std::lock_guard<std::mutex> lock(order_->m);
  if (sequence_ > order_->landed_through) {
    if (landed()) {
      order_->landed_through = sequence_;  // in order: every older one has landed too
    } else if (const ReadbackFault* f = faults::active<ReadbackFault>(); f != nullptr && f->wait_own_only) {
      order_->device->count_host_sync();
      block();
    } else {
      // Not retired: a retired device marked every read-back landed.
      Device& dev = *order_->device;
      const uint64_t newest = order_->issued;
      dev.count_host_sync();
      dev.wait_for_newest_readback();
      order_->landed_through = newest;
    }
  }
  return bytes();
}

namespace {

// A read-back that is complete when made: the CPU's memory is the host's.
class ImmediateReadback final : public Device::HostReadback {
 public:
  ImmediateReadback(Device& dev, std::vector<unsigned char> bytes) : HostReadback(dev), bytes_(std::move(bytes)) {}

 protected:
  bool landed() override { return true; }
  void block() override {}
  const void* bytes() const override { return bytes_.data(); }

 private:
  std::vector<unsigned char> bytes_;
};

}  // namespace

std::shared_ptr<Device::HostReadback> Device::read_back(const void* src, size_t bytes) {
  std::vector<unsigned char> host(bytes);
  if (bytes > 0) do_copy_to_host(host.data(), src, bytes);
  return std::make_shared<ImmediateReadback>(*this, std::move(host));
}

void Device::deallocate(void* p, size_t bytes, Consumer c) noexcept {
  if (p == nullptr) return;
  raw_free(p);
  memory_.release(bytes, c);
}

namespace {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

class CpuTimer final : public Timer {
 public:
  void start() override { t0_ = std::chrono::steady_clock::now(); }
  void stop() override { t1_ = std::chrono::steady_clock::now(); }
  double seconds() override { return std::chrono::duration<double>(t1_ - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_, t1_;
};

// glibc gives the top of its heap back to the kernel once more than a few MB lie free
// there (the threshold follows the largest block it mapped), so a training step that
// frees its activations and workspace at the end faults the same pages in again in
// the next: about 1,400 page faults and their zeroing a step of the quick
// transformer. The CPU device keeps freed memory in the process's heap instead, as
// the CUDA pool keeps it on the card: blocks below 32 MiB (glibc's largest mmap
// threshold) come from the heap, and up to 1 GiB free at its top stays mapped for
// the process's life. The setting is the process's (headroom's programs are the
// library's users). release_cached gives that memory back (malloc_trim); no run
// calls it, a program that wants the memory back between runs may.
void keep_freed_memory_in_the_heap() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

class CpuDevice final : public Device {
 public:
  CpuDevice() : Device(BackendKind::cpu) {
    keep_freed_memory_in_the_heap();
    record_.backend = "cpu";
    record_.name = cpu_model_name();
    record_.cores = static_cast<int>(std::thread::hardware_concurrency());
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    record_.memory_bytes = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  }
  void copy_on_device(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void fill_zero(void* dst, size_t n) override { std::memset(dst, 0, n); }
  std::unique_ptr<Timer> make_timer() override { return std::make_unique<CpuTimer>(); }
  void release_cached() override {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
  }

 protected:
  void do_copy_to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void do_copy_to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void do_synchronize() override {}
  void* raw_allocate(size_t bytes) override {
    // 64-byte alignment for vector loads; aligned_alloc needs a multiple of it.
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void raw_free(void* p) noexcept override { std::free(p); }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() { return std::make_unique<CpuDevice>(); }

std::unique_ptr<Device> make_device(BackendKind kind) {
  return kind == BackendKind::cpu ? make_cpu_device() : make_cuda_device(0);
}

std::unique_ptr<Device> make_device(const std::string& backend) {
  if (backend == "cpu") return make_cpu_device();
  if (backend == "cuda") return make_cuda_device(0);
  if (backend == "auto") return cuda_device_available() ? make_cuda_device(0) : make_cpu_device();
  throw InvalidArgument(fmt::format("unknown backend '{}' (expected auto, cpu or cuda)", backend));
}

#if !HEADROOM_HAVE_CUDA
bool cuda_context_lost(std::string*) { return false; }

std::unique_ptr<Device> make_cuda_device(int) {
  throw Error("this build of headroom has no CUDA backend (no nvcc was found at configure time)");
}
bool cuda_device_available(std::string* reason) {
  if (reason) *reason = "this build of headroom has no CUDA backend (configured without nvcc)";
  return false;
}
int cuda_device_count() { return 0; }
#endif

}  // namespace hr
