package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"kvdock/core/keys"
)

// A restart that adopts the pool starts a new stream (seq 0, which llm-d
// takes as a reset of the pod), so the new process re-announces the
// adopted usable set before any new event. What the pool keeps has no
// tokens, so the stopping process writes its L1 chunks' descriptions
// (Describe) beside the restart record, and the adopting one re-announces
// the chunks it adopted whole (Reannounce).
//
// The description is outside input when read back: each chunk's hash must
// be the hash chain of its parent and tokens, so nothing but the tokens
// that name an adopted chunk can be announced for it; a part that fails its
// checks is left out alone.

const describeMagic = "kvdock kv events 2\n"

// describeHead is the header after the magic: the stamp, the chunk size
// and the poll log's next seq.
const describeHead = 8 + 4 + 8

// maxLogSeq bounds the poll log's seq a description may carry on.
const maxLogSeq = 1 << 62

// MaxDescribeBytes bounds a description, written and read: past it the
// chunks left out are counted and not re-announced.
const MaxDescribeBytes = 1 << 30

// maxWant bounds a chunk's object count (world size times KV groups).
const maxWant = 1 << 16

// Describe returns the description of the L1 chunks a commit described
// (tokens, parent, object count), headed by stamp (which names the handover:
// Reannounce refuses another), at most maxBytes long, and how many chunks
// did not fit.
func (t *Tracker) Describe(stamp int64, maxBytes int) (data []byte, left int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := append([]byte(describeMagic), make([]byte, describeHead)...)
	binary.BigEndian.PutUint64(b[len(describeMagic):], uint64(stamp))
	binary.BigEndian.PutUint32(b[len(describeMagic)+8:], uint32(t.opt.BlockSize))
	if t.opt.Log != nil {
		binary.BigEndian.PutUint64(b[len(describeMagic)+12:], t.opt.Log.next())
	}
	for ek, n := range t.l1.nodes {
		if n.want == 0 {
			continue
		}
		size := 2 + len(ek.model) + 2 + len(ek.salt) + 32 + 1 + 32 + 4 + 4*len(n.tokens)
		if len(ek.model) > 0xffff || len(ek.salt) > 0xffff || len(b)+size > maxBytes {
			left++
			continue
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(ek.model)))
		b = append(b, ek.model...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(ek.salt)))
		b = append(b, ek.salt...)
		b = append(b, ek.h[:]...)
		if n.hasParent {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = append(b, n.parent[:]...)
		b = binary.BigEndian.AppendUint32(b, uint32(n.want))
		for _, tk := range n.tokens {
			b = binary.BigEndian.AppendUint32(b, tk)
		}
	}
	return b, left
}

// Reannounced says what Reannounce did.
type Reannounced struct {
	Chunks    int // chunks announced (whole, parents adopted)
	Described int // chunk descriptions accepted
	Dropped   int // descriptions left out: a hash that is not its chain, an object count out of range, a part cut short
}

// ErrDescription is wrapped by Reannounce for a description it refuses whole.
var ErrDescription = errors.New("kv events description refused")

type described struct {
	want      int
	parent    keys.Hash
	hasParent bool
	tokens    []uint32
}

// Reannounce re-announces what an adoption kept: data is the description
// the stopping process wrote (Describe with stamp), published the adopted
// objects that were readable when kept, which the pool's adoption told
// the tracker of (Stored; a carried write reservation too, announced once
// its commit comes), and unreadable tells which of up to 64 keys are not
// readable now (l1.Pool.Unreadable): asked after the objects are marked,
// so that whatever left the pool meanwhile goes. Call it before the new
// process serves: its events lead the stream, parents first.
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
	m := t.l1
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
		if n.want == 0 {
			m.describe(ek, n, d.want, d.parent, d.hasParent, d.tokens)
		}
		was := n.whole()
		j := n.find(k)
		if j < 0 {
			continue
		}
		n.objs[j].committed = true
		if !was && n.whole() {
			m.held++ // until tryAnnounce announces it
		}
	}
	t.mu.Unlock()
	// What left the pool since it was kept (expired, evicted) goes now.
	for i := 0; i < len(published); i += 64 {
		ks := published[i:min(i+64, len(published))]
		bits := unreadable(ks)
		for j := range ks {
			if bits&(1<<j) != 0 {
				t.Lost(&ks[j])
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
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
	chain, err := keys.NewHasher(bs, keys.AlgorithmBLAKE3)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrDescription, err)
	}
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
	for len(rest) > 0 {
		model, ok1 := str()
		salt, ok2 := str()
		fixed := take(32 + 1 + 32 + 4)
		toks := take(4 * bs)
		if !ok1 || !ok2 || fixed == nil || toks == nil {
			r.Dropped++ // cut short: what follows cannot be framed
			break
		}
		var ek ekey
		ek.model, ek.salt = model, salt
		copy(ek.h[:], fixed[:32])
		d := described{hasParent: fixed[32] == 1, want: int(binary.BigEndian.Uint32(fixed[65:]))}
		copy(d.parent[:], fixed[33:65])
		if fixed[32] > 1 || d.want < 1 || d.want > maxWant {
			r.Dropped++
			continue
		}
		d.tokens = make([]uint32, bs)
		for i := range d.tokens {
			d.tokens[i] = binary.BigEndian.Uint32(toks[4*i:])
		}
		prev := keys.NoneHash()
		if d.hasParent {
			prev = d.parent
		}
		if _, dup := desc[ek]; dup || chain.HashesAfter(prev, d.tokens)[0] != ek.h {
			r.Dropped++ // not the chain of its parent and tokens, or told twice
			continue
		}
		desc[ek] = d
		r.Described++
	}
	return desc, logNext, nil
}
