package reliability

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/tests/harness"
	"kvdock/tests/harness/attackkit"
)

// Files under an fs tier's base_path are outside input (DESIGN "Trust"):
// these tests plant, on the real binary, what a local process that can
// write there could.

// fsHostileArgs are the flags of a server with one fs tier in dir.
func fsHostileArgs(t *testing.T, dir string, capacityGB int) []string {
	return []string{"--chunk-size", "16", "--l2-adapter",
		tierAdapter(t, map[string]any{"type": "fs", "base_path": dir, "max_capacity_gb": capacityGB})}
}

// fsHostileStored stores n one-chunk prompts (seeds 0..n-1) through a
// server on dir, waits for the tier to write them, stops the server and
// returns the chunk files.
func fsHostileStored(t *testing.T, dir, model string, n, capacityGB int) []string {
	t.Helper()
	a := harness.Start(t, fsHostileArgs(t, dir, capacityGB)...)
	w := tierWorker(t, a, 1, model, harness.WorkerHidden)
	for seed := range n {
		storePrompt(t, w, seed, 1)
	}
	waitTierIdle(t, a)
	a.Stop(t)
	files := chunkFiles(t, dir)
	if len(files) != n {
		t.Fatalf("%d chunk files, want %d", len(files), n)
	}
	return files
}

// TestHostileFSFIFOChunkFiles: nine of twelve chunk files are replaced by
// FIFOs while kvdock runs (after its start indexed them). Each lookup of
// their prompts is a miss at once (counted corrupt, the FIFO removed), the
// three intact prompts still hit with their bytes, again from the tier
// after the L1 pool is cleared, and SIGTERM ends with exit 0 within the
// harness's 5 s. A load that opened a FIFO would wait its 2 s load timeout
// and then stay blocked, holding its load slot and an L1 slot for good, so
// that intact prompts missed too and SIGTERM could not finish.
func TestHostileFSFIFOChunkFiles(t *testing.T) {
	const prompts, fifos = 12, 9
	dir := t.TempDir()
	files := fsHostileStored(t, dir, "fs-fifo", prompts, 1)
	b := harness.Start(t, fsHostileArgs(t, dir, 1)...)
	w := tierWorker(t, b, 1, "fs-fifo", harness.WorkerHidden)
	for _, f := range files[:fifos] {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mkfifo(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var slowest time.Duration
	good, wrong := 0, 0
	for seed := range prompts {
		start := time.Now()
		g, bad := checkPrompt(t, w, seed, 1)
		slowest = max(slowest, time.Since(start))
		good += g
		wrong += bad
	}
	// Again from the tier alone: the intact chunks load, nothing is left
	// holding the load slots.
	attackkit.PostClear(t, b)
	again := 0
	for seed := range prompts {
		g, bad := checkPrompt(t, w, seed, 1)
		again += g
		wrong += bad
	}
	ts := tier0(t, b)
	start := time.Now()
	b.Stop(t) // SIGTERM: exit 0 within 5 s, or the test fails
	t.Logf("%d FIFOs: %d good, %d wrong of %d prompts, %d good after a clear; slowest first lookup %v; corrupt %d, load timeouts %d; stop took %v",
		fifos, good, wrong, prompts, again, slowest, ts.Corrupt, ts.LoadTimeouts, time.Since(start))
	if wrong != 0 {
		t.Fatalf("%d wrong chunks served", wrong)
	}
	if good != prompts-fifos || again != prompts-fifos {
		t.Errorf("%d intact prompts hit, %d after a clear; want %d", good, again, prompts-fifos)
	}
	if slowest > time.Second {
		t.Errorf("slowest lookup took %v (load timeout 2 s)", slowest)
	}
	if ts.Corrupt != fifos {
		t.Errorf("corrupt %d, want %d", ts.Corrupt, fifos)
	}
	for _, f := range files[:fifos] {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("FIFO %s left in the tier (%v)", f, err)
		}
	}
}

// fsHostileHeaderEnd is the length of the tier value header at v's start.
func fsHostileHeaderEnd(v []byte) int {
	p := 10 + int(binary.LittleEndian.Uint32(v[6:]))
	p += 1 + 8*int(v[p])
	return p + 1 + int(v[p]) + 8 + 4
}

// TestHostileFSBigSparseChunkFiles: before a start, four of six 4 KiB
// chunk files become 512 MiB sparse files: two with zeros appended, two
// with a forged header whose payload length accounts for the whole file.
// Looking up the six prompts reads none of them past its header: the peak
// RSS grows by a few MiB, the tier reads a few chunks' bytes, the two
// intact prompts hit: no planted file is read whole for its 4 KiB chunk.
func TestHostileFSBigSparseChunkFiles(t *testing.T) {
	const big = 512 << 20
	dir := t.TempDir()
	files := fsHostileStored(t, dir, "fs-sparse", 6, 4)
	for i, f := range files[:4] {
		v, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if i >= 2 {
			h := fsHostileHeaderEnd(v)
			binary.LittleEndian.PutUint64(v[h-12:], uint64(big-h))
			v = v[:h]
		}
		if err := os.WriteFile(f, v, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, big); err != nil {
			t.Fatal(err)
		}
	}
	b := harness.Start(t, fsHostileArgs(t, dir, 4)...)
	w := tierWorker(t, b, 1, "fs-sparse", harness.WorkerHidden)
	good, wrong := 0, 0
	base, peak := attackkit.PeakGrowth(t, b.PID(), func() {
		for seed := range 6 {
			g, bad := checkPrompt(t, w, seed, 1)
			good += g
			wrong += bad
		}
	})
	ts := tier0(t, b)
	t.Logf("read_bytes %d, corrupt %d, %d good, %d wrong", ts.ReadBytes, ts.Corrupt, good, wrong)
	attackkit.CheckBound(t, "lookups of 4 KiB chunks planted as 512 MiB sparse files", base, peak, 32<<10, 4*big)
	if wrong != 0 {
		t.Fatalf("%d wrong chunks served", wrong)
	}
	if good != 2 {
		t.Errorf("%d intact prompts hit, want 2", good)
	}
	if ts.Corrupt != 4 {
		t.Errorf("corrupt %d, want 4", ts.Corrupt)
	}
	if limit := uint64(1 << 20); ts.ReadBytes > limit {
		t.Errorf("the tier read %d bytes for six 4 KiB chunks, bound %d", ts.ReadBytes, limit)
	}
	for _, f := range files[:4] {
		if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("planted file %s left in the tier (%v)", f, err)
		}
	}
}
