# End to end on the CPU: the timing verdict of `headroom validate` against a run of
# the same build on the same machine. `run --only ^BM-MB$` records a baseline; a
# validate against it must exit 0 (fit: its timings the same, or noisy where the
# machine drifted, never a regression); the same validate with a threefold slowdown
# injected into micro-batch 4 (HEADROOM_INJECT_SLOWDOWN) must exit 1 and name that
# point, confirmed on re-measurement. Threefold, not twofold: where the host is busy
# (5% of its CPU time stolen by the hypervisor is enough) validate judges only
# changes beyond 75%, and a twofold slowdown failed 2 of 17 runs: one read +65% (the
# baseline's point 9% slower than its neighbours, the slowed run's own part 17%
# faster), judged too noisy, a fit.
#   cmake -DHEADROOM=<headroom binary> -DWORK=<scratch dir> -P validate_slowdown.cmake
file(REMOVE_RECURSE "${WORK}")
function(headroom expect)
  execute_process(COMMAND "${HEADROOM}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("$ headroom ${ARGN}\n${out}${err}")
  if(NOT "${rc}" STREQUAL "${expect}")
    message(FATAL_ERROR "expected exit code ${expect}, got ${rc}: headroom ${ARGN}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()

set(common --preset quick --backend cpu --only "^BM-MB$")
headroom(0 run ${common} --out "${WORK}/baseline")
headroom(0 validate --baseline "${WORK}/baseline/results.json" ${common} --out "${WORK}/same")
if(NOT out MATCHES "verdict: FIT")
  message(FATAL_ERROR "validating a run against the same build gave no FIT verdict")
endif()

set(ENV{HEADROOM_INJECT_SLOWDOWN} "BM-MB:micro_batch=4:3")
headroom(1 validate --baseline "${WORK}/baseline/results.json" ${common} --out "${WORK}/slower")
unset(ENV{HEADROOM_INJECT_SLOWDOWN})
# A reason longer than the console's 120 columns goes on: its lines joined back.
string(REPLACE "\n    " " " out "${out}")
if(NOT out MATCHES "  - BM-MB cpu fp32 transformer [^\n]*micro_batch=4 [^\n]*confirmed on re-measurement")
  message(FATAL_ERROR "the injected slowdown at micro_batch=4 is not named as a confirmed regression")
endif()
string(REPLACE ";" "," out "${out}")  # a CMake list splits on ';', the reasons contain some
string(REGEX MATCHALL "\n  - [^\n]*" reasons "${out}")
list(LENGTH reasons n_reasons)
if(NOT n_reasons EQUAL 1)
  message(FATAL_ERROR "expected one reason (micro_batch=4), got ${n_reasons}:${reasons}")
endif()
file(REMOVE_RECURSE "${WORK}")
