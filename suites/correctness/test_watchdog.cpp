// The collective watchdog (harness/dist/watchdog.hpp) with stand-in hooks: a
// collective pending past the deadline is aborted once, with a reason; one that
// completes, or nothing queued, is left alone; an asynchronous error aborts at once;
// a collective queued while the watchdog looks is held to its own deadline, not the
// one before it; the owner sees the abort before it starts; and the abort waits for
// a library call in progress, but not past its grace.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "harness/check.hpp"
#include "harness/dist/watchdog.hpp"

namespace {

using hr::dist::CollectiveWatchdog;
using hr::dist::WatchdogHooks;
using std::chrono::milliseconds;

struct Fake {
  std::atomic<bool> pending{true};
  std::atomic<int> aborts{0};
  std::atomic<bool> error{false};
  WatchdogHooks hooks() {
    return {[this]() -> std::optional<std::string> {
              if (error.load()) return std::string("remote process exited");
              return std::nullopt;
            },
            [this] { return pending.load(); }, [this] { aborts.fetch_add(1); }};
  }
};

// Waits up to `limit` for the watchdog to abort; true if it did.
bool aborts_within(const CollectiveWatchdog& w, milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (w.aborted()) return true;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return w.aborted();
}

TEST(CollectiveWatchdog, AbortsACollectivePendingPastItsDeadlineOnce) {
  Fake f;
  CollectiveWatchdog w(f.hooks(), milliseconds(150), milliseconds(10));
  const auto t0 = std::chrono::steady_clock::now();
  w.queuing();
  ASSERT_TRUE(aborts_within(w, milliseconds(10000)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, milliseconds(150));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(f.aborts.load(), 1);
  ASSERT_TRUE(w.reason().has_value());
  EXPECT_NE(w.reason()->find("past the 0 s deadline"), std::string::npos) << *w.reason();  // 0.15 s, as "{:.0f}"
}

TEST(CollectiveWatchdog, LeavesACompletedCollectiveAndAnIdleCommunicatorAlone) {
  Fake done;
  done.pending = false;
  CollectiveWatchdog w1(done.hooks(), milliseconds(50), milliseconds(10));
  w1.queuing();
  Fake idle;  // pending, but nothing was queued through the watchdog
  CollectiveWatchdog w2(idle.hooks(), milliseconds(50), milliseconds(10));
  EXPECT_FALSE(aborts_within(w1, milliseconds(400)));
  EXPECT_FALSE(aborts_within(w2, milliseconds(50)));
  EXPECT_EQ(done.aborts.load() + idle.aborts.load(), 0);
  EXPECT_FALSE(w1.reason().has_value());
}

// The main thread queues a new collective while the watchdog is between reading the
// previous one's deadline (long past) and querying the event, which is by then the
// new one's and pending: the stand-in's pending() queues it at that moment. The new
// collective never completes, so the abort comes, but not before its own deadline.
TEST(CollectiveWatchdog, HoldsACollectiveQueuedMeanwhileToItsOwnDeadline) {
  const milliseconds timeout(80);
  std::atomic<CollectiveWatchdog*> watchdog{nullptr};
  std::atomic<bool> done_before{true};  // the previous collective: complete
  std::atomic<int> queries{0}, aborts{0};
  std::chrono::steady_clock::time_point requeued{}, aborted_at{};
  WatchdogHooks hooks{[]() -> std::optional<std::string> { return std::nullopt; },
                      [&] {
                        ++queries;
                        if (done_before.exchange(false)) {
                          // The previous collective is complete; this query is the
                          // first after the new one was queued.
                          requeued = std::chrono::steady_clock::now();
                          watchdog.load()->queuing();
                        }
                        return true;  // the new collective, pending for good
                      },
                      [&] {
                        aborted_at = std::chrono::steady_clock::now();
                        ++aborts;
                      }};
  // The previous collective's deadline passes before the watchdog polls at all.
  CollectiveWatchdog w(std::move(hooks), timeout, milliseconds(2 * timeout.count()));
  watchdog = &w;
  w.queuing();
  ASSERT_TRUE(aborts_within(w, milliseconds(10000)));
  w.stop();  // the abort hook has returned: its time is written
  ASSERT_EQ(aborts.load(), 1);
  EXPECT_GE(queries.load(), 2);
  const double after_ms = std::chrono::duration<double, std::milli>(aborted_at - requeued).count();
  EXPECT_GE(after_ms, static_cast<double>(timeout.count())) << "ms from queuing the new collective to the abort";
}

// aborted() is true before the abort hook runs: the abort ends the waiting kernels
// before it returns, and the owner must not take that for a finished collective.
TEST(CollectiveWatchdog, MarksItselfAbortedBeforeTheAbortStarts) {
  std::atomic<CollectiveWatchdog*> watchdog{nullptr};
  std::atomic<int> seen_marked{-1};
  WatchdogHooks hooks{[]() -> std::optional<std::string> { return std::string("remote process exited"); },
                      [] { return true; },
                      [&] {
                        seen_marked = watchdog.load()->aborted() && watchdog.load()->reason().has_value() ? 1 : 0;
                      }};
  CollectiveWatchdog w(std::move(hooks), milliseconds(600000), milliseconds(100));
  watchdog = &w;  // the first poll is 100 ms away
  ASSERT_TRUE(aborts_within(w, milliseconds(10000)));
  w.stop();  // the abort hook has returned
  EXPECT_EQ(seen_marked.load(), 1);
}

TEST(CollectiveWatchdog, AbortsAtOnceOnAnAsynchronousError) {
  Fake f;
  f.pending = false;
  CollectiveWatchdog w(f.hooks(), milliseconds(600000), milliseconds(10));
  EXPECT_FALSE(aborts_within(w, milliseconds(50)));
  f.error = true;
  ASSERT_TRUE(aborts_within(w, milliseconds(10000)));
  EXPECT_EQ(f.aborts.load(), 1);
  EXPECT_NE(w.reason()->find("remote process exited"), std::string::npos) << *w.reason();
}

// Waits up to `limit` for the abort hook to have run `n` times; true if it did.
bool hook_ran_within(const Fake& f, int n, milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end && f.aborts.load() < n) std::this_thread::sleep_for(milliseconds(5));
  return f.aborts.load() >= n;
}

// The owner checked aborted() and is inside a library call: the communicator must not
// be freed under it. The abort is marked at once but waits for the call to end.
TEST(CollectiveWatchdog, AnAbortWaitsForACallInProgress) {
  Fake f;
  CollectiveWatchdog w(f.hooks(), milliseconds(600000), milliseconds(10), milliseconds(60000));
  auto call = w.enter_call();
  f.error = true;
  ASSERT_TRUE(aborts_within(w, milliseconds(10000)));
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(f.aborts.load(), 0) << "aborted under a call in progress";
  call.unlock();
  EXPECT_TRUE(hook_ran_within(f, 1, milliseconds(10000)));
  w.stop();
  EXPECT_EQ(f.aborts.load(), 1);
}

// A call blocked inside the library (a peer that is gone) is what the abort ends: it
// is not waited for past the grace.
TEST(CollectiveWatchdog, AnAbortDoesNotWaitPastItsGraceForABlockedCall) {
  Fake f;
  CollectiveWatchdog w(f.hooks(), milliseconds(600000), milliseconds(10), milliseconds(100));
  const auto call = w.enter_call();
  f.error = true;
  ASSERT_TRUE(aborts_within(w, milliseconds(10000)));
  const auto marked = std::chrono::steady_clock::now();
  ASSERT_TRUE(hook_ran_within(f, 1, milliseconds(10000))) << "an abort waited for a blocked call for good";
  EXPECT_GE(std::chrono::steady_clock::now() - marked, milliseconds(90));  // the grace, less the poll's slack
  w.stop();
  EXPECT_EQ(f.aborts.load(), 1);
}

TEST(CollectiveWatchdog, TakesItsDeadlineFromTheEnvironment) {
  unsetenv("HEADROOM_COLLECTIVE_TIMEOUT_S");
  EXPECT_EQ(CollectiveWatchdog::timeout_from_env(), milliseconds(600000));
  setenv("HEADROOM_COLLECTIVE_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(CollectiveWatchdog::timeout_from_env(), milliseconds(2500));
  setenv("HEADROOM_COLLECTIVE_TIMEOUT_S", "0.001", 1);
  EXPECT_EQ(CollectiveWatchdog::timeout_from_env(), milliseconds(1));
  // Under a millisecond the deadline would round to 0 ms.
  for (const char* bad : {"0", "-1", "ten", "5s", "0.0005", "nan", "1e7"}) {
    setenv("HEADROOM_COLLECTIVE_TIMEOUT_S", bad, 1);
    EXPECT_THROW(CollectiveWatchdog::timeout_from_env(), hr::InvalidArgument) << bad;
  }
  unsetenv("HEADROOM_COLLECTIVE_TIMEOUT_S");
}

}  // namespace
