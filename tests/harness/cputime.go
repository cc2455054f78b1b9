package harness

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// CPUTime is the CPU time every thread of process pid has run so far, from
// /proc/PID/task/*/schedstat (nanoseconds, unlike the 10 ms ticks of
// /proc/PID/stat). Threads that have exited are not counted: a benchmark
// reads it across a span in which the server's threads persist.
func CPUTime(t testing.TB, pid int) time.Duration {
	t.Helper()
	return Threads(t, pid).CPU
}

// ThreadStats are what a process's threads have done so far, summed over
// the threads alive now (as CPUTime counts).
type ThreadStats struct {
	CPU time.Duration
	// ZMQIO is the CPU time of libzmq's I/O threads (named ZMQbg/IO/N),
	// part of CPU.
	ZMQIO time.Duration
	// Switches are the context switches, voluntary and not.
	Switches int64
	// MinorFaults are the process's minor page faults (every thread,
	// exited ones too: /proc/PID/stat).
	MinorFaults int64
}

// Threads reads pid's ThreadStats.
func Threads(t testing.TB, pid int) ThreadStats {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	tasks, err := filepath.Glob(filepath.Join(dir, "task", "*"))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: none listed (%v)", pid, err)
	}
	var s ThreadStats
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(task, "schedstat"))
		if err != nil {
			continue // the thread ended between the listing and the read
		}
		fields := strings.Fields(string(b))
		if len(fields) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			t.Fatalf("cpu time of %d: %s: %q: %v", pid, task, b, err)
		}
		s.CPU += time.Duration(ns)
		if comm, _ := os.ReadFile(filepath.Join(task, "comm")); strings.HasPrefix(string(comm), "ZMQbg/IO") {
			s.ZMQIO += time.Duration(ns)
		}
		status, _ := os.ReadFile(filepath.Join(task, "status"))
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasSuffix(f[0], "ctxt_switches:") {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				s.Switches += n
			}
		}
	}
	// /proc/PID/stat: the fields after "(comm)" start with state; minflt
	// is the 10th field of the line, the 8th after the comm.
	if b, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 7 {
				s.MinorFaults, _ = strconv.ParseInt(f[7], 10, 64)
			}
		}
	}
	return s
}
