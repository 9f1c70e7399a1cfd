// A watchdog for collectives that may never finish. A GPU collective whose peer is
// gone (a crashed rank, a dead link) does not fail: its kernel waits for data that
// will not come, and every later wait on the device hangs with it. The watchdog
// polls from its own thread, and once the library reports an asynchronous error,
// or a collective has been pending past the deadline, it aborts the communicator
// (ncclCommAbort, which ends the waiting kernels) and keeps the reason, which the
// communicator then throws from its next call. As PyTorch's NCCL process group
// does, the deadline runs from when a collective was queued.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace hr::dist {

struct WatchdogHooks {
  // The library's asynchronous error, if any (ncclCommGetAsyncError).
  std::function<std::optional<std::string>()> async_error;
  // Whether the newest collective queued is still pending (an event query).
  std::function<bool()> pending;
  // Ends the communicator's pending work (ncclCommAbort); called at most once.
  std::function<void()> abort;
};

class CollectiveWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  CollectiveWatchdog(WatchdogHooks hooks, std::chrono::milliseconds timeout,
                     std::chrono::milliseconds poll = std::chrono::milliseconds(100));
  ~CollectiveWatchdog();  // stops the thread; never aborts
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // A collective was just queued: its deadline starts now.
  void queued();
  // Why the communicator was aborted, once it was (then every later call must throw).
  std::optional<std::string> reason() const;
  bool aborted() const { return aborted_.load(); }
  // Stops watching (before the communicator is destroyed or aborted by its owner).
  void stop();

  // The deadline in force: HEADROOM_COLLECTIVE_TIMEOUT_S (seconds, > 0), else 600.
  static std::chrono::milliseconds timeout_from_env();

 private:
  void run();
  void fire(std::string why);

  WatchdogHooks hooks_;
  const std::chrono::milliseconds timeout_, poll_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<Clock::time_point> queued_at_;  // the newest collective's
  std::optional<std::string> reason_;
  std::atomic<bool> aborted_{false};
  std::thread thread_;
};

}  // namespace hr::dist
