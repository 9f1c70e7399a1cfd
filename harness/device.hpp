// Backends and devices. A Device is one place tensors live and ops run: the CPU,
// or one CUDA GPU (with its stream, cuBLAS handle and stream-ordered memory pool).
// The backend is chosen at run time and passed explicitly; there are no global
// handles. Every allocation goes through the Device's MemoryTracker.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "harness/faults.hpp"
#include "harness/memory.hpp"

namespace hr {

enum class BackendKind : uint8_t { cpu, cuda };
const char* backend_name(BackendKind k);  // "cpu" | "cuda"

// What a results file records about the machine a run used.
struct DeviceRecord {
  std::string backend;  // "cpu" | "cuda"
  std::string name;     // GPU name, or CPU model
  int cores = 0;        // CPU: hardware threads used
  // CUDA only (0 / empty on the CPU):
  int ordinal = 0;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  size_t memory_bytes = 0;  // CPU: physical memory
  int sm_clock_khz = 0, memory_clock_khz = 0, memory_bus_bits = 0;
  int driver_version = 0, runtime_version = 0, cublas_version = 0;
  bool ecc = false;
  std::string uuid;
  std::string pci_bus_id;  // "0000:1b:00.0": where the card sits, for finding it in the node
};
void to_json(nlohmann::json& j, const DeviceRecord& r);

// Start/stop timer: CUDA events on the device's stream, a steady clock on the CPU.
class Timer {
 public:
  virtual ~Timer() = default;
  virtual void start() = 0;
  virtual void stop() = 0;          // marks the end, without waiting
  virtual double seconds() = 0;     // waits for the region to finish: its time
  double stop_seconds() {
    stop();
    return seconds();
  }
};

struct ReadbackOrder;  // a device's read-back numbering (device.cpp)

class Device {
 public:
  explicit Device(BackendKind k);
  virtual ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  BackendKind kind() const { return kind_; }
  bool is_cuda() const { return kind_ == BackendKind::cuda; }
  const DeviceRecord& record() const { return record_; }
  MemoryTracker& memory() { return memory_; }

  // Tracked allocation; throws OutOfMemory (budget, injected failure or real),
  // leaving the accounting as it was. Zero bytes gives a valid unique pointer.
  void* allocate(size_t bytes, Consumer c);
  void deallocate(void* p, size_t bytes, Consumer c) noexcept;

  // Copies (the CPU backend treats "device" memory as host memory). copy_to_host
  // returns once the bytes are on the host, so it waits for the stream. copy_to_device
  // returns once the source may be reused (CUDA stages pageable memory and does not
  // wait for the stream).
  void copy_to_device(void* dst, const void* src, size_t bytes) { do_copy_to_device(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) {
    ++host_syncs_;
    do_copy_to_host(dst, src, bytes);
  }
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  void synchronize() {
    ++host_syncs_;
    do_synchronize();
  }
  virtual std::unique_ptr<Timer> make_timer() = 0;

  // A copy into host memory enqueued in stream order, waited for only when its bytes
  // are read: what a step needs back (its loss) without stalling the stream between
  // micro-batches. The CPU copies at once.
  //
  // Read-backs are numbered in the order they were enqueued. A device runs its work
  // in order, so when one has landed every older one has too: a read that must wait
  // waits for the newest read-back enqueued so far (one host sync), and every read
  // of an older one after it returns at once, whatever order they are read in. A
  // read-back may outlive its device: the device waits for its work when it is
  // destroyed, and the read-back then returns its bytes without asking it.
  class HostReadback {
   public:
    virtual ~HostReadback() = default;
    HostReadback(const HostReadback&) = delete;
    HostReadback& operator=(const HostReadback&) = delete;
    // Waits for the copy if it has not landed (one host sync) and returns its bytes.
    const void* wait();
    uint64_t sequence() const { return sequence_; }

   protected:
    // Takes the next number of `dev`'s read-backs; make one only once its copy is
    // enqueued.
    explicit HostReadback(Device& dev);
    virtual bool landed() = 0;             // whether its copy is done, without waiting
    virtual void block() = 0;              // until its own copy is done (ReadbackFault only)
    virtual const void* bytes() const = 0;

   private:
    std::shared_ptr<ReadbackOrder> order_;
    uint64_t sequence_;
  };
  virtual std::shared_ptr<HostReadback> read_back(const void* src, size_t bytes);

  // How many times the host has waited for this device: copy_to_host, synchronize,
  // and a HostReadback that had not landed when read. Tests use it to see that a step
  // waits a fixed number of times, not once per micro-batch.
  size_t host_syncs() const { return host_syncs_; }

  // CUDA handles as opaque pointers so plain C++ code need not see CUDA headers:
  // cudaStream_t and cublasHandle_t. nullptr on the CPU.
  virtual void* cuda_stream() const { return nullptr; }
  virtual void* cublas_handle() const { return nullptr; }

  // Evicts what the device caches between timed samples, so that a sample reads its
  // operands from memory and not from a cache the previous sample warmed (nvbench's
  // practice; the H200's 60 MB L2 holds many benchmark operands whole). CUDA: writes
  // a buffer of twice the L2 size on the stream; the CPU: nothing.
  virtual void flush_caches() {}

  // The stream-ordered pool's own high-water mark of used bytes (CUDA), for the
  // MEM-3 cross-check against the tracker; nullopt on the CPU.
  virtual std::optional<size_t> pool_used_high_bytes() { return std::nullopt; }
  virtual void reset_pool_high_water() {}
  // Gives back to the driver what the pool keeps but does not use (CUDA; once the
  // work queued so far is done), and how many times an out-of-memory did so before
  // asking again. The CPU: gives the heap's free memory back to the kernel
  // (malloc_trim; the CPU device keeps freed memory in the heap), 0.
  virtual void release_cached() {}
  virtual size_t pool_releases_on_oom() const { return 0; }

 protected:
  virtual void* raw_allocate(size_t bytes) = 0;  // nullptr when the device is out of memory
  virtual void raw_free(void* p) noexcept = 0;
  virtual void do_copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void do_copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void do_synchronize() = 0;
  // Blocks until the newest read-back enqueued so far has landed (and so all older
  // ones). Backends whose read-backs are complete when made need not override it.
  virtual void wait_for_newest_readback() {}
  // Called by a backend's destructor once its work is done: every read-back has
  // landed, and none may reach the device again. The base destructor calls it too.
  void retire_readbacks() noexcept;
  void count_host_sync() { ++host_syncs_; }

  DeviceRecord record_;

 private:
  BackendKind kind_;
  MemoryTracker memory_;
  size_t host_syncs_ = 0;
  std::shared_ptr<ReadbackOrder> readbacks_;
};

// "cpu", "cuda" or "auto" (cuda when a device answers, else cpu).
std::unique_ptr<Device> make_device(const std::string& backend);
std::unique_ptr<Device> make_device(BackendKind kind);
std::unique_ptr<Device> make_cpu_device();
// Throws Error when this build has no CUDA backend or no device answers.
std::unique_ptr<Device> make_cuda_device(int ordinal = 0);

// Whether a CUDA device can be used; when not, *reason says why
// ("built without CUDA", "no CUDA device: <driver message>").
bool cuda_device_available(std::string* reason = nullptr);
// CUDA devices this process can see (CUDA_VISIBLE_DEVICES applies); 0 without a
// CUDA backend or when the driver does not answer.
int cuda_device_count();

// The read-back order's fault switch, the control of the host-wait count: a read
// that must wait waits for its own copy only and marks none landed (as if a
// device could finish its copies out of order), so every older read-back read after
// it is asked again, and waits again if the device still trails.
struct ReadbackFault {
  bool wait_own_only = false;
};

}  // namespace hr

HR_DECLARE_FAULT_SLOT(hr::ReadbackFault);

namespace hr {

// Wrong on purpose (the control of Device.cuda_AnOutOfMemoryGivesThePoolsPiecesBack):
// on out-of-memory the CUDA pool keeps the freed pieces it holds rather than giving
// them back to the driver and asking once more.
struct PoolFault {
  bool keep_pieces_on_oom = false;
};

}  // namespace hr

HR_DECLARE_FAULT_SLOT(hr::PoolFault);
