// --only / --skip on hostile patterns under a small stack: a 981-character nested
// pattern took std::regex past a 256 KiB stack (SIGSEGV). With RE2 every pattern of
// the accepted size is either a selection or InvalidArgument, on a 256 KiB thread.
#include <gtest/gtest.h>
#include <pthread.h>

#include <string>
#include <vector>

#include "harness/check.hpp"
#include "harness/results/runner.hpp"

namespace {

struct Job {
  std::string pattern;
  std::string outcome;  // "selected N", "refused: ...", or "threw something else"
};

void* select_on_small_stack(void* arg) {
  auto* job = static_cast<Job*>(arg);
  try {
    hr::RunOptions opt;
    opt.only = job->pattern;
    job->outcome = "selected " + std::to_string(hr::select_specs(opt).size());
  } catch (const hr::InvalidArgument& e) {
    job->outcome = std::string("refused: ") + e.what();
  } catch (...) {
    job->outcome = "threw something else";
  }
  return nullptr;
}

std::string run_with_stack(const std::string& pattern, size_t stack_bytes) {
  Job job{pattern, ""};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes);
  pthread_t t;
  EXPECT_EQ(pthread_create(&t, &attr, select_on_small_stack, &job), 0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  return job.outcome;
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(SelectionRegex, HostilePatternsAreSelectedOrRefusedOnA256KiBStack) {
  const std::vector<std::string> patterns = {
      repeat("(", 490) + "GA" + repeat(")", 490),             // 982 characters, nested 490 deep
      repeat("(?:", 190) + "a" + repeat(")*", 190),           // nested stars
      repeat("(a|", 240) + "b" + repeat(")", 240),            // nested alternation
      repeat("a?", 450) + repeat("a", 50),                    // the classic exponential backtracker
      "(x+x+)+y" + repeat("|(x+x+)+y", 100),                 // catastrophic for backtracking engines
      "a{1000}{1000}",                                         // a repetition count far too large
      std::string(1000, '['),                                  // unbalanced
      "(?P<n>GA)(?P=n)",                                       // a backreference: not in RE2's syntax
  };
  for (const std::string& p : patterns) {
    ASSERT_LE(p.size(), 1000u);
    const std::string got = run_with_stack(p, 256 * 1024);
    EXPECT_TRUE(got.rfind("selected ", 0) == 0 || got.rfind("refused: ", 0) == 0) << p.substr(0, 40) << ": " << got;
  }
  // And the ordinary selections still select.
  EXPECT_EQ(run_with_stack("ga-1|CK-3", 256 * 1024).rfind("selected ", 0), 0u);
  EXPECT_NE(run_with_stack("^GA-1$", 256 * 1024), "selected 0");
}

TEST(SelectionRegex, SelectionIsCaseInsensitiveAndAnchorsWork) {
  hr::RunOptions opt;
  opt.only = "^ga-1$";
  const hr::Selection s = hr::select_specs(opt);
  ASSERT_EQ(s.properties.size(), 1u);
  EXPECT_EQ(s.properties[0]->id, "GA-1");
  opt.only = "^GA-";
  opt.skip = "GA-[2-6]";
  const hr::Selection t = hr::select_specs(opt);
  for (const auto* p : t.properties) EXPECT_EQ(p->id, "GA-1");
}

}  // namespace
