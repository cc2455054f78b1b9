package l1

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"kvdock/core/keys"
)

// benchKeys are keys [from, to) of a benchmark model.
func benchKeys(from, to int) []keys.ObjectKey {
	ks := keyRange(from, to)
	for i := range ks {
		ks[i].Model = keys.BenchModelPrefix + ks[i].Model
	}
	return ks
}

// TestHostileBenchNeverEvictsAnotherModel: under every policy, benchmark
// batches stored without pause into a pool that real objects half fill
// evict only benchmark objects (on demand and in the eviction loop), a
// batch past the room below the watermark is refused with ErrBenchRoom,
// and every real object is still there; a real batch that needs room takes
// it from the benchmark first.
func TestHostileBenchNeverEvictsAnotherModel(t *testing.T) {
	for _, policy := range []string{PolicyLRU, PolicyPrefix} {
		t.Run(policy, func(t *testing.T) {
			p, _ := newPool(t, 100, func(o *Options) { o.Policy = policy })
			real := keyRange(0, 50)
			store(t, p, real, 4096)
			for round := range 40 {
				ks := benchKeys(1000+round*4, 1000+round*4+4)
				res, err := p.ReserveWrite(InstanceOwner(2), ks, 4096)
				if err != nil {
					t.Fatalf("round %d: a 4-object benchmark batch with 30 objects of room: %v", round, err)
				}
				p.FinishWrite(res)
				p.Maintain()
			}
			for _, k := range real {
				if !present(p, k) {
					t.Fatalf("%v was evicted by benchmark traffic", k)
				}
			}
			st := p.Stats()
			if st.UsedBytes > int64(0.8*float64(st.Size)) || st.BenchBytes == 0 {
				t.Fatalf("used %d of %d with %d benchmark bytes: above the watermark", st.UsedBytes, st.Size, st.BenchBytes)
			}
			// 31 objects: more than the 30 below the watermark.
			if _, err := p.ReserveWrite(InstanceOwner(2), benchKeys(5000, 5031), 4096); !errors.Is(err, ErrBenchRoom) || !errors.Is(err, ErrNoSpace) {
				t.Fatalf("a benchmark batch past its room: %v, want ErrBenchRoom", err)
			}
			// A real batch larger than the free space: the benchmark pays.
			more := keyRange(100, 140)
			store(t, p, more, 4096)
			for _, k := range append(real, more...) {
				if !present(p, k) {
					t.Fatalf("%v evicted while benchmark objects were left to evict", k)
				}
			}
			if st := p.Stats(); st.BenchRefusals != 1 {
				t.Fatalf("bench refusals %d, want 1", st.BenchRefusals)
			}
		})
	}
}

// TestBenchRoomSaysWhy: the refusal names the room and who holds the rest.
func TestBenchRoomSaysWhy(t *testing.T) {
	p, _ := newPool(t, 10, nil)
	store(t, p, keyRange(0, 8), 4096)
	_, err := p.ReserveWrite(InstanceOwner(2), benchKeys(100, 101), 4096)
	want := fmt.Sprintf("other models use %d of the %d bytes below the eviction watermark", 8*4096, 8*4096)
	if err == nil || !errors.Is(err, ErrBenchRoom) || !strings.Contains(err.Error(), want) {
		t.Fatalf("err %v, want ErrBenchRoom saying %q", err, want)
	}
}
