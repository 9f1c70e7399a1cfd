// What lets the CPU's element-wise loops vectorise their exponentials (GCC on
// x86-64; elsewhere both macros are empty and the loops stay scalar):
// - expf declared with its vector variants, which glibc's libmvec provides (part of
//   the C library: _ZGVbN4v_expf for SSE, _ZGVdN8v_expf for AVX2, ...), so the
//   vectoriser may call one for 4 or 8 lanes at a time. It needs the file compiled
//   with -fno-math-errno (the vector variants set no errno) and, for a loop with a
//   select in it, -fno-trapping-math (so that both sides may be computed and
//   blended); CMakeLists.txt sets both for the files that include this header.
// - HR_CPU_CLONES on a loop's function: compiled twice, for x86-64-v3 (AVX2, FMA)
//   and for the baseline, and the loader picks one by the CPU it runs on (an
//   ifunc), so a portable binary still runs its loops 8 wide where it can.
#pragma once

#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
extern "C" float expf(float) noexcept __attribute__((__simd__("notinbranch")));
#define HR_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HR_CPU_CLONES
#endif
