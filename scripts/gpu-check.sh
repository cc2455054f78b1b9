#!/usr/bin/env bash
# Checks kvdock's GPU telemetry (core/gpu) against a real NVIDIA driver.
# Builds the core/gpu test binary with the build tag "gpu" (which adds
# device_gpu_test.go) and runs its device tests. They fail, never skip, when
# NVML or a device cannot be read, so run this only on a GPU machine; CI's
# plain `go test` does not compile them.
#
# Usage: scripts/gpu-check.sh [all|build|run]   (default all)
#   build  only build bin/gpu-check.test (needs Go and gcc)
#   run    only run an already built bin/gpu-check.test (a GPU machine without Go)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=bin/gpu-check.test
mode=${1:-all}
case "$mode" in all|build|run) ;; *) echo "usage: $0 [all|build|run]" >&2; exit 2 ;; esac

if [ "$mode" != run ]; then
  mkdir -p bin
  # go-nvml's nvml.h marks many functions deprecated; those warnings are noise.
  CGO_ENABLED=1 CGO_CFLAGS="${CGO_CFLAGS:-} -Wno-deprecated-declarations" \
    go test -c -race -tags gpu -o "$bin" ./core/gpu
fi
if [ "$mode" != build ]; then
  [ -x "$bin" ] || { echo "$bin missing: run $0 build first" >&2; exit 1; }
  "$bin" -test.run '^TestDevice' -test.count=1 -test.v
fi
