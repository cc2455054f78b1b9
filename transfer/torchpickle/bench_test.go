package torchpickle

import (
	"testing"
	"time"
)

// Benchmarks report x-memcpy = (time to copy the tensor bytes once with copy())
// / (time of one codec call), both measured in the same run on the same bytes:
// above 1 the codec is faster than copying the data, 1 means memcpy speed.

// kvChunk is a 32 MiB bfloat16 KV chunk, shape [2,32,256,1024].
func kvChunk() Tensor {
	shape := []int{2, 32, 256, 1024}
	data := make([]byte, 2*32*256*1024*2)
	for i := range data {
		data[i] = byte(i * 7)
	}
	return Tensor{Dtype: "bfloat16", Shape: shape, Data: data}
}

// memcpyNs is the mean time of copy(dst, src) over at least 200 ms.
func memcpyNs(dst, src []byte) float64 {
	copy(dst, src) // fault in both buffers
	n := 0
	start := time.Now()
	for time.Since(start) < 200*time.Millisecond {
		copy(dst, src)
		n++
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

func BenchmarkDecode32MiB(b *testing.B) {
	t := kvChunk()
	pkl, err := AppendEncode(nil, []Tensor{t})
	if err != nil {
		b.Fatal(err)
	}
	ref := memcpyNs(make([]byte, len(t.Data)), t.Data)
	b.SetBytes(int64(len(t.Data)))
	b.ResetTimer()
	for b.Loop() {
		ts, err := Decode(pkl, Limits{})
		if err != nil || len(ts) != 1 || len(ts[0].Data) != len(t.Data) {
			b.Fatalf("decode: %v", err)
		}
	}
	b.ReportMetric(ref/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "x-memcpy")
}

func BenchmarkEncode32MiB(b *testing.B) {
	ts := []Tensor{kvChunk()}
	dst := make([]byte, 0, EncodedSize(ts))
	if _, err := AppendEncode(dst, ts); err != nil { // fault in dst
		b.Fatal(err)
	}
	ref := make([]byte, len(ts[0].Data))
	copy(ref, ts[0].Data)
	// Encoding is one memmove of the data plus a few hundred header bytes, so
	// the reference is interleaved with it: both see the same machine load.
	var refTime time.Duration
	b.SetBytes(int64(len(ts[0].Data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := AppendEncode(dst, ts); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		start := time.Now()
		copy(ref, ts[0].Data)
		refTime += time.Since(start)
		b.StartTimer()
	}
	b.ReportMetric(float64(refTime.Nanoseconds())/float64(b.Elapsed().Nanoseconds()), "x-memcpy")
}

// BenchmarkDecodeTransposed32MiB: a non-contiguous view must be copied
// element by element; reported for scale, not held to the memcpy target.
func BenchmarkDecodeTransposed32MiB(b *testing.B) {
	t := kvChunk()
	cont := container("BFloat16Storage", uint64(len(t.Data)/2), uint64(len(t.Data)/2), t.Data)
	pkl := tensorPickle(cont, 0, []int64{1024, 256, 32, 2}, []int64{1, 1024, 256 * 1024, 32 * 256 * 1024})
	ref := memcpyNs(make([]byte, len(t.Data)), t.Data)
	b.SetBytes(int64(len(t.Data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := Decode(pkl, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(ref/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "x-memcpy")
}

// BenchmarkDecode256Small: 256 tensors of 4 KiB, where the per-opcode cost
// of the header (and the decoder's accounting) is visible.
func BenchmarkDecode256Small(b *testing.B) {
	ts := make([]Tensor, 256)
	for i := range ts {
		ts[i] = Tensor{Dtype: "float16", Shape: []int{2, 4, 16, 16}, Data: make([]byte, 2*4*16*16*2)}
	}
	pkl, err := AppendEncode(nil, ts)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(pkl)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if out, err := Decode(pkl, Limits{}); err != nil || len(out) != len(ts) {
			b.Fatalf("decode: %v", err)
		}
	}
}
