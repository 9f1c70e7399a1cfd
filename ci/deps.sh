# Sourced by ci/test and ci/suite: makes sure the Debian packages headroom builds
# with are present. As root it installs what is missing; otherwise it prints the
# exact install line and stops. The CUDA toolkit is optional (it is not a Debian
# package of the version headroom targets); without nvcc the build is CPU-only.
# libre2-dev: the regular expressions of --only / --skip (linear time, no recursion).
# libssl-dev: OpenSSL's SHA-256 for the step digest of `headroom fleet`.
# libboost-context-dev: the fibers of the emulated warps on which the correctness
# tests run the CUDA kernels' own code (suites/common/warp_emulation.hpp).
# python3-pip: fetches the cuDNN frontend's headers (headroom_cudnn_frontend below).
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
  libfmt-dev nlohmann-json3-dev libcli11-dev libopenblas-dev libgfortran-12-dev libre2-dev libssl-dev python3-pip
  libboost-context-dev)
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

# The cuDNN frontend's headers (header-only C++, MIT licence), for cuDNN's fused
# attention beside the own kernels (kernels/attention/attention_cudnn.cpp). Not a
# Debian package: its PyPI wheel carries them under include/, and pip fetches it
# once into .deps/cudnn-frontend/ (CMake looks there). Optional: where the fetch
# fails the build goes on without that form, which then says why it is unavailable.
HEADROOM_CUDNN_FRONTEND_VERSION=1.32.0
headroom_cudnn_frontend() {
  local root dir tmp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  dir=$root/.deps/cudnn-frontend
  [ "$(cat "$dir/VERSION" 2>/dev/null)" = "$HEADROOM_CUDNN_FRONTEND_VERSION" ] && [ -f "$dir/include/cudnn_frontend.h" ] &&
    return 0
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "headroom: no pip (python3-pip); building without cuDNN's fused attention" >&2
    return 0
  fi
  tmp=$(mktemp -d)
  # The wheel's headers are the same for every Python; these flags only pick one file.
  # Offline, pip gives up at once rather than retrying for minutes.
  if python3 -m pip download --quiet --disable-pip-version-check --retries 0 --timeout 10 --no-deps \
    --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 \
    -d "$tmp" "nvidia-cudnn-frontend==$HEADROOM_CUDNN_FRONTEND_VERSION" >&2 &&
    rm -rf "$dir" && mkdir -p "$dir" &&
    python3 - "$tmp" "$dir" <<'PY' >&2
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(sys.argv[2], names)
    print("headroom: cuDNN frontend headers: %d files from %s" % (len(names), wheel.rsplit("/", 1)[-1]))
PY
  then
    echo "$HEADROOM_CUDNN_FRONTEND_VERSION" >"$dir/VERSION"
  else
    echo "headroom: the cuDNN frontend could not be fetched; building without cuDNN's fused attention" >&2
  fi
  rm -rf "$tmp"
  return 0
}

# Configure and build into $1 (default: build/) with every core.
headroom_build() {
  local dir=${1:-build}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  export PATH="$PATH:/usr/local/cuda/bin"
  command -v nvcc >/dev/null && headroom_cudnn_frontend
  cmake -S "$root" -B "$root/$dir" -DCMAKE_BUILD_TYPE=Release ${HEADROOM_CMAKE_ARGS:-} >&2 || return 1
  cmake --build "$root/$dir" -j "$(nproc)" >&2 || return 1
}
