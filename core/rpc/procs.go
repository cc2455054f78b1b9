package rpc

import (
	"runtime"
	"strconv"
)

// SpareProc gives the Go scheduler one P more than it chose (the CPUs, or
// the cgroup's quota), unless GOMAXPROCS is set in the environment, and
// returns the setting in effect.
//
// Why: the server's socket goroutine waits for messages inside a cgo
// zmq_poll, and a goroutine in a cgo call keeps its P until sysmon takes it
// back, which takes up to 10 ms once sysmon has backed off. Meanwhile the
// handlers and the tier loads they start run on one P fewer than the CPUs:
// on a 2-CPU machine, the four 32 MiB loads of a prompt's prefetch ran one
// after another. The spare P lets them run on every CPU while the socket
// goroutine sleeps in the kernel. Setting GOMAXPROCS explicitly also turns
// off the runtime's periodic update from the cgroup's quota.
func SpareProc(getenv func(string) string) int {
	if v := getenv("GOMAXPROCS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return runtime.GOMAXPROCS(0)
		}
	}
	return runtime.GOMAXPROCS(runtime.GOMAXPROCS(0)+1) + 1
}
