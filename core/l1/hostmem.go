package l1

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// HostMemory reads the host's available memory from /proc/meminfo (Path
// overrides it for tests). It is a settings.MemoryProbe.
type HostMemory struct {
	Path string
}

// meminfoMax bounds what is read of the file: it is a few KiB.
const meminfoMax = 1 << 20

// MemAvailable is MemAvailable from meminfo in bytes: the memory the kernel
// can give a new allocation without swapping (free plus reclaimable cache;
// /dev/shm pages are not in it).
func (h HostMemory) MemAvailable() (int64, error) {
	path := h.Path
	if path == "" {
		path = "/proc/meminfo"
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	read := 0
	for sc.Scan() {
		line := sc.Bytes()
		if read += len(line); read > meminfoMax {
			break
		}
		rest, ok := bytes.CutPrefix(line, []byte("MemAvailable:"))
		if !ok {
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) != 2 || string(fields[1]) != "kB" {
			return 0, fmt.Errorf("host memory: %s: unexpected line %q", path, line)
		}
		kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
		if err != nil || kb < 0 || kb > 1<<50 {
			return 0, fmt.Errorf("host memory: %s: unexpected line %q", path, line)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("host memory: %s: %w", path, err)
	}
	return 0, fmt.Errorf("host memory: %s has no MemAvailable line", path)
}
