# `headroom --version` names the commit the checkout is at (taken at build time, not
# when the build folder was configured), "-dirty-<digest of the diff>" exactly when
# tracked files differ.
#   cmake -DHEADROOM=<headroom binary> -DSOURCE_DIR=<checkout> -P version_commit.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SOURCE_DIR}"
  OUTPUT_VARIABLE sha RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0)
  message("skipped: ${SOURCE_DIR} is not a git checkout")
  return()
endif()
execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY "${SOURCE_DIR}"
  OUTPUT_VARIABLE changed RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0)
  set(sha "${sha}-unknown-state")
elseif(changed)
  # The changes' digest, taken here with sha256sum rather than CMake's hash.
  execute_process(COMMAND bash -c "set -o pipefail; git -c core.quotepath=on -c diff.suppressBlankEmpty=false \
diff HEAD --binary --no-color --no-ext-diff --no-textconv --no-renames --diff-algorithm=myers --no-indent-heuristic \
--inter-hunk-context=0 -U3 -O/dev/null --src-prefix=a/ --dst-prefix=b/ | sha256sum | cut -c1-8"
    WORKING_DIRECTORY "${SOURCE_DIR}"
    OUTPUT_VARIABLE digest RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT digest MATCHES "^[0-9a-f]+$")
    message(FATAL_ERROR "the digest of the checkout's changes could not be taken (exit ${rc}): ${digest}")
  endif()
  set(sha "${sha}-dirty-${digest}")
endif()
execute_process(COMMAND "${HEADROOM}" --version OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "\\(git ([^,]*),")
  message(FATAL_ERROR "headroom --version gave no commit (exit ${rc}): ${out}")
endif()
if(NOT CMAKE_MATCH_1 STREQUAL sha)
  message(FATAL_ERROR "headroom --version names commit ${CMAKE_MATCH_1}; the checkout is at ${sha} (build again)")
endif()
message("headroom --version names ${sha}, the checkout's commit")
