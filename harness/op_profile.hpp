// Device time by op, for finding where a step's time goes. While an OpProfile is
// active on a thread, each op that thread calls records its region on its device
// (OpTimer: CUDA events on the device's stream, a steady clock on the CPU) without
// waiting for it; take() waits and sums the seconds per op. An op called inside
// another counts in the outer one: naive attention's products and softmax count as
// attention, a linear layer's product as matmul and its bias as add_bias. On a GPU
// an op's region runs from its first event to its last, so time the device waits
// inside it for the host (an index built on the host, a value read back) is the
// op's too. The
// kernels' public functions hold an OpTimer named after themselves (through
// HR_IF_CUDA, kernels/common/dispatch.hpp, or their own). Without an active
// profile an OpTimer costs one thread-local read.
//
// time_region (harness/timing.hpp) runs a region once more under a profile, after
// its timed repetitions and outside them, when HEADROOM_OP_PROFILE=1: the events
// a profile records add their own cost, so the timed samples stay free of them.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hr {

class Device;
class Tensor;
class Timer;

class OpProfile {
 public:
  // Active on the calling thread until destroyed; a second one on the same thread
  // is refused (InvalidArgument).
  OpProfile();
  ~OpProfile();
  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

  // Waits for every region recorded since the start (or the last take) and gives
  // the seconds of each op, summed over its calls; calls() says how many. Refused
  // while an op of this profile is open on the calling thread.
  std::map<std::string, double> take();
  const std::map<std::string, size_t>& calls() const { return calls_; }

  // Whether a profile is active on the calling thread.
  static bool active();

 private:
  friend class OpTimer;
  size_t begin(Device& dev);
  void end(size_t region, const char* op) noexcept;

  struct Region {
    const char* op = nullptr;
    Device* dev = nullptr;
    std::unique_ptr<Timer> timer;
    bool ok = true;  // start and stop recorded
  };
  std::vector<Region> regions_;
  std::map<Device*, std::vector<std::unique_ptr<Timer>>> spare_;
  std::map<std::string, size_t> calls_;
};

// One op's region on its device, recorded into the thread's active profile when it
// is the outermost op; nothing without one.
class OpTimer {
 public:
  OpTimer(Device& dev, const char* op);
  OpTimer(const Tensor& on, const char* op);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  void open(Device& dev);
  OpProfile* owner_ = nullptr;    // the profile active when the op opened
  OpProfile* profile_ = nullptr;  // set when this op records its region
  size_t region_ = 0;
  const char* op_;
  bool nested_ = false;  // counted in the thread's depth
};

// The environment variable that asks time_region for a profiled run of each region.
inline constexpr const char* kOpProfileEnv = "HEADROOM_OP_PROFILE";
// Whether HEADROOM_OP_PROFILE is set to 1.
bool op_profile_requested();

}  // namespace hr
