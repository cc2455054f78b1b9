#!/usr/bin/env bash
# Installs the Debian packages kvdock and its tests need, only those missing:
# libzmq (cgo build of pebbe/zmq4), pkg-config, tmux (dashboard end-to-end test),
# redis-server and redis-tools (redis-cli) for the resp tier's tests, which start
# their own servers on loopback (the system service is not needed),
# and the Python packages the interop tests drive kvdock with (/usr/bin/python3).
# Usage: scripts/install-deps.sh [run|test]   (run: build deps only; test: all)
set -euo pipefail
want=(libzmq3-dev pkg-config)
if [ "${1:-test}" = "test" ]; then
  want+=(tmux redis-server redis-tools python3 python3-zmq python3-msgpack python3-torch)
fi
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
