#!/usr/bin/env bash
# The GPU bundle on a machine with none of the Debian packages headroom builds with:
#   bare_bundle.sh SOURCE_DIR BUILD_DIR WORK_DIR
# Packs BUILD_DIR with ci/gpu-bundle --from, unpacks it, and runs `ci/gpu-check
# preflight` from the unpacked copy, which must report "no GPU" (exit 2) with the
# binaries loading and `headroom info` running. As root, the preflight runs in a
# chroot that holds only the bundle, glibc, libstdc++, libgcc, CUDA's libraries
# and the few tools the script calls, so a library that a bare GPU machine lacks
# cannot be found by accident; elsewhere it runs with a cleared environment.
set -euo pipefail
src=$1 build=$2 work=$3
# A /proc left mounted by an interrupted run must go before the folder does.
umount "$work/root/proc" 2>/dev/null || true
rm -rf "$work"
mkdir -p "$work"
"$src/ci/gpu-bundle" --from "$build" "$work/bundle.tar.gz"
mkdir -p "$work/root/opt"
tar -C "$work/root/opt" -xzf "$work/bundle.tar.gz"

rootfs=$work/root
# A chroot needs root and, in a container, the capability to use it: probe with /.
if [ "$(id -u)" -eq 0 ] && command -v chroot >/dev/null && "$(command -v chroot)" / true 2>/dev/null; then
  # Copies a file and the libraries it needs (per ldd) into the chroot; hard links
  # where the file system allows (CUDA's libraries are hundreds of MB).
  put() {
    local f=$1 real
    real=$(readlink -f "$f")
    mkdir -p "$rootfs$(dirname "$f")"
    [ -e "$rootfs$f" ] || cp -l "$real" "$rootfs$f" 2>/dev/null || cp "$real" "$rootfs$f"
  }
  put_with_libs() {
    local f=$1 lib
    put "$f"
    for lib in $(ldd "$f" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib/ {print $1}'); do put "$lib"; done
  }
  # The host's merged-/usr links (Debian 12: /bin -> usr/bin, ...), so that paths
  # such as /bin/bash (ldd's interpreter) resolve inside as outside.
  for d in bin sbin lib lib64; do
    if [ -L "/$d" ]; then
      target=$(readlink "/$d")
      case $target in /*) mkdir -p "$rootfs$target" ;; *) mkdir -p "$rootfs/$target" ;; esac
      ln -s "$target" "$rootfs/$d"
    fi
  done
  mkdir -p "$rootfs/dev"
  mknod -m 666 "$rootfs/dev/null" c 1 3 2>/dev/null || : >"$rootfs/dev/null"
  tools=(bash sh env date mkdir dirname basename sed awk grep tee tail head sort paste cut tr cat printf ldd uname)
  for t in "${tools[@]}"; do
    p=$(command -v "$t" || true)
    [ -n "$p" ] && [ -f "$p" ] && put_with_libs "$p"
  done
  # ldd is a script run by bash; the loader itself.
  put_with_libs /lib64/ld-linux-x86-64.so.2
  # The libraries a bare GPU machine has: what the bundled binaries need, minus what
  # the bundle carries (the check inside ci/gpu-bundle already refused anything else).
  for b in "$rootfs"/opt/build-gpu/headroom "$rootfs"/opt/build-gpu/libheadroom_core.so; do
    for lib in $(LD_LIBRARY_PATH="$rootfs/opt/build-gpu" ldd "$b" | awk '/=> \// {print $3}'); do
      case $lib in "$rootfs"/*) ;; *) put "$lib" ;; esac
    done
  done
  mkdir -p "$rootfs/tmp" "$rootfs/out"
  # Nothing of Debian's fmt, OpenBLAS or gfortran may be there outside the bundle
  # (fmt's library travels inside it, in /opt/build-gpu).
  if find "$rootfs" -path "$rootfs/opt" -prune -o \( -name 'libfmt*' -o -name 'libopenblas*' -o \
    -name 'libgfortran*' -o -name 'libquadmath*' -o -name 'libbenchmark*' \) -print | grep -q .; then
    echo "bare_bundle: a Debian-only library got into the chroot" >&2
    exit 1
  fi
  # The loader resolves a program's $ORIGIN through /proc/self/exe, which a real
  # machine has; where /proc cannot be mounted, the bundle's folder is named instead.
  how="in a chroot with only the C/C++ runtimes and CUDA's libraries"
  libpath=()
  mkdir -p "$rootfs/proc"
  if mount -t proc proc "$rootfs/proc" 2>/dev/null; then
    trap 'umount "$rootfs/proc" 2>/dev/null || true' EXIT
  else
    libpath=(LD_LIBRARY_PATH=/opt/build-gpu)
    how="$how (no /proc: the bundle's folder given as LD_LIBRARY_PATH)"
  fi
  set +e
  env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp "${libpath[@]}" "$(command -v chroot)" "$rootfs" \
    /opt/build-gpu/ci/gpu-check preflight /out
  rc=$?
  set -e
  summary=$rootfs/out/summary.txt
else
  set +e
  env -i PATH=/usr/bin:/bin HOME=/tmp "$rootfs/opt/build-gpu/ci/gpu-check" preflight "$work/out"
  rc=$?
  set -e
  summary=$work/out/summary.txt
  how="with a cleared environment (no chroot here: not root, or not allowed)"
fi
cat "$summary"
if [ $rc -ne 2 ]; then
  echo "bare_bundle: preflight exited $rc, expected 2 (no GPU) $how" >&2
  exit 1
fi
grep -q "no GPU" "$summary" && grep -q "headroom info runs" "$summary" || {
  echo "bare_bundle: preflight's summary does not say 'no GPU' with the binaries running" >&2
  exit 1
}
echo "bare_bundle: preflight from the bundle reports no GPU cleanly $how"

# ci/gpu-check-timed from the same bundle: no GPU is exit 2, and its archive holds
# the preflight's summary all the same.
set +e
"$src/ci/gpu-check-timed" "$work/bundle.tar.gz" "$work/timed" 2>"$work/timed.log"
rc=$?
set -e
if [ $rc -ne 2 ]; then
  cat "$work/timed.log" >&2
  echo "bare_bundle: gpu-check-timed exited $rc, expected 2 (no GPU)" >&2
  exit 1
fi
tar -xzOf "$work/timed/gc.tar.gz" gc/summary.txt | grep -q "no GPU" || {
  echo "bare_bundle: gpu-check-timed's archive lacks the preflight's 'no GPU' summary" >&2
  exit 1
}
echo "bare_bundle: gpu-check-timed says no GPU and packs what ran"

# A later command from the first's archive: the earlier files kept, the summary
# going on (two preflight lines); an archive that is not there is bad input.
set +e
"$src/ci/gpu-check-timed" "$work/bundle.tar.gz" "$work/timed2" "$work/timed/gc.tar.gz" 2>"$work/timed2.log"
rc=$?
"$src/ci/gpu-check-timed" "$work/bundle.tar.gz" "$work/timed3" "$work/nowhere.tar.gz" 2>"$work/timed3.log"
rc3=$?
set -e
if [ $rc -ne 2 ] || [ "$(tar -xzOf "$work/timed2/gc.tar.gz" gc/summary.txt | grep -c '^preflight')" != 2 ]; then
  cat "$work/timed2.log" >&2
  echo "bare_bundle: gpu-check-timed from an earlier archive exited $rc (expected 2) or lost its summary" >&2
  exit 1
fi
if [ $rc3 -ne 2 ] || ! grep -q "no earlier results" "$work/timed3.log"; then
  echo "bare_bundle: a missing earlier archive was not refused (exit $rc3): $(cat "$work/timed3.log")" >&2
  exit 1
fi
echo "bare_bundle: gpu-check-timed goes on from an earlier archive"
