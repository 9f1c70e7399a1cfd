// See process_limits.hpp.
#include "harness/process_limits.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>

namespace hr {

void rerun_with_one_blas_thread_under_a_memory_limit(char** argv) {
  struct rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return;
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;  // chosen already (and the rerun's own mark)
  if (::setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // No /proc (or no exec): go on as we are; the variable at least reaches children.
}

}  // namespace hr
