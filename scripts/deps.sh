#!/usr/bin/env bash
# Installs what building and testing need, only when missing: redis-server
# and redis-cli (Debian's redis-server, redis-tools), libclang for bindgen
# (the redis-module crate generates its bindings at build time), a C
# compiler, and valgrind (`make bench-check`, which CI runs, counts
# instructions under callgrind). Silent, instant and needing no root when everything is there.
set -euo pipefail

# Whether bindgen can find a libclang: LIBCLANG_PATH, or the places
# clang-sys searches on Debian (any LLVM version, any architecture).
have_libclang() {
  local dirs=()
  [ -n "${LIBCLANG_PATH:-}" ] && dirs+=("$LIBCLANG_PATH")
  dirs+=(/usr/lib/llvm-*/lib /usr/lib/*-linux-gnu /usr/lib /usr/lib64 /usr/local/lib)
  local d f
  for d in "${dirs[@]}"; do
    for f in "$d"/libclang.so "$d"/libclang-*.so* "$d"/libclang.so.*; do
      # libclang-cpp (the C++ API, pulled in by other packages) is not the
      # libclang bindgen loads: clang-sys skips it.
      case "$f" in */libclang-cpp*) continue ;; esac
      [ -e "$f" ] && return 0
    done
  done
  return 1
}

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v callgrind_control >/dev/null 2>&1 || missing+=(valgrind)
have_libclang || missing+=(libclang-dev)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "deps: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged server on 127.0.0.1:6379; `make run` needs that port.
if [[ " ${missing[*]} " == *" redis-server "* ]]; then
  $sudo systemctl disable --now redis-server >/dev/null 2>&1 \
    || $sudo service redis-server stop >/dev/null 2>&1 || true
fi
