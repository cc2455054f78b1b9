// Package portholder finds, best effort, the local process that listens on
// a TCP port, so that a start refused with "address already in use" can
// name who holds the port. It reads Linux's /proc: the listening sockets of
// /proc/net/tcp and tcp6, then the processes whose open files include one
// of those sockets. A process of another user cannot be looked into; then
// nothing is found.
package portholder

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
)

// Bounds on what one lookup reads: a host with more processes or open files
// than this is searched only in part (the answer is best effort anyway).
const (
	maxProcs   = 4096
	maxFDs     = 4096
	maxNetLine = 4096
	maxCmdline = 256
)

// Holder is a process that listens on the port.
type Holder struct {
	PID     int
	Command string // its command line (cut), or its comm when that is empty
}

func (h Holder) String() string { return fmt.Sprintf("pid %d (%s)", h.PID, h.Command) }

// Find returns the process listening on TCP port, looking under root (""
// = /proc); ok is false when none could be found.
func Find(root string, port int) (Holder, bool) {
	if root == "" {
		root = "/proc"
	}
	inodes := map[string]bool{}
	for _, f := range []string{"net/tcp", "net/tcp6"} {
		listening(filepath.Join(root, f), port, inodes)
	}
	if len(inodes) == 0 {
		return Holder{}, false
	}
	procs, err := os.ReadDir(root)
	if err != nil {
		return Holder{}, false
	}
	seen := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if seen++; seen > maxProcs {
			break
		}
		if holds(filepath.Join(root, p.Name(), "fd"), inodes) {
			return Holder{PID: pid, Command: command(filepath.Join(root, p.Name()))}, true
		}
	}
	return Holder{}, false
}

// listening adds to inodes the socket inodes of the file's listening
// sockets (state 0A) bound to port.
func listening(path string, port int, inodes map[string]bool) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 512), maxNetLine)
	want := fmt.Sprintf(":%04X", port)
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" || !strings.HasSuffix(fields[1], want) {
			continue
		}
		if fields[9] != "0" {
			inodes[fields[9]] = true
		}
	}
}

// holds reports whether one of the descriptors in dir is one of the sockets.
func holds(dir string, inodes map[string]bool) bool {
	d, err := os.Open(dir)
	if err != nil {
		return false // another user's process, or gone
	}
	defer d.Close()
	names, err := d.Readdirnames(maxFDs)
	if err != nil && err != io.EOF {
		return false
	}
	for _, n := range names {
		link, err := os.Readlink(filepath.Join(dir, n))
		if err != nil {
			continue
		}
		if in, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(in, "]")] {
			return true
		}
	}
	return false
}

// command is the process's command line, its arguments joined by spaces and
// cut, or its comm when the command line is empty (a kernel thread).
func command(dir string) string {
	buf := make([]byte, maxCmdline)
	if f, err := os.Open(filepath.Join(dir, "cmdline")); err == nil {
		n, _ := io.ReadFull(f, buf)
		_ = f.Close()
		if s := strings.TrimSpace(strings.ReplaceAll(string(buf[:n]), "\x00", " ")); s != "" {
			if n == maxCmdline {
				s += "…"
			}
			return printable(s)
		}
	}
	comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
	return printable(strings.TrimSpace(string(comm)))
}

// printable escapes what another process put in its command line (control
// characters, terminal escapes) before it reaches a terminal.
func printable(s string) string {
	if strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
