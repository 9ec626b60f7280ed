#!/usr/bin/env bash
# Installs what building and testing need, only when missing: redis-server
# and redis-cli (Debian's redis-server, redis-tools), libclang for bindgen
# (the redis-module crate generates its bindings at build time) and a C
# compiler. Quiet and quick when everything is there.
set -euo pipefail

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* /usr/lib/x86_64-linux-gnu/libclang*.so* \
      /usr/lib/aarch64-linux-gnu/libclang*.so* >/dev/null 2>&1; then
  missing+=(libclang-dev)
fi
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
