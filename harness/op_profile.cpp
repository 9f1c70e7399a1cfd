// Device time by op (op_profile.hpp).
#include "harness/op_profile.hpp"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <utility>

#include "harness/check.hpp"
#include "harness/device.hpp"
#include "harness/tensor.hpp"

namespace hr {
namespace {

thread_local OpProfile* t_active = nullptr;
thread_local int t_depth = 0;  // ops open on this thread under the active profile

}  // namespace

OpProfile::OpProfile() {
  HR_ARG_CHECK(t_active == nullptr, "an op profile is already active on this thread");
  t_active = this;
  t_depth = 0;
}

OpProfile::~OpProfile() {
  if (t_active == this) t_active = nullptr;
}

bool OpProfile::active() { return t_active != nullptr; }

size_t OpProfile::begin(Device& dev) {
  Region r;
  r.dev = &dev;
  std::vector<std::unique_ptr<Timer>>& spare = spare_[&dev];
  if (spare.empty()) {
    r.timer = dev.make_timer();
    HR_CHECK(r.timer != nullptr, "an op profile: device {} has no timer", dev.record().name);
  } else {
    r.timer = std::move(spare.back());
    spare.pop_back();
  }
  r.timer->start();
  regions_.push_back(std::move(r));
  return regions_.size() - 1;
}

void OpProfile::end(size_t region, const char* op) noexcept {
  Region& r = regions_[region];
  r.op = op;
  try {
    r.timer->stop();
  } catch (...) {  // a failed record (a device error) loses this region, not the op's own error
    r.ok = false;
  }
}

std::map<std::string, double> OpProfile::take() {
  HR_CHECK(t_active != this || t_depth == 0, "an op profile is taken while an op of it is still open");
  std::map<std::string, double> seconds;
  std::exception_ptr failed;  // the first region that could not be read: thrown once all are put back
  for (Region& r : regions_) {
    if (r.ok && r.op != nullptr && !failed) {
      try {
        seconds[r.op] += r.timer->seconds();
        ++calls_[r.op];
      } catch (...) {
        failed = std::current_exception();
      }
    }
    spare_[r.dev].push_back(std::move(r.timer));
  }
  regions_.clear();
  if (failed) std::rethrow_exception(failed);
  return seconds;
}

OpTimer::OpTimer(Device& dev, const char* op) : op_(op) {
  if (t_active != nullptr) open(dev);
}

// The tensor's device is asked for only under a profile: without one the op's own
// checks, after this, are what judge its arguments.
OpTimer::OpTimer(const Tensor& on, const char* op) : op_(op) {
  if (t_active != nullptr && on.defined()) open(on.device());
}

void OpTimer::open(Device& dev) {
  owner_ = t_active;
  nested_ = true;
  if (t_depth++ > 0) return;  // inside another op: counted there
  try {
    region_ = t_active->begin(dev);
    profile_ = t_active;
  } catch (...) {  // no timer (a device error): the op runs, its region is not recorded
  }
}

OpTimer::~OpTimer() {
  if (!nested_ || t_active != owner_) return;  // the profile it opened under is gone
  --t_depth;
  if (profile_ != nullptr) profile_->end(region_, op_);
}

bool op_profile_requested() {
  const char* v = std::getenv(kOpProfileEnv);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace hr
