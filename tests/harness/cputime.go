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
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("cpu time of %d: no threads listed (%v)", pid, err)
	}
	var sum time.Duration
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended between the listing and the read
		}
		fields := strings.Fields(string(b))
		if len(fields) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			t.Fatalf("cpu time of %d: %s: %q: %v", pid, f, b, err)
		}
		sum += time.Duration(ns)
	}
	return sum
}
