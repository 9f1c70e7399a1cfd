// Which kernels ran, counted by name, process-wide: "attention_forward:cudnn". A
// form asked for that falls back call by call (cuDNN with no graph for a shape or a
// mask it does not take, tensor cores on a device before sm_80) shows as the
// kernels that did run, and each such call also counts as a fallback of the kernel
// it asked for, with why. (fp32 attention, which has the scalar kernels alone, is
// not a fallback: the GPU setting chooses among fp16's and bf16's forms.) time_region records the calls and fallbacks of each timed region
// (TimeStats::kernel_calls, kernel_fallbacks), so every timed point says what it
// timed and why that was not what it asked for. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace hr {

using KernelCalls = std::map<std::string, uint64_t>;

// One call of kernel `name` ("<op>:<variant>").
void count_kernel_call(const char* name);

// The counts so far.
KernelCalls kernel_calls();

// What ran between two snapshots, per run of the work between them: the kernels
// that ran at least once, each with its calls divided by `runs`.
std::map<std::string, double> kernel_calls_per_run(const KernelCalls& before, const KernelCalls& after, double runs);

// One call that asked for kernel `asked` ("attention_forward:cudnn") and ran
// another (which count_kernel_call counts), and why, in a few words ("segment
// masks (packing) take the own kernels").
void count_kernel_fallback(const char* asked, const std::string& why);

// Per kernel asked for, per reason: its fallbacks so far.
using KernelFallbacks = std::map<std::string, std::map<std::string, uint64_t>>;
KernelFallbacks kernel_fallbacks();

// The kernels asked for that fell back between two snapshots, each with the
// reasons it fell back for there, joined by "; " in the order of their text.
std::map<std::string, std::string> kernel_fallbacks_between(const KernelFallbacks& before,
                                                            const KernelFallbacks& after);

}  // namespace hr
