// Limits of the process that headroom's programs adapt to before they start work.
#pragma once

namespace hr {

// Under a finite address-space limit (ulimit -v), OpenBLAS's thread pool, which it
// starts as the library loads, can fail to allocate its per-thread buffers and
// retry for ever, so that the program hangs at exit. When such a limit is set and
// OPENBLAS_NUM_THREADS is not, the program runs itself again (execv of
// /proc/self/exe, the same arguments) with OPENBLAS_NUM_THREADS=1; otherwise this
// returns and nothing changes. Call first thing in main().
void rerun_with_one_blas_thread_under_a_memory_limit(char** argv);

}  // namespace hr
