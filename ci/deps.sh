# Sourced by ci/test and ci/suite: makes sure the Debian packages headroom builds
# with are present. As root it installs what is missing; otherwise it prints the
# exact install line and stops. The CUDA toolkit is optional (it is not a Debian
# package of the version headroom targets); without nvcc the build is CPU-only.
# libre2-dev: the regular expressions of --only / --skip (linear time, no recursion).
# libssl-dev: OpenSSL's SHA-256 for the step digest of `headroom fleet`.
# libgfortran-12-dev: the static Fortran runtime that OpenBLAS's static library
# needs (HEADROOM_PORTABLE, see CMakeLists.txt). clang and libclang-rt-14-dev: the
# libFuzzer target over the JSON readers (suites/reliability/fuzz/). python3-numpy and
# python3-jsonschema: the dump tests (suites/dump/: the README's numpy rebuild, the
# conventions.json schema).
# libopenmpi-dev and openmpi-bin: the data-parallel worker (headroom-dp) that
# `headroom run` and the ctest cases (label mpi) launch under mpirun; the build
# succeeds without them (the DP entries then skip with the reason), so both
# commands install them beside the build's own packages.
HEADROOM_DEBS=(build-essential cmake git pkg-config libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev nlohmann-json3-dev libcli11-dev libopenblas-dev libgfortran-12-dev libre2-dev libssl-dev)
HEADROOM_DEBS_RUN=(libopenmpi-dev openmpi-bin)
HEADROOM_DEBS_TEST=(chromium python3 python3-numpy python3-jsonschema clang libclang-rt-14-dev)

headroom_install_deps() {
  local want=("$@") missing=() p
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local line="apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    echo "headroom: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 || {
      echo "headroom: package install failed; run: $line" >&2
      return 1
    }
  else
    echo "headroom: missing packages; install them with:" >&2
    echo "  sudo $line" >&2
    return 1
  fi
}

# Configure and build into $1 (default: build/) with every core.
headroom_build() {
  local dir=${1:-build}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=Release ${HEADROOM_CMAKE_ARGS:-} >&2 || return 1
  cmake --build "$root/$dir" -j "$(nproc)" >&2 || return 1
}
