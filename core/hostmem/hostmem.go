// Package hostmem reads what the host's memory looks like to an operator:
// total and available RAM (/proc/meminfo), the NUMA nodes online
// (/sys/devices/system/node/online), and on which nodes the pages of one
// mapping live (/proc/self/numa_maps). It knows nothing of the pool: the
// caller names the address range.
package hostmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Default paths.
const (
	MeminfoPath  = "/proc/meminfo"
	NodesPath    = "/sys/devices/system/node/online"
	NUMAMapsPath = "/proc/self/numa_maps"
)

// maxMeminfo bounds what is read of meminfo (a few KiB on any host).
const maxMeminfo = 1 << 20

// maxNUMAMaps bounds what is read of numa_maps: one short line a mapping.
const maxNUMAMaps = 64 << 20

// MaxNodes bounds the node numbers accepted (the kernel's MAX_NUMNODES is
// at most 1024).
const MaxNodes = 1024

// Memory is the host's RAM in bytes.
type Memory struct {
	Total, Available int64
}

// ReadMemory reads MemTotal and MemAvailable from a meminfo file ("" =
// /proc/meminfo).
func ReadMemory(path string) (Memory, error) {
	if path == "" {
		path = MeminfoPath
	}
	f, err := os.Open(path)
	if err != nil {
		return Memory{}, fmt.Errorf("host memory: %w", err)
	}
	defer f.Close()
	m := Memory{Total: -1, Available: -1}
	sc := bufio.NewScanner(io.LimitReader(f, maxMeminfo))
	for sc.Scan() && (m.Total < 0 || m.Available < 0) {
		line := sc.Bytes()
		var dst *int64
		var rest []byte
		if r, ok := bytes.CutPrefix(line, []byte("MemTotal:")); ok {
			dst, rest = &m.Total, r
		} else if r, ok := bytes.CutPrefix(line, []byte("MemAvailable:")); ok {
			dst, rest = &m.Available, r
		} else {
			continue
		}
		fields := bytes.Fields(rest)
		if len(fields) != 2 || string(fields[1]) != "kB" {
			return Memory{}, fmt.Errorf("host memory: %s: unexpected line %q", path, line)
		}
		kb, err := strconv.ParseInt(string(fields[0]), 10, 64)
		if err != nil || kb < 0 || kb > 1<<50 {
			return Memory{}, fmt.Errorf("host memory: %s: unexpected line %q", path, line)
		}
		*dst = kb << 10
	}
	if err := sc.Err(); err != nil {
		return Memory{}, fmt.Errorf("host memory: %s: %w", path, err)
	}
	if m.Total < 0 || m.Available < 0 {
		return Memory{}, fmt.Errorf("host memory: %s lacks a MemTotal or MemAvailable line", path)
	}
	return m, nil
}

// OnlineNodes counts the NUMA nodes in a node list file such as
// /sys/devices/system/node/online ("0", "0-1", "0,2-3"; "" = that path).
// A kernel without NUMA has no such file: callers treat an error as one node.
func OnlineNodes(path string) (int, error) {
	if path == "" {
		path = NodesPath
	}
	b, err := readBounded(path, 4096)
	if err != nil {
		return 0, fmt.Errorf("numa nodes: %w", err)
	}
	n, err := countList(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("numa nodes: %s: %w", path, err)
	}
	return n, nil
}

// countList counts the members of a kernel cpu/node list.
func countList(s string) (int, error) {
	if s == "" {
		return 0, errors.New("empty node list")
	}
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := node(lo)
		if err != nil {
			return 0, err
		}
		b := a
		if isRange {
			if b, err = node(hi); err != nil {
				return 0, err
			}
		}
		if b < a {
			return 0, fmt.Errorf("node range %q runs backwards", part)
		}
		n += b - a + 1
	}
	if n > MaxNodes {
		return 0, fmt.Errorf("%d nodes listed, at most %d", n, MaxNodes)
	}
	return n, nil
}

func node(s string) (int, error) {
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 || v >= MaxNodes {
		return 0, fmt.Errorf("node %q: want a number from 0 to %d", s, MaxNodes-1)
	}
	return v, nil
}

func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// Placement is where the resident pages of a mapping live.
type Placement struct {
	// Pages is resident pages by node number (index); nodes holding none
	// may be absent past the last one that holds some.
	Pages []int64
	// PageSize is the kernel page size of the mapping in bytes (0 when
	// no line of the mapping was found).
	PageSize int64
}

// Resident is the pages resident on any node.
func (p Placement) Resident() int64 {
	var n int64
	for _, v := range p.Pages {
		n += v
	}
	return n
}

// ReadPlacement reads the numa_maps file at path ("" = /proc/self/numa_maps)
// and sums, by node, the pages of the mappings that start in [start, end):
// the kernel splits a mapping into several lines when parts of it differ in
// policy. No line in the range is an error.
func ReadPlacement(path string, start, end uintptr) (Placement, error) {
	if path == "" {
		path = NUMAMapsPath
	}
	f, err := os.Open(path)
	if err != nil {
		return Placement{}, fmt.Errorf("numa placement: %w", err)
	}
	defer f.Close()
	p, err := ParsePlacement(io.LimitReader(f, maxNUMAMaps), start, end)
	if err != nil {
		return Placement{}, fmt.Errorf("numa placement: %s: %w", path, err)
	}
	return p, nil
}

// ParsePlacement is ReadPlacement over r.
func ParsePlacement(r io.Reader, start, end uintptr) (Placement, error) {
	var p Placement
	found := false
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		addr, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil {
			return Placement{}, fmt.Errorf("line %.60q: address not hexadecimal", sc.Text())
		}
		if uintptr(addr) < start || uintptr(addr) >= end {
			continue
		}
		found = true
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			switch {
			case k == "kernelpagesize_kB":
				kb, err := strconv.ParseInt(v, 10, 64)
				if err != nil || kb <= 0 || kb > 16<<20 {
					return Placement{}, fmt.Errorf("page size %q", f)
				}
				if p.PageSize == 0 {
					p.PageSize = kb << 10
				}
			case len(k) > 1 && k[0] == 'N':
				nd, err := node(k[1:])
				if err != nil {
					return Placement{}, err
				}
				pages, err := strconv.ParseInt(v, 10, 64)
				if err != nil || pages < 0 || pages > 1<<50 {
					return Placement{}, fmt.Errorf("page count %q", f)
				}
				for len(p.Pages) <= nd {
					p.Pages = append(p.Pages, 0)
				}
				p.Pages[nd] += pages
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Placement{}, err
	}
	if !found {
		return Placement{}, fmt.Errorf("no mapping at %#x", start)
	}
	return p, nil
}

// Host is what the faces show of the host's memory.
type Host struct {
	Memory
	// MemoryErr says why Memory is unknown ("" when read).
	MemoryErr string
	// Nodes is the NUMA nodes online (1 when the kernel has no NUMA).
	Nodes int
	// Pool is where the pool's resident pages live, read only when there
	// are several nodes; PoolErr says why it is unknown.
	Pool    Placement
	PoolErr string
}

// Where says in a few words which nodes hold the pool's pages:
// "single-node" on a one-node host, else each node's share of the resident
// pages ("N0 75% N1 25%"), or why it is not known.
func (h Host) Where() string {
	switch {
	case h.Nodes <= 1:
		return "single-node"
	case h.PoolErr != "":
		return fmt.Sprintf("%d nodes, pool pages unknown", h.Nodes)
	}
	total := h.Pool.Resident()
	if total == 0 {
		return fmt.Sprintf("%d nodes, pool pages not yet touched", h.Nodes)
	}
	var b strings.Builder
	for nd, v := range h.Pool.Pages {
		if v == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "N%d %d%%", nd, (v*100+total/2)/total)
	}
	return b.String()
}
