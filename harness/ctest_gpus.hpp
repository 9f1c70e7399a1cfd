// CTest's resource allocation on a runner with several GPUs. Run as
//   ctest -j8 --resource-spec-file gpus.json     (ci/ctest-resources writes the file)
// a GPU test declares RESOURCE_GROUPS "gpus:1" (a test over N GPUs, N groups of
// gpus:1), and CTest gives it GPUs no other test holds meanwhile, naming them in
//   CTEST_RESOURCE_GROUP_COUNT=1
//   CTEST_RESOURCE_GROUP_0=gpus
//   CTEST_RESOURCE_GROUP_0_GPUS=id:3,slots:1
// bind_ctest_gpus() turns that into CUDA_VISIBLE_DEVICES before CUDA starts, so
// device 0 of the process (and device r of rank r under mpirun) is the GPU given.
// Without those variables nothing changes. The binding is made once: the processes
// a bound one starts (a re-exec, mpirun's ranks) inherit it with
// HEADROOM_CTEST_GPUS_BOUND and keep it.
#pragma once

#include <string>
#include <vector>

namespace hr {

// The GPU ids CTest allocated to this process, in group order, each once, from an
// environment lookup (nullptr when unset). Empty when CTest allocated
// nothing; InvalidArgument on a malformed allocation.
std::vector<std::string> ctest_gpu_ids(const char* (*getenv_fn)(const char*));

// The CUDA_VISIBLE_DEVICES that binds those ids: each id is an index into the
// devices this process could see (`visible`, the variable's value before; nullptr
// when unset: every device), so a runner that already narrowed the GPUs keeps its
// choice, and one that hid them all (set, empty) gets none back (InvalidArgument).
std::string ctest_visible_devices(const std::vector<std::string>& ids, const char* visible);

// Reads CTest's allocation and sets CUDA_VISIBLE_DEVICES. With HEADROOM_CTEST_SLOT_LOG
// naming a folder, it also writes <folder>/<pid>.slot: the command line, CTest's
// allocation as given, CUDA_VISIBLE_DEVICES as it now is, and the monotonic clock
// at start and (at exit) at the end, so a check can see which tests held which GPU
// when. Returns the ids bound. A malformed
// allocation is printed and the process exits with status 2 (a test that might run
// on another test's GPU must not run). HEADROOM_INJECT_CTEST_SLOT=<id> binds every
// allocated process to that id instead of its own (the control of the allocation
// check, suites/reliability/check_ctest_slots.py).
std::vector<std::string> bind_ctest_gpus();

}  // namespace hr
