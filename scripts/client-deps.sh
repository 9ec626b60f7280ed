#!/usr/bin/env bash
# Installs what the client examples' tests need (tests/it/clients.rs), only when
# missing, project-local and never system-wide:
#   - redis-py into target/clients/python (pip install --target),
#   - Node.js and npm from Debian when they are not on the machine,
#   - Go and redigo from Debian (tests/it/go_package.rs builds the Go package in
#     GOPATH mode against /usr/share/gocode: no Go module proxy is reached).
# The Rust example's `redis` crate is a dev-dependency: cargo fetches it.
# Quiet and quick when everything is there; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

REDIS_PY_VERSION=7.4.1
dir=target/clients

say() { echo "client-deps: $*" >&2; }

need_root() {
  if [ "$(id -u)" -eq 0 ]; then
    echo ""
  elif command -v sudo >/dev/null 2>&1; then
    echo "sudo"
  else
    say "need root (or sudo) to install $*"
    exit 1
  fi
}

# Python 3 and pip.
if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
  say "installing python3 and pip (Debian)"
  sudo=$(need_root python3-pip)
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3 python3-pip >/dev/null
fi

# venv, for the Python package's tests (tests/it/packages.rs): Debian's Python
# has it in a package of its own.
if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
  say "installing python3-venv (Debian)"
  sudo=$(need_root python3-venv)
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
fi

# redis_exporter, for the Prometheus recipe's test (tests/it/prometheus.rs).
if ! command -v prometheus-redis-exporter >/dev/null 2>&1; then
  say "installing prometheus-redis-exporter (Debian)"
  sudo=$(need_root prometheus-redis-exporter)
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # The package starts a service on :9121 for a server on :6379 where init
  # runs; the tests start their own exporter and never use it.
  $sudo apt-get install -y -qq --no-install-recommends prometheus-redis-exporter >/dev/null
  $sudo systemctl disable --now prometheus-redis-exporter >/dev/null 2>&1 \
    || $sudo service prometheus-redis-exporter stop >/dev/null 2>&1 || true
fi

# redis-py.
if ! PYTHONPATH="$dir/python" python3 -c \
    "import sys, redis; sys.exit(redis.__version__ != '$REDIS_PY_VERSION')" >/dev/null 2>&1; then
  say "installing redis-py $REDIS_PY_VERSION into $dir/python"
  rm -rf "$dir/python"
  mkdir -p "$dir/python"
  # --break-system-packages is harmless with --target; Debian's pip needs it.
  python3 -m pip install --quiet --disable-pip-version-check --no-input \
    --target "$dir/python" "redis==$REDIS_PY_VERSION" 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check --no-input \
    --break-system-packages --target "$dir/python" "redis==$REDIS_PY_VERSION"
fi

# Node.js and npm.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  say "installing nodejs and npm (Debian)"
  sudo=$(need_root nodejs npm)
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi


# Go and redigo, for the Go package's tests (tests/it/go_package.rs).
if ! command -v go >/dev/null 2>&1 \
    || [ ! -d /usr/share/gocode/src/github.com/gomodule/redigo/redis ]; then
  say "installing golang-go and golang-github-gomodule-redigo-dev (Debian)"
  sudo=$(need_root golang-go golang-github-gomodule-redigo-dev)
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends golang-go golang-github-gomodule-redigo-dev >/dev/null
fi
