package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// cpuMeter reads CPU time (user + system) of this process (getrusage) or of
// another one (/proc/<pid>/stat).
type cpuMeter struct{ pid int }

func (m cpuMeter) seconds() (float64, error) {
	if m.pid == 0 {
		var ru unix.Rusage
		if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
			return 0, fmt.Errorf("getrusage: %w", err)
		}
		return tv(ru.Utime) + tv(ru.Stime), nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", m.pid))
	if err != nil {
		return 0, fmt.Errorf("server CPU: %w", err)
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the line, in clock ticks (USER_HZ = 100 on Linux).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("server CPU: /proc/%d/stat: no command field", m.pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("server CPU: /proc/%d/stat: %d fields", m.pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("server CPU: /proc/%d/stat: utime %q stime %q", m.pid, f[11], f[12])
	}
	return float64(ut+st) / 100, nil
}

func tv(t unix.Timeval) float64 {
	return float64(time.Duration(t.Sec)*time.Second+time.Duration(t.Usec)*time.Microsecond) / float64(time.Second)
}

func procDir(pid int) string {
	if pid == 0 {
		return "/proc/self"
	}
	return "/proc/" + strconv.Itoa(pid)
}

// vmHWM is the peak resident set size in bytes from /proc/<pid>/status.
func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(procDir(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("peak RSS: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("peak RSS: VmHWM line %q", line)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("peak RSS: VmHWM line %q: %w", line, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("peak RSS: no VmHWM in %s/status", procDir(pid))
}

// resetHWM sets the peak RSS back to the current RSS ("5" to clear_refs,
// Linux ≥ 4.0), so each phase gets its own peak.
func resetHWM(pid int) error {
	if err := os.WriteFile(procDir(pid)+"/clear_refs", []byte("5"), 0); err != nil {
		return fmt.Errorf("reset peak RSS: %w", err)
	}
	return nil
}

// rssBreakdown reads RssAnon, RssFile and RssShmem (MiB); nil when unreadable.
func rssBreakdown(pid int) map[string]float64 {
	b, err := os.ReadFile(procDir(pid) + "/status")
	if err != nil {
		return nil
	}
	out := map[string]float64{}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || (name != "RssAnon" && name != "RssFile" && name != "RssShmem") {
			continue
		}
		f := strings.Fields(v)
		if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil && len(f) == 2 {
			out[name] = float64(kb) / 1024
		}
	}
	return out
}
