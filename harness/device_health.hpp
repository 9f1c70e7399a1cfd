// Whether the CUDA context of this process can still be used. Some CUDA errors
// (an illegal address, a launch failure, a hardware exception) are sticky: every
// later call of the process fails with them, and only a new process gets a working
// context. `headroom run` asks after each property and sweep, and continues what
// is left in a fresh process (`run --resume`) when the answer is yes.
#pragma once

#include <string>

namespace hr {

// True when the process's CUDA context is lost; *why then names the error. False
// without CUDA, without a context, or when the last error was cleared (an
// out-of-memory, for one, is not sticky).
bool cuda_context_lost(std::string* why);

}  // namespace hr
