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
#include <cstdint>
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
  // `call_grace`: how long an abort waits for a library call in progress (enter_call).
  CollectiveWatchdog(WatchdogHooks hooks, std::chrono::milliseconds timeout,
                     std::chrono::milliseconds poll = std::chrono::milliseconds(100),
                     std::chrono::milliseconds call_grace = std::chrono::seconds(5));
  ~CollectiveWatchdog();  // stops the thread; never aborts
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // A collective is about to be queued: its deadline starts now. Called before the
  // library call and the event that `pending` queries, so a watchdog that sees the
  // new event pending also sees this call, and does not hold the new collective to
  // the deadline of the one before it.
  void queuing();
  // Held by the owner around each call into the library, from its check of aborted()
  // to the event recorded after the call, never across a wait for the device. The
  // abort waits for it, so the communicator is not freed under a call being made; a
  // call still in progress after call_grace is not waited for (a host call blocked on
  // a peer that is gone: the abort is what ends it).
  std::unique_lock<std::timed_mutex> enter_call() { return std::unique_lock<std::timed_mutex>(call_mutex_); }
  // Why the communicator was aborted, once it was (then every later call must throw).
  std::optional<std::string> reason() const;
  // True from the moment the watchdog decides to abort, before the abort starts:
  // the owner must not touch the communicator again, and must stop() the watchdog
  // (which waits for the abort to end) before it frees anything.
  bool aborted() const { return aborted_.load(); }
  // Stops watching (before the communicator is destroyed or aborted by its owner).
  void stop();

  // The deadline in force: HEADROOM_COLLECTIVE_TIMEOUT_S (seconds, 0.001 to 1e7), else 600.
  static std::chrono::milliseconds timeout_from_env();

 private:
  void run();
  void fire(std::string why);

  WatchdogHooks hooks_;
  const std::chrono::milliseconds timeout_, poll_, call_grace_;
  mutable std::mutex mutex_;
  std::timed_mutex call_mutex_;  // enter_call()
  std::condition_variable wake_;
  bool stopping_ = false;
  std::optional<Clock::time_point> queued_at_;  // the newest collective's
  uint64_t generation_ = 0;                     // collectives queued so far
  std::optional<std::string> reason_;
  std::atomic<bool> aborted_{false};
  std::thread thread_;
};

}  // namespace hr::dist
