package hostmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadMemory(t *testing.T) {
	m, err := ReadMemory("testdata/meminfo")
	if err != nil || m.Total != 131891544<<10 || m.Available != 120004112<<10 {
		t.Fatalf("ReadMemory = %+v, %v", m, err)
	}
	dir := t.TempDir()
	for _, bad := range []string{
		"MemTotal: 1 kB\n",                                                    // no MemAvailable
		"MemAvailable: 1 kB\n",                                                // no MemTotal
		"MemTotal: 1 kB\nMemAvailable: x kB\n",                                // not a number
		"MemTotal: 1 MB\nMemAvailable: 1 kB\n",                                // unknown unit
		"MemTotal: -1 kB\nMemAvailable: 1 kB\n",                               // negative
		strings.Repeat("y", 1<<17) + "\nMemTotal: 1 kB\nMemAvailable: 1 kB\n", // a huge line
	} {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if m, err := ReadMemory(p); err == nil {
			t.Fatalf("%.40q: got %+v, want an error", bad, m)
		}
	}
	if m, err := ReadMemory(""); err != nil || m.Total <= 0 || m.Available <= 0 || m.Available > m.Total {
		t.Fatalf("this host: %+v, %v", m, err)
	}
}

func TestOnlineNodes(t *testing.T) {
	for file, want := range map[string]int{"node_online_one": 1, "node_online_two": 2, "node_online_sparse": 3} {
		if n, err := OnlineNodes("testdata/" + file); err != nil || n != want {
			t.Errorf("%s: %d, %v; want %d", file, n, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "0-99999", "-1", "0,,1"} {
		if n, err := countList(bad); err == nil {
			t.Errorf("%q counted %d, want an error", bad, n)
		}
	}
	if _, err := OnlineNodes("testdata/absent"); err == nil {
		t.Error("absent file: no error")
	}
}

func TestPlacementTwoNodes(t *testing.T) {
	// The pool is 1 GiB at 0x7f2c00000000, split by the kernel into two
	// lines (the second part interleaved); the anon mapping after it is
	// not the pool's.
	p, err := ReadPlacement("testdata/numa_maps_two_nodes", 0x7f2c00000000, 0x7f2c40000000)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Pages) != 2 || p.Pages[0] != 131072 || p.Pages[1] != 131072 || p.PageSize != 4096 || p.Resident() != 262144 {
		t.Fatalf("placement %+v", p)
	}
	h := Host{Nodes: 2, Pool: p}
	if got := h.Where(); got != "N0 50% N1 50%" {
		t.Fatalf("Where = %q", got)
	}
	// Only the first line of the pool: two thirds on node 0.
	p, err = ReadPlacement("testdata/numa_maps_two_nodes", 0x7f2c00000000, 0x7f2c00001000)
	if err != nil {
		t.Fatal(err)
	}
	if got := (Host{Nodes: 2, Pool: p}).Where(); got != "N0 67% N1 33%" {
		t.Fatalf("Where = %q", got)
	}
	if got := (Host{Nodes: 4, Pool: Placement{Pages: []int64{0, 0, 10}}}).Where(); got != "N2 100%" {
		t.Fatalf("Where = %q", got)
	}
}

func TestPlacementOneNodeAndUntouched(t *testing.T) {
	p, err := ReadPlacement("testdata/numa_maps_one_node", 0x7f0000000000, 0x7f0040000000)
	if err != nil || len(p.Pages) != 1 || p.Pages[0] != 1024 {
		t.Fatalf("placement %+v, %v", p, err)
	}
	if got := (Host{Nodes: 1, Pool: p}).Where(); got != "single-node" {
		t.Fatalf("Where = %q", got)
	}
	p, err = ReadPlacement("testdata/numa_maps_untouched", 0x7f0000000000, 0x7f0040000000)
	if err != nil || p.Resident() != 0 {
		t.Fatalf("untouched: %+v, %v", p, err)
	}
	if got := (Host{Nodes: 2, Pool: p}).Where(); got != "2 nodes, pool pages not yet touched" {
		t.Fatalf("Where = %q", got)
	}
	if got := (Host{Nodes: 2, PoolErr: "x"}).Where(); got != "2 nodes, pool pages unknown" {
		t.Fatalf("Where = %q", got)
	}
}

func TestPlacementRejectsBadInput(t *testing.T) {
	if _, err := ReadPlacement("testdata/numa_maps_one_node", 0x1000, 0x2000); err == nil {
		t.Fatal("no mapping in range: no error")
	}
	for _, bad := range []string{
		"zzzz default N0=1\n",
		"1000 default N0=-4 kernelpagesize_kB=4\n",
		"1000 default N5000=1\n",
		"1000 default N0=1 kernelpagesize_kB=0\n",
	} {
		if p, err := ParsePlacement(strings.NewReader(bad), 0x1000, 0x2000); err == nil {
			t.Errorf("%q parsed as %+v", bad, p)
		}
	}
}

// This process's own numa_maps holds the mapping of a live allocation.
func TestPlacementOfThisProcess(t *testing.T) {
	p, err := ReadPlacement("", 0, ^uintptr(0))
	if err != nil || p.Resident() == 0 || p.PageSize == 0 {
		t.Fatalf("placement of the whole process %+v, %v", p, err)
	}
}
