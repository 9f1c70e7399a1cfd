# Writes OUT, a C++ source defining hr::build::git_sha(): the commit the sources are
# at when the build runs (not when it was configured), with "-dirty-<digest>" where
# tracked files differ from it (the digest names the changes), "unknown" outside a
# git checkout. OUT is rewritten only when that text changes, so an unchanged
# commit rebuilds nothing.
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
    # Which changes: the first 8 hex digits of the SHA-256 of the tracked files' diff
    # against the commit. Two builds with different changes never pass for one build
    # (a resumed file, a baseline). The diff's form is pinned where an option can pin
    # it; a setting left (an attributes file's hunk headers) can only give one change
    # two digests on two machines, never two changes one.
    execute_process(COMMAND git -c core.quotepath=on -c diff.suppressBlankEmpty=false diff HEAD --binary
                            --no-color --no-ext-diff --no-textconv --no-renames --diff-algorithm=myers
                            --no-indent-heuristic --inter-hunk-context=0 -U3 -O/dev/null
                            --src-prefix=a/ --dst-prefix=b/
      WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE diff RESULT_VARIABLE rc ERROR_QUIET)
    if(rc EQUAL 0)
      string(SHA256 digest "${diff}")
      string(SUBSTRING "${digest}" 0 8 digest)
      set(sha "${sha}-dirty-${digest}")
    else()
      set(sha "${sha}-dirty")
    endif()
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
