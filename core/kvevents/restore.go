package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"kvdock/core/keys"
)

// A restart that adopts the pool starts a new stream (seq 0, which llm-d
// takes as a reset of the pod), so the new process re-announces the
// adopted usable set before any new event. What the pool keeps has no
// tokens, so the stopping process writes the descriptions of its chunks
// (DescribeTo: those of L1 and of the tiers' media) beside the restart
// record, with the objects each tier held for it, and the adopting one
// re-announces the chunks it adopted whole (Reannounce). The tiers'
// values are adopted apart (the tier set asks each tier whether it still
// holds each object carried for it); as each tier says it does, the
// object counts for its medium with the carried description (Tiers.Stored),
// so the tiers' usable sets are re-announced too, parents first.
//
// The description is outside input when read back: each chunk's hash must
// be the hash chain of its parent and tokens, so nothing but the tokens
// that name an adopted chunk can be announced for it; a tier object is
// kept only for a chunk described; a part that fails its checks is left
// out alone.

const describeMagic = "kvdock kv events 3\n"

// describeHead is the header after the magic: the stamp, the chunk size
// and the poll log's next seq.
const describeHead = 8 + 4 + 8

// The records that follow the header, each led by its tag: a chunk's
// description, or an object a tier held.
const (
	tagChunk = 'c'
	tagTier  = 't'
)

// MaxTiers bounds the tier index of a tier object carried.
const MaxTiers = 64

// maxLogSeq bounds the poll log's seq a description may carry on.
const maxLogSeq = 1 << 62

// MaxDescribeBytes bounds a description, written and read: past it the
// chunks left out are counted and not re-announced.
const MaxDescribeBytes = 1 << 30

// describePiece is how many bytes of a description DescribeTo gathers
// before it writes them: tens of MiB for a large pool are never held
// whole (a buffer that size would be fresh memory, and a copy, in the
// restart's gap).
const describePiece = 256 << 10

// DescribeTo writes to w the description of the chunks a commit
// described (tokens, parent, world size) that L1 or a tier's medium holds,
// and of the objects tier i held (tiers[i], as the tier set tells them),
// headed by stamp (which names the handover: Reannounce refuses another),
// at most maxBytes long, in pieces of describePiece bytes. It returns how
// many records did not fit, and the first error of w (it stops there).
func (t *Tracker) DescribeTo(w io.Writer, stamp int64, maxBytes int, tiers [][]keys.ObjectKey) (left int, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applyLocked()
	b := make([]byte, 0, describePiece+describePiece/4)
	off := 0 // bytes written to w
	flush := func() bool {
		if len(b) < describePiece {
			return true
		}
		if _, err = w.Write(b); err != nil {
			return false
		}
		off, b = off+len(b), b[:0]
		return true
	}
	b = append(append(b, describeMagic...), make([]byte, describeHead)...)
	binary.BigEndian.PutUint64(b[len(describeMagic):], uint64(stamp))
	binary.BigEndian.PutUint32(b[len(describeMagic)+8:], uint32(t.opt.BlockSize))
	if t.opt.Log != nil {
		binary.BigEndian.PutUint64(b[len(describeMagic)+12:], t.opt.Log.next())
	}
	written := map[ekey]bool{}
	for _, m := range t.media() {
		for ek, n := range m.nodes {
			if n.ws == 0 || written[ek] {
				continue
			}
			var ok bool
			if b, ok = appendChunk(b, ek, n, maxBytes-off); !ok {
				left++
				continue
			}
			written[ek] = true
			if !flush() {
				return left, err
			}
		}
	}
	for i, ks := range tiers {
		for j := range ks {
			k := &ks[j]
			size := tierRecordSize(k)
			if !written[keyOf(k)] {
				continue // of a chunk never described (never announced): nothing to carry
			}
			if i >= MaxTiers || off+len(b)+size > maxBytes {
				left++
				continue
			}
			b = append(b, tagTier, byte(i))
			b = appendStr(b, k.Model)
			b = appendStr(b, k.Salt)
			b = append(b, k.Chunk[:]...)
			b = binary.BigEndian.AppendUint32(b, k.KVRank)
			b = binary.BigEndian.AppendUint32(b, k.Group)
			b = binary.BigEndian.AppendUint64(b, k.Layout)
			if !flush() {
				return left, err
			}
		}
	}
	if len(b) > 0 {
		_, err = w.Write(b)
	}
	return left, err
}

func appendStr(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// chunkRecordSize is the bytes of the record of ek's description.
func chunkRecordSize(ek ekey, n *node) int {
	return 1 + 2 + len(ek.model) + 2 + len(ek.salt) + 32 + 1 + 32 + 4 + 4*len(n.tokens)
}

// tierRecordSize is the bytes of the record of tier object k.
func tierRecordSize(k *keys.ObjectKey) int {
	return 1 + 1 + 2 + len(k.Model) + 2 + len(k.Salt) + 32 + 4 + 4 + 8
}

// appendChunk appends the record of ek's description, unless a name is
// too long for it or it would take b past maxBytes.
func appendChunk(b []byte, ek ekey, n *node, maxBytes int) ([]byte, bool) {
	size := chunkRecordSize(ek, n)
	if len(ek.model) > 0xffff || len(ek.salt) > 0xffff || len(b)+size > maxBytes {
		return b, false
	}
	b = append(b, tagChunk)
	b = appendStr(b, ek.model)
	b = appendStr(b, ek.salt)
	b = append(b, ek.h[:]...)
	if n.hasParent {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = append(b, n.parent[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(n.ws))
	for _, tk := range n.tokens {
		b = binary.BigEndian.AppendUint32(b, tk)
	}
	return b, true
}

// Reannounced says what Reannounce did.
type Reannounced struct {
	Chunks    int // chunks announced (whole, parents adopted)
	Described int // chunk descriptions accepted
	Dropped   int // records left out: a hash that is not its chain, a world size out of range, a tier object of no chunk described, a part cut short
	// TierObjects counts the tier objects carried, which Tiers lists by
	// tier index: for the tier set to adopt (each tier tells which it
	// still holds), their chunks' descriptions kept until the tier set is
	// replaced.
	TierObjects int
	Tiers       [][]keys.ObjectKey
}

// ErrDescription is wrapped by Reannounce for a description it refuses whole.
var ErrDescription = errors.New("kv events description refused")

type described struct {
	ws        int
	parent    keys.Hash
	hasParent bool
	tokens    []uint32
}

// Reannounce re-announces what an adoption kept: data is the description
// the stopping process wrote (DescribeTo with stamp), published the adopted
// objects that were readable when kept, which the pool's adoption told
// the tracker of (Stored; a carried write reservation too, announced once
// its commit comes), and unreadable tells which of up to 64 keys are not
// readable now (l1.Pool.Unreadable): asked after the objects are marked,
// so that whatever left the pool meanwhile goes. Its events lead the
// stream, parents first: call it before the new process serves, or while
// it serves between Hold and Release.
func (t *Tracker) Reannounce(data []byte, stamp int64, published []keys.ObjectKey, unreadable func([]keys.ObjectKey) uint64) (Reannounced, error) {
	var r Reannounced
	desc, logNext, err := t.parse(data, stamp, &r)
	if err != nil {
		return r, err
	}
	if t.opt.Log != nil {
		// The re-announcement leads the new log under seqs past every
		// cursor the old one issued: a poller's cursor is then older
		// than the oldest record, so it is told lost and reads the
		// re-announced chunks from the first (a new log from seq 1 would
		// answer its cursor as one in the future, with the newest seq,
		// and it would skip them).
		t.opt.Log.continueFrom(logNext)
	}
	t.mu.Lock()
	t.applyLocked()
	m := t.l1
	if len(r.Tiers) > 0 && len(t.tiers) > 0 {
		t.carried = make(map[ekey]described, r.TierObjects)
		for _, ks := range r.Tiers {
			for i := range ks {
				ek := keyOf(&ks[i])
				t.carried[ek] = desc[ek]
			}
		}
	}
	for i := range published {
		k := &published[i]
		ek := keyOf(k)
		d, ok := desc[ek]
		if !ok || keys.IsBenchModel(k.Model) {
			continue
		}
		n := m.nodes[ek]
		if n == nil {
			continue // lost since the adoption told it
		}
		if n.ws == 0 {
			m.describe(ek, n, d.ws, d.parent, d.hasParent, d.tokens)
		}
		j := n.find(k)
		if j < 0 {
			continue
		}
		was := t.whole(ek.model, n)
		n.objs[j].committed = true
		t.rewhole(m, ek, n, was)
	}
	t.mu.Unlock()
	// What left the pool since it was kept (expired, evicted) goes now,
	// ahead of the data path's ops (while held, they wait behind it).
	var gone []*keys.ObjectKey
	for i := 0; i < len(published); i += 64 {
		ks := published[i:min(i+64, len(published))]
		bits := unreadable(ks)
		for j := range ks {
			if bits&(1<<j) != 0 {
				gone = append(gone, &ks[j])
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applyLocked()
	for _, k := range gone {
		ek := keyOf(k)
		if n := m.nodes[ek]; n != nil {
			t.lostLocked(m, ek, n, k)
		}
	}
	for ek := range m.nodes {
		t.tryAnnounce(m, ek)
	}
	r.Chunks = m.announced
	return r, nil
}

// parse reads a description: the header whole (magic, stamp, block size)
// or nothing, then each chunk on its own.
func (t *Tracker) parse(data []byte, stamp int64, r *Reannounced) (map[ekey]described, uint64, error) {
	h := len(describeMagic)
	if len(data) > MaxDescribeBytes {
		return nil, 0, fmt.Errorf("%w: %d bytes, more than %d", ErrDescription, len(data), MaxDescribeBytes)
	}
	if len(data) < h+describeHead || !bytes.Equal(data[:h], []byte(describeMagic)) {
		return nil, 0, fmt.Errorf("%w: not a description", ErrDescription)
	}
	if got := int64(binary.BigEndian.Uint64(data[h:])); got != stamp {
		return nil, 0, fmt.Errorf("%w: written for another handover (stamp %d, want %d)", ErrDescription, got, stamp)
	}
	bs := int(binary.BigEndian.Uint32(data[h+8:]))
	if bs != t.opt.BlockSize || bs <= 0 {
		return nil, 0, fmt.Errorf("%w: chunk size %d, this process's is %d", ErrDescription, bs, t.opt.BlockSize)
	}
	logNext := binary.BigEndian.Uint64(data[h+12:])
	if logNext > maxLogSeq {
		logNext = 0 // out of range: the new log starts at 1
	}
	rest := data[h+describeHead:]
	desc := map[ekey]described{}
	take := func(n int) []byte {
		if n > len(rest) {
			rest = nil
			return nil
		}
		b := rest[:n]
		rest = rest[n:]
		return b
	}
	str := func() (string, bool) {
		l := take(2)
		if l == nil {
			return "", false
		}
		b := take(int(binary.BigEndian.Uint16(l)))
		return string(b), b != nil
	}
	// Every record is framed first, in order; the chunks' tokens are
	// decoded and their hashes checked after, over the cores (a BLAKE3
	// chain a chunk: most of a large pool's re-announcement, which the
	// restart's gap waits for); then the records are taken in their order.
	var items []describedItem
	for len(rest) > 0 {
		tag := take(1)[0]
		if tag == tagTier {
			ti := take(1)
			model, ok1 := str()
			salt, ok2 := str()
			fixed := take(32 + 4 + 4 + 8)
			if ti == nil || !ok1 || !ok2 || fixed == nil {
				r.Dropped++ // cut short
				break
			}
			k := keys.ObjectKey{Model: model, Salt: salt, KVRank: binary.BigEndian.Uint32(fixed[32:]),
				Group: binary.BigEndian.Uint32(fixed[36:]), Layout: binary.BigEndian.Uint64(fixed[40:])}
			copy(k.Chunk[:], fixed[:32])
			items = append(items, describedItem{tier: true, ti: int(ti[0]), k: k})
			continue
		}
		model, ok1 := str()
		salt, ok2 := str()
		fixed := take(32 + 1 + 32 + 4)
		toks := take(4 * bs)
		if tag != tagChunk || !ok1 || !ok2 || fixed == nil || toks == nil {
			r.Dropped++ // cut short, or a record of no known kind: what follows cannot be framed
			break
		}
		it := describedItem{toks: toks}
		it.ek.model, it.ek.salt = model, salt
		copy(it.ek.h[:], fixed[:32])
		it.d = described{hasParent: fixed[32] == 1, ws: int(binary.BigEndian.Uint32(fixed[65:]))}
		copy(it.d.parent[:], fixed[33:65])
		if fixed[32] > 1 || it.d.ws < 1 || it.d.ws > keys.MaxWorldSize {
			r.Dropped++
			continue
		}
		items = append(items, it)
	}
	if err := checkChains(items, bs); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrDescription, err)
	}
	var tiers [][]keys.ObjectKey
	for i := range items {
		it := &items[i]
		if it.tier {
			if _, ok := desc[keyOf(&it.k)]; !ok || it.ti >= MaxTiers {
				r.Dropped++ // of no chunk described before it
				continue
			}
			for len(tiers) <= it.ti {
				tiers = append(tiers, nil)
			}
			tiers[it.ti] = append(tiers[it.ti], it.k)
			r.TierObjects++
			continue
		}
		if _, dup := desc[it.ek]; dup || !it.chained {
			r.Dropped++ // not the chain of its parent and tokens, or told twice
			continue
		}
		desc[it.ek] = it.d
		r.Described++
	}
	r.Tiers = tiers
	return desc, logNext, nil
}

// describedItem is one record of a description as parse frames it: a
// tier object (tier), or a chunk with its tokens still encoded (toks) and,
// once checkChains ran, whether its hash is the chain of its parent and
// tokens (chained, d.tokens decoded).
type describedItem struct {
	tier    bool
	ti      int
	k       keys.ObjectKey
	ek      ekey
	d       described
	toks    []byte
	chained bool
}

// checkChains decodes each chunk item's tokens (bs of them) and checks its
// hash, the chunks spread over up to min(GOMAXPROCS, 8) workers.
func checkChains(items []describedItem, bs int) error {
	workers := min(runtime.GOMAXPROCS(0), 8, max(len(items)/1024, 1))
	hashers := make([]*keys.Hasher, workers)
	for w := range hashers {
		h, err := keys.NewHasher(bs, keys.AlgorithmBLAKE3)
		if err != nil {
			return err
		}
		hashers[w] = h
	}
	var wg sync.WaitGroup
	per := (len(items) + workers - 1) / workers
	for w := range workers {
		part := items[min(w*per, len(items)):min((w+1)*per, len(items))]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range part {
				it := &part[i]
				if it.tier {
					continue
				}
				it.d.tokens = make([]uint32, bs)
				for j := range it.d.tokens {
					it.d.tokens[j] = binary.BigEndian.Uint32(it.toks[4*j:])
				}
				it.toks = nil
				prev := keys.NoneHash()
				if it.d.hasParent {
					prev = it.d.parent
				}
				it.chained = hashers[w].HashesAfter(prev, it.d.tokens)[0] == it.ek.h
			}
		}()
	}
	wg.Wait()
	return nil
}
