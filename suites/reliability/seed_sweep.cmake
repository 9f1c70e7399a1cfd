# The verdict must not depend on the seed: `headroom run` (the quick preset on the
# CPU) at every seed of SEEDS must pass, since a correct machine that fails at
# another seed would be called "not fit" by chance. Prints each seed's summary and
# names the failing measurements of any seed that fails.
# BUDGET (seconds, optional) bounds the whole sweep: each run gets what is left and is
# stopped at the end of it, so a sweep that runs long fails with its own message and
# leaves no run behind (ctest's TIMEOUT kills this script, not the run it started).
#   cmake -DHEADROOM=<binary> -DOUT=<dir> -DSEEDS=1,2,... [-DONLY=<regex>] [-DSKIP=<regex>] [-DBUDGET=<s>]
#         -P seed_sweep.cmake
if(NOT HEADROOM OR NOT OUT OR NOT SEEDS)
  message(FATAL_ERROR "seed_sweep.cmake: HEADROOM, OUT and SEEDS are required")
endif()
string(REPLACE "," ";" SEEDS "${SEEDS}")
set(failed_seeds "")
string(TIMESTAMP started "%s" UTC)
foreach(seed IN LISTS SEEDS)
  set(limit "")
  if(BUDGET)
    string(TIMESTAMP now "%s" UTC)
    math(EXPR left "${BUDGET} - (${now} - ${started})")
    if(left LESS_EQUAL 0)
      message(FATAL_ERROR "the sweep's budget of ${BUDGET} s was spent before seed ${seed}")
    endif()
    set(limit TIMEOUT ${left})
  endif()
  set(dir "${OUT}/seed_${seed}")
  set(only "")
  if(ONLY)
    set(only --only ${ONLY})
  endif()
  if(SKIP)
    list(APPEND only --skip ${SKIP})
  endif()
  execute_process(COMMAND ${HEADROOM} run --preset quick --backend cpu --seed ${seed} --out ${dir} ${only}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err ${limit})
  if(rc MATCHES "timeout")
    message(FATAL_ERROR "seed ${seed}: stopped at the end of the sweep's budget of ${BUDGET} s (${rc})")
  endif()
  string(REGEX MATCH "[0-9]+ of [0-9]+ measurements passed[^\n]*" line "${out}")
  message(STATUS "seed ${seed}: exit ${rc}: ${line}")
  if(NOT rc EQUAL 0)
    list(APPEND failed_seeds ${seed})
    # The runner names every failed measurement on stderr.
    string(REGEX MATCHALL "headroom: +[^\n]*(FAILED|NOT caught|threw)[^\n]*" lines "${err}")
    foreach(l IN LISTS lines)
      message(STATUS "  ${l}")
    endforeach()
  endif()
endforeach()
list(LENGTH SEEDS n)
list(LENGTH failed_seeds nf)
if(nf GREATER 0)
  message(FATAL_ERROR "the quick preset failed at ${nf} of ${n} seeds: ${failed_seeds}")
endif()
message(STATUS "the quick preset passed at all ${n} seeds")
