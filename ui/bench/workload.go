package bench

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"

	"kvdock/core/keys"
)

// castagnoli is hardware-accelerated on amd64 and arm64, so verifying a
// 32 MiB chunk costs milliseconds, not the run.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// windowStep and windows define where a chunk's bytes come from: chunk data is
// the window of the shared random pattern that starts at (id mod windows) ×
// windowStep. Distinct chunks get distinct bytes (with probability about
// 1 − n²/2/windows for n chunks), every worker derives the same bytes for the
// same chunk, and no per-chunk buffer is needed to store or to verify.
const (
	windowStep = 64
	windows    = 1 << 14
)

// pattern is the read-only source of all chunk data, shared by the workers.
type pattern struct {
	data       []byte
	chunkBytes int

	mu   sync.Mutex
	sums map[uint64]uint32 // window index → crc32c
}

func newPattern(chunkBytes int, seed uint64) *pattern {
	p := &pattern{data: make([]byte, chunkBytes+windows*windowStep), chunkBytes: chunkBytes, sums: map[uint64]uint32{}}
	s := splitmix{state: seed}
	for i := 0; i+8 <= len(p.data); i += 8 {
		binary.LittleEndian.PutUint64(p.data[i:], s.next())
	}
	return p
}

// chunk returns the bytes a worker writes for the chunk with this id.
func (p *pattern) chunk(id uint64) []byte {
	off := int(id%windows) * windowStep
	return p.data[off : off+p.chunkBytes]
}

// sum is the expected checksum of the chunk with this id (cached per window).
func (p *pattern) sum(id uint64) uint32 {
	w := id % windows
	p.mu.Lock()
	s, ok := p.sums[w]
	p.mu.Unlock()
	if ok {
		return s
	}
	s = crc32.Checksum(p.chunk(id), castagnoli)
	p.mu.Lock()
	p.sums[w] = s
	p.mu.Unlock()
	return s
}

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// splitmix is a tiny deterministic generator for tokens and pattern bytes.
type splitmix struct{ state uint64 }

func (s *splitmix) next() uint64 {
	s.state += 0x9e3779b97f4a7c15
	return keys.Mix64(s.state)
}

// prompt is one request of K full chunks.
type prompt struct {
	requestID string
	tokens    []uint32
	ids       []uint64 // per chunk: FNV-1a over the tokens up to the chunk's end
}

// workload builds prompts: a share of them (repeat) starts with one of a few
// shared prefixes of half the chunks (rounded up), like a common system prompt.
type workload struct {
	chunkTokens int
	chunks      int
	repeat      float64
	prefixes    [][]uint32
}

const sharedPrefixes = 4

func newWorkload(chunkTokens, chunks int, repeat float64) *workload {
	w := &workload{chunkTokens: chunkTokens, chunks: chunks, repeat: repeat}
	n := (chunks + 1) / 2 * chunkTokens
	for i := range sharedPrefixes {
		g := splitmix{state: 0xfeed0000 + uint64(i)}
		w.prefixes = append(w.prefixes, randomTokens(&g, n))
	}
	return w
}

func randomTokens(g *splitmix, n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(g.next() % 128000)
	}
	return ts
}

// prompt returns the prompt for (worker, round, index), deterministic.
func (w *workload) prompt(worker, round, index int) prompt {
	g := splitmix{state: uint64(worker)<<48 ^ uint64(round)<<24 ^ uint64(index) ^ 0x5eed}
	total := w.chunks * w.chunkTokens
	var ts []uint32
	if float64(g.next()%10000)/10000 < w.repeat {
		pre := w.prefixes[g.next()%sharedPrefixes]
		ts = append(make([]uint32, 0, total), pre...)
		ts = append(ts, randomTokens(&g, total-len(pre))...)
	} else {
		ts = randomTokens(&g, total)
	}
	return prompt{
		requestID: fmt.Sprintf("bench-w%d-r%d-p%d", worker, round, index),
		tokens:    ts,
		ids:       chunkIDs(ts, w.chunkTokens),
	}
}

// chunkIDs chains FNV-1a over the tokens so a chunk's id, like its cache key,
// depends on every token before it.
func chunkIDs(ts []uint32, chunkTokens int) []uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	ids := make([]uint64, 0, len(ts)/chunkTokens)
	for i, t := range ts {
		for s := 0; s < 32; s += 8 {
			h ^= uint64(byte(t >> s))
			h *= prime
		}
		if (i+1)%chunkTokens == 0 {
			ids = append(ids, h)
		}
	}
	return ids
}
