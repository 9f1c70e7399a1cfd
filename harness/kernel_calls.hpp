// Which kernels ran, counted by name, process-wide: "attention_forward:cudnn". A
// form asked for that falls back call by call (cuDNN with no graph for a shape or a
// mask it does not take, fp32 on the scalar kernels) shows as the kernels that did
// run. time_region records the calls of each timed region (TimeStats::kernel_calls),
// so every timed point says what it timed. Thread-safe.
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

}  // namespace hr
