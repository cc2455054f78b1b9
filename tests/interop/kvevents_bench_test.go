package interop

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	gozmq "github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/tests/harness"
	goworker "kvdock/transfer/worker"
)

// BenchmarkKVEventsLagAndThroughput measures, through the real binary, the
// store-to-event lag (from a worker's COMMIT_STORE being sent to the
// BlockStored of that prompt reaching a go-zeromq subscriber) and the store
// throughput with the stream on against the same server with it off,
// measured in the same run: two servers with the same pool, the same SHM
// worker model and the same fresh prompts (8 chunks of 256 tokens, 1 MiB
// each, so both pools evict as they go), in alternating rounds so that
// load from elsewhere falls on both alike. It reports lag_p50_ms,
// lag_p99_ms, the stores/s of each, on_off (the ratio of the two) and
// on_off_median (the median over the rounds of each pair's ratio).
//
//	go test -run '^$' -bench KVEventsLagAndThroughput -benchtime 1x ./tests/interop/
func BenchmarkKVEventsLagAndThroughput(b *testing.B) {
	const (
		chunkTokens = 256
		chunks      = 8
		rounds      = 80
		perRound    = 10
	)
	ps := eventsPorts(b, 47260, 47270, 2)
	pub, rep := ps[0], ps[1]
	common := []string{"--chunk-size", fmt.Sprint(chunkTokens), "--l1-size-gb", "0.25", "--log-level", "info"}
	on := harness.Start(b, append(common, "--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep), "--kv-events-pod", "benchpod")...)
	off := harness.Start(b, common...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The subscriber notes when each prompt's first block arrives.
	sub := gozmq.NewSub(ctx)
	defer sub.Close()
	if err := sub.Dial(fmt.Sprintf("tcp://127.0.0.1:%d", pub)); err != nil {
		b.Fatal(err)
	}
	if err := sub.SetOption(gozmq.OptionSubscribe, "kv@benchpod@"); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	arrived := map[uint64]time.Time{}
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			// A router's decoding, lean: the fields it keys on, the
			// tokens skipped (this machine's cores are the server's too).
			var batch struct {
				_msgpack struct{} `msgpack:",as_array"`
				TS       float64
				Events   []struct {
					Type   string   `msgpack:"type"`
					Hashes []uint64 `msgpack:"block_hashes"`
				}
				Rank int
			}
			if len(msg.Frames) != 3 || msgpack.Unmarshal(msg.Frames[2], &batch) != nil {
				continue
			}
			mu.Lock()
			for _, e := range batch.Events {
				if e.Type == "BlockStored" && len(e.Hashes) > 0 {
					arrived[e.Hashes[0]] = now
				}
			}
			mu.Unlock()
		}
	}()

	worker := func(srv *harness.Server, id int64) *goworker.Worker {
		w, err := goworker.Register(ctx, srv.Dial(b, "nongpu-v1"), goworker.Config{InstanceID: id, Model: "events-bench",
			WorldSize: 1, Layers: 2, Hidden: 512, Dtype: "float16"})
		if err != nil || w.Mode() != "shm" {
			b.Fatalf("register: %v (mode %s)\n%s", err, w.Mode(), srv.Output())
		}
		b.Cleanup(func() { w.Close() })
		return w
	}
	won, woff := worker(on, 4101), worker(off, 4102)
	hasher, err := keys.NewHasher(chunkTokens, keys.AlgorithmBLAKE3)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, won.Layout().Bytes)
	next := uint32(0)
	// store stores a fresh prompt through w and returns when its
	// COMMIT_STORE was sent and the prompt's first chunk hash.
	store := func(w *goworker.Worker) (time.Time, uint64) {
		toks := make([]uint32, chunks*chunkTokens)
		for i := range toks {
			next++
			toks[i] = next
		}
		key := w.Key(toks, chunks, fmt.Sprint("bench-", next))
		ps, err := w.PrepareStore(ctx, key)
		if err != nil || len(ps.Slots) != chunks {
			b.Fatalf("prepare: %v, %d slots", err, len(ps.Slots))
		}
		for _, s := range ps.Slots {
			if err := w.WriteSlot(s, data); err != nil {
				b.Fatal(err)
			}
		}
		sent := time.Now()
		if ok, err := w.CommitStore(ctx, key, nil); err != nil || !ok {
			b.Fatalf("commit: %v %v", ok, err)
		}
		return sent, kvevents.WireHash(hasher.Hashes(toks)[0])
	}
	type sentAt struct {
		at time.Time
		h  uint64
	}
	var sent []sentAt
	var onTime, offTime time.Duration
	var pairs []float64 // per round, the off round's time over the on round's
	b.ResetTimer()
	for r := range rounds {
		// Alternate which server goes first, so neither always follows the other.
		var took [2]time.Duration
		for i, w := range []*goworker.Worker{won, woff} {
			if r%2 == 1 {
				w = []*goworker.Worker{woff, won}[i]
			}
			start := time.Now()
			for range perRound {
				at, h := store(w)
				if w == won {
					sent = append(sent, sentAt{at, h})
				}
			}
			if w == won {
				took[0] = time.Since(start)
			} else {
				took[1] = time.Since(start)
			}
		}
		onTime += took[0]
		offTime += took[1]
		pairs = append(pairs, took[1].Seconds()/took[0].Seconds())
	}
	b.StopTimer()
	// Every prompt's event arrives; a missing one fails the benchmark.
	deadline := time.Now().Add(10 * time.Second)
	var lags []float64
	for {
		mu.Lock()
		lags = lags[:0]
		for _, s := range sent {
			if a, ok := arrived[s.h]; ok {
				lags = append(lags, float64(a.Sub(s.at).Microseconds())/1000)
			}
		}
		mu.Unlock()
		if len(lags) == len(sent) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d stores announced", len(lags), len(sent))
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	slices.Sort(lags)
	n := float64(rounds * perRound)
	onRate, offRate := n/onTime.Seconds(), n/offTime.Seconds()
	b.ReportMetric(lags[len(lags)/2], "lag_p50_ms")
	b.ReportMetric(lags[len(lags)*99/100], "lag_p99_ms")
	b.ReportMetric(onRate, "on_stores/s")
	b.ReportMetric(offRate, "off_stores/s")
	b.ReportMetric(onRate/offRate, "on_off")
	// Load from elsewhere comes in spells: the median of the rounds'
	// ratios (each pair run back to back) is the steadier figure.
	slices.Sort(pairs)
	b.ReportMetric(pairs[len(pairs)/2], "on_off_median")
}
