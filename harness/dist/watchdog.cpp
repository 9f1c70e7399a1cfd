#include "harness/dist/watchdog.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <utility>

#include "harness/check.hpp"

namespace hr::dist {

CollectiveWatchdog::CollectiveWatchdog(WatchdogHooks hooks, std::chrono::milliseconds timeout,
                                       std::chrono::milliseconds poll, std::chrono::milliseconds call_grace)
    : hooks_(std::move(hooks)), timeout_(timeout), poll_(poll), call_grace_(call_grace) {
  HR_ARG_CHECK(hooks_.async_error && hooks_.pending && hooks_.abort, "the collective watchdog needs all three hooks");
  HR_ARG_CHECK(timeout_.count() > 0 && poll_.count() > 0 && call_grace_.count() >= 0,
               "the collective watchdog needs a positive timeout and poll, and a grace of 0 or more");
  thread_ = std::thread([this] { run(); });
}

CollectiveWatchdog::~CollectiveWatchdog() { stop(); }

void CollectiveWatchdog::stop() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CollectiveWatchdog::queuing() {
  const std::lock_guard<std::mutex> lock(mutex_);
  queued_at_ = Clock::now();
  ++generation_;
}

std::optional<std::string> CollectiveWatchdog::reason() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

void CollectiveWatchdog::fire(std::string why) {
  {
    // Marked first: the abort ends the waiting kernels well before it returns, and
    // in between the owner must already see a communicator it may not use.
    const std::lock_guard<std::mutex> lock(mutex_);
    reason_ = std::move(why);
    aborted_.store(true);
  }
  // A call the owner began before it could see the mark ends first (its event is
  // recorded); one blocked past the grace is aborted under it.
  std::unique_lock<std::timed_mutex> call(call_mutex_, std::defer_lock);
  (void)call.try_lock_for(call_grace_);
  hooks_.abort();
}

void CollectiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, poll_, [&] { return stopping_; });
    if (stopping_) break;
    const std::optional<Clock::time_point> since = queued_at_;
    const uint64_t generation = generation_;
    lock.unlock();
    std::optional<std::string> why;
    bool overdue = false;  // rather than an error the library reported
    if (const auto e = hooks_.async_error()) {
      why = fmt::format("the communicator reported an asynchronous error: {}", *e);
    } else if (since && Clock::now() - *since > timeout_ && hooks_.pending()) {
      const double waited = std::chrono::duration<double>(Clock::now() - *since).count();
      overdue = true;
      why = fmt::format(
          "a collective has been pending for {:.0f} s, past the {:.0f} s deadline (HEADROOM_COLLECTIVE_TIMEOUT_S): "
          "another rank is gone or stuck",
          waited, std::chrono::duration<double>(timeout_).count());
    }
    lock.lock();
    // An overdue collective, unless another was queued since the deadline was read:
    // the pending event may then be the new one's, whose own deadline decides.
    if (why && (!overdue || generation_ == generation)) {
      lock.unlock();
      fire(std::move(*why));
      return;
    }
  }
}

std::chrono::milliseconds CollectiveWatchdog::timeout_from_env() {
  const char* v = std::getenv("HEADROOM_COLLECTIVE_TIMEOUT_S");
  if (v == nullptr || *v == '\0') return std::chrono::seconds(600);
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  // At least a millisecond: a shorter value would become a deadline of 0 ms, which
  // the watchdog refuses only once the communicator exists (and would then leak it).
  HR_ARG_CHECK(end != v && *end == '\0' && s >= 1e-3 && s < 1e7,
               "HEADROOM_COLLECTIVE_TIMEOUT_S={}: not a number of seconds from 0.001 to 1e7", v);
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

}  // namespace hr::dist
