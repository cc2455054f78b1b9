package tier_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/layout"
	"kvdock/core/testkit/testpool"
	"kvdock/transfer/tier"
	"kvdock/transfer/tier/fs"
	"kvdock/transfer/tier/memtier"
)

// openFS opens a real fs tier (a PartsPutter: the writers stream chunks to
// it straight from L1) in a fresh directory.
func openFS(t *testing.T) (*fs.Tier, string) {
	t.Helper()
	base := filepath.Join(t.TempDir(), "l2")
	ft, err := fs.Open(fs.FSConfig{BasePath: base, CapacityBytes: 64 << 20, RecoverOnStart: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ft, base
}

// refill overwrites free slots of p with 0xEE bytes under the keys
// testKey(from) to testKey(to): a slot freed under a writer would now hold
// other bytes.
func refill(p *l1.Pool, lay layout.Layout, from, to int) {
	for i := from; i <= to; i++ {
		res, err := p.ReserveWrite(l1.InstanceOwner(2), []keys.ObjectKey{testKey(i)}, lay.Bytes)
		if err != nil || len(res) == 0 {
			continue
		}
		dst, release := p.View(res[0].Offset, res[0].Length)
		for j := range dst {
			dst[j] = 0xEE
		}
		release()
		p.FinishWrite(res)
	}
}

func tempLeft(t *testing.T, base string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(d.Name(), ".kvdock-tmp-") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestWriteBehindPartsStreamPublishedBytes: a backend that takes a value in
// parts gets the chunk straight from its L1 bytes, held for the write: a
// Clear and a refill of the pool meanwhile change nothing it writes, and
// the hold ends with the write.
func TestWriteBehindPartsStreamPublishedBytes(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 4*lay.Bytes)
	ft, _ := openFS(t)
	s := tier.NewSet([]tier.Backend{ft}, p, fakeLayouts{lay}, tier.Options{WorkersPerTier: 1})
	want := payload(int(lay.Bytes), 7)
	store(t, p, testKey(0), want)
	var once sync.Once
	tier.SetBeforeCopy(s, func(keys.ObjectKey) {
		once.Do(func() {
			p.Clear()
			refill(p, lay, 100, 107)
		})
	})
	runSet(t, s)
	s.Enqueue([]keys.ObjectKey{testKey(0)}, lay)
	if q := waitQueue(t, s, 0); q.Written != 1 {
		t.Fatalf("queue %+v, want 1 written", q)
	}
	name := tier.Key(testKey(0), lay)
	v, err := ft.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tier.Verify(v, name, lay)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("tier holds other bytes than the published chunk (err %v)", err)
	}
	if st := p.Stats(); st.Doomed != 0 || st.LockedBytes != 0 {
		t.Fatalf("the hold outlived the write: %+v", st)
	}
}

// TestWriteBehindPartsDiscardedWhenHoldEnds: a streamed write whose L1 hold
// ended before it finished (its read TTL passed, a Clear dropped the object
// and its slot was written again) is discarded, never published: its bytes
// may be another object's, checksum and all.
func TestWriteBehindPartsDiscardedWhenHoldEnds(t *testing.T) {
	lay := testLayout(t)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	p := testpool.Anon(t, 4*lay.Bytes, func(o *l1.Options) {
		o.ReadTTL = 10 * time.Second
		o.Now = func() time.Time { return time.Unix(0, now.Load()) }
	})
	ft, base := openFS(t)
	s := tier.NewSet([]tier.Backend{ft}, p, fakeLayouts{lay}, tier.Options{WorkersPerTier: 1})
	store(t, p, testKey(0), payload(int(lay.Bytes), 7))
	var once sync.Once
	tier.SetBeforeCopy(s, func(keys.ObjectKey) {
		once.Do(func() {
			now.Add(int64(11 * time.Second)) // the writer's hold expires
			p.Clear()                        // and its object goes with it
			refill(p, lay, 100, 107)         // and its slot holds other bytes
		})
	})
	runSet(t, s)
	s.Enqueue([]keys.ObjectKey{testKey(0)}, lay)
	if q := waitQueue(t, s, 0); q.Written != 0 || q.Skipped != 1 {
		t.Fatalf("queue %+v, want the write skipped", q)
	}
	if v, err := ft.Get(context.Background(), tier.Key(testKey(0), lay)); err == nil {
		t.Fatalf("a write whose hold ended was published (%d bytes)", len(v))
	}
	if left := tempLeft(t, base); len(left) != 0 {
		t.Fatalf("discarded write left %v", left)
	}
}

// niceProbe is a backend that streams from L1 (a PartsPutter) and records
// the nice value of the thread its writes run on.
type niceProbe struct {
	*memtier.Tier
	nice chan int
}

func (n niceProbe) PutParts(ctx context.Context, key string, head, payload []byte, valid func() bool, _ func()) error {
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err == nil {
		n.nice <- 20 - prio
	}
	if !valid() {
		return tier.ErrSourceChanged
	}
	return n.Tier.Put(ctx, key, append(append([]byte(nil), head...), payload...))
}

// TestWritersRunAtLowerPriority: the write-behind writers of a backend
// that streams from L1 run on threads niced below the process's, so on a
// busy machine the kernel serves the request path first.
func TestWritersRunAtLowerPriority(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, unix.Gettid())
	if err != nil {
		t.Fatal(err)
	}
	mine := 20 - prio
	if mine >= 19 {
		t.Skipf("the test already runs at nice %d: nothing lower to see", mine)
	}
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	probe := niceProbe{memtier.New(), make(chan int, 1)}
	s := newSet(t, p, lay, tier.Options{WorkersPerTier: 1}, probe)
	store(t, p, testKey(0), payload(int(lay.Bytes), 0))
	s.Enqueue([]keys.ObjectKey{testKey(0)}, lay)
	select {
	case got := <-probe.nice:
		if got <= mine {
			t.Fatalf("writer thread at nice %d, the process at %d", got, mine)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer never wrote")
	}
}

// TestPrefetchIntoL1FromFS: the fs tier reads a chunk straight into its
// reserved L1 slot; the slot is published only once the header and the
// checksum over the slot pass. A damaged value (a flipped payload byte,
// garbage of another length) is a miss, counted and deleted, and its slot
// never becomes readable; an intact value of another layout (the same
// length or another) is rejected and kept.
func TestPrefetchIntoL1FromFS(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	ft, _ := openFS(t)
	s := newSet(t, p, lay, tier.Options{}, ft)
	ctx := context.Background()
	var ks []keys.ObjectKey
	for i := range 6 {
		k, v := encoded(t, lay, i)
		switch i {
		case 1: // a flipped payload byte
			v[len(v)-3] ^= 0xFF
		case 3: // another layout, a value of the same length (read in place)
			other, _ := layout.New(4, 2, 8, "float16", false)
			if other.Bytes != lay.Bytes {
				t.Fatalf("test layouts: %d vs %d bytes", other.Bytes, lay.Bytes)
			}
			v, _ = tier.Encode(tier.Key(k, lay), other, payload(int(other.Bytes), i))
		case 4: // another layout, a value of another length (read whole)
			other, _ := layout.New(2, 4, 16, "float16", false)
			v, _ = tier.Encode(tier.Key(k, lay), other, payload(int(other.Bytes), i))
		case 5: // not a value at all, another length
			v = payload(100, i)
		}
		if err := ft.Put(ctx, tier.Key(k, lay), v); err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	if n := s.Prefetch(ctx, "m", 1, ks, 1, 1); n != 1 {
		t.Fatalf("prefetched %d, want 1 (chunk 1 is damaged)", n)
	}
	if got := read(t, p, ks[0]); !bytes.Equal(got, payload(int(lay.Bytes), 0)) {
		t.Fatal("chunk 0: L1 bytes differ from the tier's")
	}
	// Loaded after the damaged chunk: in L1, unlocked.
	if p.ReserveReadPrefix(ks[2:3], 1) != 1 {
		t.Fatal("chunk 2 not in L1")
	}
	if got := read(t, p, ks[2]); !bytes.Equal(got, payload(int(lay.Bytes), 2)) {
		t.Fatal("chunk 2: L1 bytes differ from the tier's")
	}
	st := s.Stats()[0]
	if st.Corrupt != 4 || st.Hits != 2 || st.Loads != 2 {
		t.Fatalf("corrupt %d hits %d loads %d, want 4, 2, 2: %+v", st.Corrupt, st.Hits, st.Loads, st)
	}
	for _, i := range []int{1, 3, 4, 5} {
		if p.ReserveReadPrefix(ks[i:i+1], 1) != 0 {
			t.Fatalf("rejected chunk %d reached L1", i)
		}
	}
	if ps := p.Stats(); ps.WriteLocked != 0 {
		t.Fatalf("a rejected load left its reservation: %+v", ps)
	}
	for i, kept := range map[int]bool{1: false, 3: true, 4: true, 5: false} {
		_, err := ft.Get(ctx, tier.Key(ks[i], lay))
		if (err == nil) != kept {
			t.Errorf("chunk %d: present %v, want %v (%v)", i, err == nil, kept, err)
		}
	}
}

// TestPrefetchIntoL1ChecksEveryPiece: a chunk read from fs in several
// pieces is checksummed piece by piece as it arrives; a byte flipped in a
// middle piece, or in the last one, is still caught, and an intact chunk
// of the same size loads.
func TestPrefetchIntoL1ChecksEveryPiece(t *testing.T) {
	lay, err := layout.New(4, 64, 2560, "float32", false) // 2*4*64*2560*4 = 5 MiB: five pieces
	if err != nil {
		t.Fatal(err)
	}
	p := openPool(t, 32<<20)
	ft, _ := openFS(t)
	s := newSet(t, p, lay, tier.Options{}, ft)
	ctx := context.Background()
	var ks []keys.ObjectKey
	for i := range 3 {
		k, v := encoded(t, lay, i)
		switch i {
		case 1: // in the third MiB of the payload
			v[len(v)-int(lay.Bytes)+5<<19] ^= 0x01
		case 2: // the payload's last byte
			v[len(v)-1] ^= 0x80
		}
		if err := ft.Put(ctx, tier.Key(k, lay), v); err != nil {
			t.Fatal(err)
		}
		ks = append(ks, k)
	}
	if n := s.Prefetch(ctx, "m", 1, ks[:1], 1, 1); n != 1 {
		t.Fatalf("the intact chunk: prefetched %d, want 1", n)
	}
	if got := read(t, p, ks[0]); !bytes.Equal(got, payload(int(lay.Bytes), 0)) {
		t.Fatal("chunk 0: L1 bytes differ from the tier's")
	}
	for i := 1; i < 3; i++ {
		if n := s.Prefetch(ctx, "m", 1, ks[i:i+1], 1, 1); n != 0 {
			t.Fatalf("damaged chunk %d prefetched", i)
		}
		if p.ReserveReadPrefix(ks[i:i+1], 1) != 0 {
			t.Fatalf("damaged chunk %d reached L1", i)
		}
	}
	if st := s.Stats()[0]; st.Corrupt != 2 || st.Loads != 1 {
		t.Fatalf("corrupt %d loads %d, want 2 and 1: %+v", st.Corrupt, st.Loads, st)
	}
}

// straysPieces is a memtier that reads into place (tier.ReaderInto) but
// reports pieces of its own intact copy while the bytes it leaves in the
// slot have a flipped byte: a backend that breaks GetInto's contract.
type straysPieces struct{ *memtier.Tier }

func (b straysPieces) GetInto(ctx context.Context, key string, head, payload []byte, each func([]byte)) error {
	v, err := b.Get(ctx, key)
	if err != nil {
		return err
	}
	if len(v) != len(head)+len(payload) {
		return tier.ErrSizeMismatch
	}
	copy(head, v)
	copy(payload, v[len(head):])
	intact := bytes.Clone(payload)
	payload[len(payload)/2] ^= 0x01
	each(intact)
	return nil
}

// TestPrefetchChecksumCoversTheSlot: the checksum taken while a chunk is
// read only counts pieces that are the slot's own bytes; a backend that
// reports other memory gets the whole slot checked, and the damaged chunk
// is rejected.
func TestPrefetchChecksumCoversTheSlot(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	mt := memtier.New()
	s := newSet(t, p, lay, tier.Options{}, straysPieces{mt})
	ks := putTier(t, mt, lay, 0, 1)
	if n := s.Prefetch(context.Background(), "m", 1, ks, 1, 1); n != 0 {
		t.Fatal("a chunk whose slot differs from the pieces summed was served")
	}
	if p.ReserveReadPrefix(ks, 1) != 0 {
		t.Fatal("the damaged chunk reached L1")
	}
}

// TestKnownAbsent: the set knows a chunk absent only when every tier knows
// it from memory (fs: its index); a tier that cannot tell (memtier) or that
// holds the chunk makes it ask.
func TestKnownAbsent(t *testing.T) {
	lay := testLayout(t)
	p := openPool(t, 1<<20)
	ft, _ := openFS(t)
	v, err := tier.Encode(tier.Key(testKey(0), lay), lay, payload(int(lay.Bytes), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := ft.Put(context.Background(), tier.Key(testKey(0), lay), v); err != nil {
		t.Fatal(err)
	}
	s := newSet(t, p, lay, tier.Options{}, ft)
	if s.KnownAbsent("m", 1, []keys.ObjectKey{testKey(0), testKey(1)}, 1) {
		t.Fatal("a chunk the fs tier holds is known absent")
	}
	if !s.KnownAbsent("m", 1, []keys.ObjectKey{testKey(1), testKey(0)}, 1) {
		t.Fatal("a chunk missing from the fs index is not known absent")
	}
	both := newSet(t, p, lay, tier.Options{}, ft, memtier.New())
	if both.KnownAbsent("m", 1, []keys.ObjectKey{testKey(1)}, 1) {
		t.Fatal("known absent although a tier that cannot tell was not asked")
	}
}
