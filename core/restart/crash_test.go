package restart_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"kvdock/core/keys"
	"kvdock/core/l1"
	"kvdock/core/l1/segment"
	"kvdock/core/restart"
	"kvdock/core/testkit/fakeclock"
)

// heldRange is a reservation handed to a worker that never committed: its
// bytes are the worker's until until.
type heldRange struct {
	off   int64
	until time.Time
}

// crashRun is one process's life in the model: a pool, what the model says
// every published key holds, and the reservations handed out and never
// committed (their bytes belong to their worker until the TTL).
type crashRun struct {
	pool  *l1.Pool
	want  map[keys.ObjectKey][]byte
	held  []heldRange
	stamp byte
	now   func() time.Time
}

func crashKey(i int) keys.ObjectKey {
	var h keys.Hash
	binary.LittleEndian.PutUint64(h[:], uint64(i))
	return keys.ObjectKey{Chunk: h, Model: "m", KVRank: keys.KVRank(1, 0), Salt: string(rune('a' + i%3))}
}

// ops runs n random store, abandon, read and evict operations.
func (r *crashRun) ops(t *testing.T, rng *rand.Rand, n int) {
	for range n {
		k := crashKey(rng.IntN(48))
		switch op := rng.IntN(10); {
		case op < 6: // a store that commits
			size := int64(1 + rng.IntN(9000))
			res, err := r.pool.ReserveWrite(l1.InstanceOwner(1), []keys.ObjectKey{k}, size)
			if err != nil || len(res) == 0 {
				continue
			}
			r.stamp++
			data := bytes.Repeat([]byte{r.stamp}, int(size))
			v, done := r.pool.View(res[0].Offset, size)
			copy(v, data)
			done()
			if r.pool.FinishWrite(res) {
				r.want[k] = data
			}
		case op < 8: // a store handed out and never committed; the worker scribbles
			res, err := r.pool.ReserveWrite(l1.InstanceOwner(2), []keys.ObjectKey{k}, 4096)
			if err != nil || len(res) == 0 {
				continue
			}
			v, done := r.pool.View(res[0].Offset, 4096)
			for i := range v {
				v[i] = 0xEE
			}
			done()
			r.held = append(r.held, heldRange{res[0].Offset, r.now().Add(time.Minute)})
		default: // a read hold a worker keeps
			if r.pool.ReserveReadPrefix([]keys.ObjectKey{k}, 1) == 1 {
				r.pool.HoldRead(k)
			}
		}
	}
	// Evicted keys are gone from the model.
	for k := range r.want {
		if r.pool.ReserveReadPrefix([]keys.ObjectKey{k}, 1) == 0 {
			delete(r.want, k)
		} else {
			r.pool.FinishRead([]keys.ObjectKey{k}, 1)
		}
	}
}

// check counts the bytes of published keys that differ from the model;
// every key the pool serves must be one the model holds.
func (r *crashRun) check(t *testing.T) (wrong int) {
	for k, data := range r.want {
		if r.pool.ReserveReadPrefix([]keys.ObjectKey{k}, 1) != 1 {
			t.Fatalf("key %v lost by the adoption", k)
		}
		ref, ok := r.pool.HoldRead(k)
		if !ok {
			t.Fatal("hold")
		}
		v, done := r.pool.View(ref.Offset, ref.Length)
		if int64(len(data)) != ref.Length {
			wrong += len(data)
		} else {
			for i := range v {
				if v[i] != data[i] {
					wrong++
				}
			}
		}
		done()
		r.pool.ReleaseRead([]l1.ReadRef{ref})
	}
	for i := range 48 {
		k := crashKey(i)
		if _, ok := r.want[k]; !ok && r.pool.ReserveReadPrefix([]keys.ObjectKey{k}, 1) == 1 {
			t.Fatalf("key %d served but never published in the model", i)
		}
	}
	return wrong
}

// TestCrashPointsNeverAdoptAnUncleanRecord drives a pool through random
// stores, abandoned reservations and read holds, and stops it at 1,000+
// random crash points: a clean keep (the record adopted), a crash with no
// record (kill -9 during stores: nothing written), a record torn or
// corrupted at a random byte, a record whose body was rewritten with a
// valid checksum but overlapping or out-of-pool offsets, and a record kept
// for another inode. Every unclean record must be refused and the start be
// cold; every adoption must serve exactly the model's bytes, and held
// reservations' bytes are never handed to another store before their TTL.
func TestCrashPointsNeverAdoptAnUncleanRecord(t *testing.T) {
	dir, err := os.MkdirTemp(segment.DefaultDir, "kvdock-crash-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	clk := fakeclock.New()
	opts := l1.Options{Size: 32 * 4096, Align: 4096, Now: clk.Now, OwnerLockShare: 1, TotalLockShare: 1,
		Plan: l1.Decision{Segment: l1.SegmentPrefix + "crash"}, ShmDir: dir, WriteTTL: time.Minute, ReadTTL: time.Minute}
	rng := rand.New(rand.NewPCG(28, 1))
	open := func() *crashRun {
		p, err := l1.Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		return &crashRun{pool: p, want: map[keys.ObjectKey][]byte{}, now: clk.Now}
	}
	r := open()
	const points = 1200
	var adopted, refused, cold, wrongBytes int
	for point := range points {
		r.ops(t, rng, 1+rng.IntN(30))
		clk.Advance(time.Duration(rng.IntN(20)) * time.Second)
		kind := rng.IntN(6)
		if kind == 0 { // kill -9: the process dies, no record is written
			_ = r.pool.Close() // the kernel drops the mapping and the flock
			r = open()
			cold++
			continue
		}
		var data []byte
		if err := r.pool.Keep(func(k l1.Kept) error {
			rec := restart.Record{Build: "crash", Endpoint: "h:1", StoppedAt: clk.Now(), WrittenAt: clk.Now(), Pool: k}
			switch kind {
			case 3: // valid checksum, overlapping objects
				if len(k.Objects) > 1 {
					rec.Pool.Objects[1].Offset = rec.Pool.Objects[0].Offset
				} else {
					rec.Pool.Objects = append(rec.Pool.Objects, l1.KeptObject{Key: crashKey(99), Offset: 0, Length: 1},
						l1.KeptObject{Key: crashKey(98), Offset: 0, Length: 1})
				}
			case 4: // kept for another inode
				rec.Pool.Segment.Ino++
			}
			var err error
			data, err = restart.Encode(rec)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		clean := kind == 1 || kind == 5
		if kind == 2 { // torn or corrupted at a random byte
			if rng.IntN(2) == 0 {
				data = data[:rng.IntN(len(data))]
			} else {
				data[rng.IntN(len(data))] ^= byte(1 + rng.IntN(255))
			}
		}
		rec, derr := restart.Decode(data)
		var next *l1.Pool
		if derr == nil {
			var aerr error
			next, _, aerr = l1.Adopt(opts, rec.Pool)
			if aerr != nil && !errors.Is(aerr, l1.ErrNotAdoptable) {
				t.Fatalf("point %d: adopt: %v", point, aerr)
			}
		}
		if next != nil && !clean {
			t.Fatalf("point %d: an unclean record (kind %d) was adopted", point, kind)
		}
		if next == nil {
			if clean {
				t.Fatalf("point %d: a clean record was refused: %v", point, derr)
			}
			refused++
			_, _ = l1.RemoveKept(dir, rec.Pool.Segment)
			segment.CleanStale(dir, opts.Plan.Segment, nil)
			r = open()
			continue
		}
		adopted++
		r.pool = next
		wrongBytes += r.check(t)
		// Reservations of earlier processes keep their bytes until their TTL.
		live := r.held[:0]
		for _, h := range r.held {
			if h.until.After(clk.Now()) {
				live = append(live, h)
			}
		}
		r.held = live
		for range 8 {
			res, err := next.ReserveWrite(l1.InstanceOwner(3), []keys.ObjectKey{crashKey(200 + rng.IntN(100))}, 4096)
			if err != nil || len(res) == 0 {
				continue
			}
			for _, h := range r.held {
				if res[0].Offset == h.off {
					t.Fatalf("point %d: held bytes at %d handed to another store before their TTL", point, h.off)
				}
			}
			next.AbortWrite(res)
		}
	}
	_ = r.pool.Close()
	t.Logf("%d crash points: %d adoptions, %d unclean records refused, %d kill -9 cold starts; %d wrong bytes", points, adopted, refused, cold, wrongBytes)
	if wrongBytes != 0 {
		t.Fatalf("%d wrong bytes", wrongBytes)
	}
	if adopted < points/4 || refused < points/4 {
		t.Fatalf("the crash points do not exercise both outcomes: %d adopted, %d refused", adopted, refused)
	}
}

// TestHostileInvalidUTF8KeysAdoptedExactly: prompts stored under salts and
// model names with invalid UTF-8 are adopted under exactly those bytes:
// after Keep, Encode, Decode and Adopt each key reads its own bytes, and a
// reader whose salt JSON text would have made the same ("\ufffd\ufffd",
// "\xff\xff") misses.
func TestHostileInvalidUTF8KeysAdoptedExactly(t *testing.T) {
	dir, err := os.MkdirTemp(segment.DefaultDir, "kvdock-utf8-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	clk := fakeclock.New()
	opts := l1.Options{Size: 16 * 4096, Align: 4096, Now: clk.Now, OwnerLockShare: 1, TotalLockShare: 1,
		Plan: l1.Decision{Segment: l1.SegmentPrefix + "recutf8"}, ShmDir: dir, WriteTTL: time.Minute, ReadTTL: time.Minute}
	p, err := l1.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	key := func(model, salt string) keys.ObjectKey {
		return keys.ObjectKey{Model: model, Salt: salt, KVRank: keys.KVRank(1, 0)}
	}
	stored := []keys.ObjectKey{key("m", "\xff\xfe"), key("m", "\xfe\xff"), key("m\xff", ""), key("m\xfe", "")}
	for i, k := range stored {
		res, err := p.ReserveWrite(l1.InstanceOwner(1), []keys.ObjectKey{k}, 4096)
		if err != nil {
			t.Fatal(err)
		}
		v, done := p.View(res[0].Offset, 4096)
		copy(v, bytes.Repeat([]byte{byte(i + 1)}, 4096))
		done()
		if !p.FinishWrite(res) {
			t.Fatal("finish")
		}
	}
	var data []byte
	if err := p.Keep(func(k l1.Kept) error {
		data, err = restart.Encode(restart.Record{Build: "utf8", Endpoint: "h:1", StoppedAt: clk.Now(), WrittenAt: clk.Now(), Pool: k})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rec, err := restart.Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	q, ad, err := l1.Adopt(opts, rec.Pool)
	if err != nil {
		t.Fatalf("adopt: %v", err)
	}
	defer q.Close()
	if ad.Objects != len(stored) || ad.Dropped.N != 0 {
		t.Fatalf("adopted %+v, want all %d keys", ad, len(stored))
	}
	for i, k := range stored {
		if q.ReserveReadPrefix([]keys.ObjectKey{k}, 1) != 1 {
			t.Fatalf("key %q/%q not readable after the restart", k.Model, k.Salt)
		}
		ref, _ := q.HoldRead(k)
		v, done := q.View(ref.Offset, ref.Length)
		if !bytes.Equal(v, bytes.Repeat([]byte{byte(i + 1)}, 4096)) {
			t.Fatalf("key %q/%q reads another key's bytes", k.Model, k.Salt)
		}
		done()
		q.ReleaseRead([]l1.ReadRef{ref})
	}
	for _, k := range []keys.ObjectKey{key("m", "\ufffd\ufffd"), key("m", "\xff\xff"), key("m\ufffd", "")} {
		if q.ReserveReadPrefix([]keys.ObjectKey{k}, 1) != 0 {
			t.Fatalf("key %q/%q, never stored, is served after the restart", k.Model, k.Salt)
		}
	}
}
