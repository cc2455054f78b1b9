#!/usr/bin/env bash
# Builds (once) a Debian trixie root holding torch 2.x (python3-torch 2.6) with
# python3-zmq and python3-msgpack, and runs commands against it. vLLM workers run
# torch 2.x while the host (bookworm) has torch 1.13; this root lets the tests
# check the pickle codec and the interop transfers against torch 2.x.
#
# Usage (as root, or through sudo):
#   scripts/torch2-env.sh build            build the root if missing, print its path
#   scripts/torch2-env.sh run CMD...       run CMD inside the root (chroot), cwd = repo
#   scripts/torch2-env.sh host CMD...      run CMD on the host while the root is mounted;
#                                          CMD sees KVDOCK_TORCH2_PYTHON, a /usr/bin/python3
#                                          inside the root, usable as a drop-in interpreter
#   scripts/torch2-env.sh path             print the root's path
#
# Environment:
#   KVDOCK_TORCH2_ROOT    the root's directory (default /var/cache/kvdock/torch2-root)
#   KVDOCK_TORCH2_MIRROR  Debian mirror (default: the first deb.debian.org-style URI
#                         apt already uses, else http://deb.debian.org/debian)
#   KVDOCK_TORCH2_SUITE   Debian suite (default trixie)
#
# Idempotent: a finished root carries a stamp naming its suite and packages; a second
# run reuses it, an unfinished one is removed and built again. Mounts (/proc, /dev,
# /dev/shm, /tmp and the repository at the same path) are set up for a command and
# unmounted after it, also when it fails or is interrupted. Several commands may run
# at once: the mounts are reference-counted under a lock.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
root="${KVDOCK_TORCH2_ROOT:-/var/cache/kvdock/torch2-root}"
suite="${KVDOCK_TORCH2_SUITE:-trixie}"
packages=(python3 python3-torch python3-zmq python3-msgpack python3-numpy)
stamp="$root/.kvdock-torch2-ready"
want_stamp="suite=$suite packages=${packages[*]}"

die() { echo "torch2-env: $*" >&2; exit 1; }

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

mirror() {
  if [ -n "${KVDOCK_TORCH2_MIRROR:-}" ]; then echo "$KVDOCK_TORCH2_MIRROR"; return; fi
  # Reuse the Debian mirror apt is configured with (deb822 or one-line sources).
  local m
  m="$(grep -hoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v -- '-security' | head -n1 | tr -d ' ' || true)"
  echo "${m:-http://deb.debian.org/debian}"
}

build() {
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ]; then
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || {
    echo "torch2-env: installing debootstrap" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  local m t0
  m="$(mirror)"
  t0=$(date +%s)
  if [ -e "$root" ] && [ ! -f "$root/.kvdock-torch2-base" ]; then
    echo "torch2-env: removing unfinished root $root" >&2
    unmount_all
    $sudo rm -rf --one-file-system "$root"
  fi
  if [ ! -f "$root/.kvdock-torch2-base" ]; then
    echo "torch2-env: debootstrap $suite (minbase) from $m into $root" >&2
    $sudo mkdir -p "$(dirname "$root")"
    $sudo debootstrap --variant=minbase "$suite" "$root" "$m" >&2
    $sudo touch "$root/.kvdock-torch2-base"
  fi
  echo "torch2-env: installing ${packages[*]} (no recommends)" >&2
  # The root needs name resolution for apt; nothing else from the host.
  $sudo cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  mount_all
  trap 'unmount_all' EXIT
  $sudo chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@" && apt-get clean' \
    sh "${packages[@]}" >&2
  unmount_all
  trap - EXIT
  echo "$want_stamp" | $sudo tee "$stamp" >/dev/null
  echo "torch2-env: root ready in $(( $(date +%s) - t0 )) s, $($sudo du -sh --one-file-system "$root" | cut -f1)" >&2
}

# Mounts are reference-counted so that parallel commands share them; the last one
# out unmounts. The lock file lives outside the root so a rebuild cannot lose it.
lock="${root}.lock"
count="${root}.mounts"
mounts=(proc dev dev/shm tmp)

with_lock() { $sudo flock "$lock" "$@"; }

mount_all() {
  with_lock bash -c '
    set -euo pipefail
    root="$1"; repo="$2"; count="$3"
    n=$(cat "$count" 2>/dev/null || echo 0)
    if [ "$n" -eq 0 ] || ! mountpoint -q "$root/proc"; then
      mkdir -p "$root/proc" "$root/dev" "$root/tmp" "$root$repo"
      mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
      mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
      # SHM workers map the segment kvdock (on the host) creates in /dev/shm.
      mountpoint -q "$root/dev/shm" || mount --bind /dev/shm "$root/dev/shm"
      mountpoint -q "$root/tmp" || mount --bind /tmp "$root/tmp"
      mountpoint -q "$root$repo" || mount --bind "$repo" "$root$repo"
      n=0
    fi
    echo $((n + 1)) > "$count"
  ' _ "$root" "$repo" "$count"
}

unmount_all() {
  [ -d "$root" ] || return 0
  with_lock bash -c '
    root="$1"; repo="$2"; count="$3"
    n=$(cat "$count" 2>/dev/null || echo 1)
    n=$((n - 1))
    if [ "$n" -le 0 ]; then
      for p in "$root$repo" "$root/tmp" "$root/dev/shm" "$root/dev" "$root/proc"; do
        mountpoint -q "$p" && umount "$p"
      done
      rm -f "$count"
    else
      echo "$n" > "$count"
    fi
  ' _ "$root" "$repo" "$count"
}

# The interpreter wrapper the "host" mode hands out: a path outside the root that
# runs /usr/bin/python3 inside it, in the caller's directory, with the caller's args.
write_wrapper() {
  local w="${root}.python3"
  $sudo tee "$w" >/dev/null <<EOF
#!/bin/sh
# Generated by scripts/torch2-env.sh: /usr/bin/python3 of $root (torch 2.x).
exec ${sudo:+$sudo }chroot "$root" /bin/sh -c 'cd "\$0" && exec /usr/bin/python3 "\$@"' "\$(pwd)" "\$@"
EOF
  $sudo chmod 0755 "$w"
  echo "$w"
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    build
    echo "$root"
    ;;
  path)
    echo "$root"
    ;;
  run)
    [ $# -gt 0 ] || die "run needs a command"
    build
    mount_all
    trap 'unmount_all' EXIT
    trap 'exit 130' INT TERM
    rc=0
    $sudo chroot "$root" /bin/sh -c 'cd "$0" && exec "$@"' "$(pwd)" "$@" || rc=$?
    exit "$rc"
    ;;
  host)
    [ $# -gt 0 ] || die "host needs a command"
    build
    py="$(write_wrapper)"
    mount_all
    trap 'unmount_all' EXIT
    trap 'exit 130' INT TERM
    rc=0
    KVDOCK_TORCH2_PYTHON="$py" KVDOCK_TORCH2_ROOT="$root" "$@" || rc=$?
    exit "$rc"
    ;;
  *)
    die "usage: $0 build | path | run CMD... | host CMD..."
    ;;
esac
