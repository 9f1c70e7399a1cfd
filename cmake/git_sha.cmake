# Writes OUT, a C++ source defining hr::build::git_sha(): the commit the sources are
# at when the build runs (not when it was configured), with "-dirty" where tracked
# files differ from it, "unknown" outside a git checkout. OUT is rewritten only
# when that text changes, so an unchanged commit rebuilds nothing.
#   cmake -DSOURCE_DIR=<checkout> -DOUT=<file.cpp> -P git_sha.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD
  WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE sha RESULT_VARIABLE rc
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR NOT sha)
  set(sha "unknown")
else()
  # Tracked files only: a build folder or a scratch file in the checkout is not a change.
  execute_process(COMMAND git status --porcelain --untracked-files=no
    WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE changed RESULT_VARIABLE rc
    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(sha "${sha}-unknown-state")
  elseif(changed)
    set(sha "${sha}-dirty")
  endif()
endif()
set(text "// Generated at build time by cmake/git_sha.cmake: the commit this build is of.
#include \"harness/build_info.hpp\"

namespace hr::build {
const char* git_sha() { return \"${sha}\"; }
}  // namespace hr::build
")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
