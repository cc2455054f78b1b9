package interop

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	gozmq "github.com/go-zeromq/zmq4"
	zmq "github.com/pebbe/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"kvdock/core/keys"
	"kvdock/core/kvevents"
	"kvdock/core/zmqwait"
	"kvdock/tests/harness"
	goworker "kvdock/transfer/worker"
)

// BenchmarkKVEventsLagAndThroughput measures, through the real binary, the
// store-to-event lag (from a worker's COMMIT_STORE being sent to the
// BlockStored of that prompt reaching a subscriber in this process) and the store
// throughput with the stream on against the same server with it off,
// measured in the same run: two servers with the same pool, the same SHM
// worker model and the same fresh prompts (8 chunks of 256 tokens, 1 MiB
// each, so both pools evict as they go), in alternating rounds so that
// load from elsewhere falls on both alike. It reports lag_p50_ms,
// lag_p99_ms, the stores/s of each, on_off (the ratio of the two) and
// on_off_median (the median over the rounds of each pair's ratio, with its
// quartiles on_off_p25 and on_off_p75); and, per
// store, the CPU time of each server (every thread) over the whole loop and
// the subscriber's (this process's CPU over the on rounds less the off
// rounds: the worker's share is the same in both), since on two cores
// every microsecond of either shows in the wall clock; and, to tell where
// the on server's extra time goes, the batches a store (flushes), each
// server's context switches and minor page faults a store and the extra
// CPU of the on server's libzmq I/O threads. Rounds of 40 stores
// (about 40 ms) keep what a round's last flush leaves to the next round (a
// few milliseconds' events) a small part of it. It runs once with each
// subscriber: go-zeromq (sub=go-zeromq, llm-d's library) and libzmq
// waiting in Go's poller (sub=libzmq, the library of vLLM's subscriber),
// which on these two cores takes less of the worker's CPU.
//
//	go test -run '^$' -bench KVEventsLagAndThroughput -benchtime 1x ./tests/interop/
func BenchmarkKVEventsLagAndThroughput(b *testing.B) {
	b.Run("sub=go-zeromq", func(b *testing.B) { benchKVEvents(b, 47260, goZeroMQSub) })
	b.Run("sub=libzmq", func(b *testing.B) { benchKVEvents(b, 47275, libzmqSub) })
}

// arrival is one message the subscriber received: when, and its payload.
type arrival struct {
	at      time.Time
	payload []byte
}

// subscriber connects to endpoint, subscribes to prefix and calls got for
// each 3-frame message until ctx is done; it returns once connected.
type subscriber func(b *testing.B, ctx context.Context, endpoint, prefix string, got func(arrival))

// goZeroMQSub reads with github.com/go-zeromq/zmq4, the pure-Go library
// llm-d's indexer subscribes with.
func goZeroMQSub(b *testing.B, ctx context.Context, endpoint, prefix string, got func(arrival)) {
	sub := gozmq.NewSub(ctx)
	b.Cleanup(func() { _ = sub.Close() })
	if err := sub.Dial(endpoint); err != nil {
		b.Fatal(err)
	}
	if err := sub.SetOption(gozmq.OptionSubscribe, prefix); err != nil {
		b.Fatal(err)
	}
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			if len(msg.Frames) == 3 {
				got(arrival{time.Now(), msg.Frames[2]})
			}
		}
	}()
}

// libzmqSub reads with libzmq (github.com/pebbe/zmq4), the library under
// vLLM's own subscriber (pyzmq), waiting in Go's network poller
// (core/zmqwait): a router that costs the host less CPU a message than
// go-zeromq does, so less of these two cores' wall clock.
func libzmqSub(b *testing.B, ctx context.Context, endpoint, prefix string, got func(arrival)) {
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		b.Fatal(err)
	}
	for _, err := range []error{sub.SetLinger(0), sub.SetSubscribe(prefix), sub.Connect(endpoint)} {
		if err != nil {
			b.Fatal(err)
		}
	}
	w, err := zmqwait.New(sub, "subscriber")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { _ = w.Close() })
	b.Cleanup(func() {
		stop()
		_ = w.Close()
		<-done
		_ = sub.Close()
	})
	go func() {
		defer close(done)
		for {
			err := w.Wait(func() bool {
				for {
					ev, err := sub.GetEvents()
					if err != nil {
						return true
					}
					if ev&zmq.POLLIN == 0 {
						return false
					}
					msg, err := sub.RecvMessageBytes(zmq.DONTWAIT)
					if err != nil {
						return false
					}
					if len(msg) == 3 {
						got(arrival{time.Now(), msg[2]})
					}
				}
			})
			if err != nil || ctx.Err() != nil {
				return
			}
		}
	}()
}

func benchKVEvents(b *testing.B, port0 int, subscribe subscriber) {
	const (
		chunkTokens = 256
		chunks      = 8
		rounds      = 60
		perRound    = 40
	)
	ps := eventsPorts(b, port0, port0+10, 2)
	pub, rep := ps[0], ps[1]
	common := []string{"--chunk-size", fmt.Sprint(chunkTokens), "--l1-size-gb", "0.25", "--log-level", "info"}
	on := harness.Start(b, append(common, "--kv-events-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", pub),
		"--kv-events-replay-endpoint", fmt.Sprintf("tcp://127.0.0.1:%d", rep), "--kv-events-pod", "benchpod")...)
	off := harness.Start(b, common...)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The subscriber notes when each message arrives and keeps its bytes;
	// it decodes them after the run, as a router on another host would
	// spend its decoding on its own cores, not on the server's.
	var mu sync.Mutex
	var arrivals []arrival
	subscribe(b, ctx, fmt.Sprintf("tcp://127.0.0.1:%d", pub), "kv@benchpod@", func(a arrival) {
		mu.Lock()
		arrivals = append(arrivals, a)
		mu.Unlock()
	})
	// arrived decodes the messages kept so far as a router does (the
	// fields it keys on; the tokens skipped) and returns when each
	// prompt's first block arrived.
	arrived := func() map[uint64]time.Time {
		mu.Lock()
		kept := slices.Clone(arrivals)
		mu.Unlock()
		out := map[uint64]time.Time{}
		for _, a := range kept {
			var batch struct {
				_msgpack struct{} `msgpack:",as_array"`
				TS       float64
				Events   []struct {
					Type   string   `msgpack:"type"`
					Hashes []uint64 `msgpack:"block_hashes"`
				}
				Rank int
			}
			if msgpack.Unmarshal(a.payload, &batch) != nil {
				continue
			}
			for _, e := range batch.Events {
				if e.Type == "BlockStored" && len(e.Hashes) > 0 {
					out[e.Hashes[0]] = a.at
				}
			}
		}
		return out
	}

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
	var onSelf, offSelf time.Duration // this process's (worker and subscriber) CPU over each server's rounds
	var pairs []float64               // per round, the off round's time over the on round's
	// The servers' own CPU time (every thread) over the whole loop: what
	// the on server's publisher does after its round, while the off
	// server stores, counts as its own.
	on0, off0 := harness.Threads(b, on.PID()), harness.Threads(b, off.PID())
	b.ResetTimer()
	for r := range rounds {
		// Alternate which server goes first, so neither always follows the other.
		var took [2]time.Duration
		for i, w := range []*goworker.Worker{won, woff} {
			if r%2 == 1 {
				w = []*goworker.Worker{woff, won}[i]
			}
			self0 := harness.CPUTime(b, os.Getpid())
			start := time.Now()
			for range perRound {
				at, h := store(w)
				if w == won {
					sent = append(sent, sentAt{at, h})
				}
			}
			d, self := time.Since(start), harness.CPUTime(b, os.Getpid())-self0
			if w == won {
				took[0], onSelf = d, onSelf+self
			} else {
				took[1], offSelf = d, offSelf+self
			}
		}
		onTime += took[0]
		offTime += took[1]
		pairs = append(pairs, took[1].Seconds()/took[0].Seconds())
	}
	b.StopTimer()
	on1, off1 := harness.Threads(b, on.PID()), harness.Threads(b, off.PID())
	onCPU, offCPU := on1.CPU-on0.CPU, off1.CPU-off0.CPU
	// Every prompt's event arrives; a missing one fails the benchmark.
	deadline := time.Now().Add(10 * time.Second)
	var lags []float64
	for {
		lags = lags[:0]
		at := arrived()
		for _, s := range sent {
			if a, ok := at[s.h]; ok {
				lags = append(lags, float64(a.Sub(s.at).Microseconds())/1000)
			}
		}
		if len(lags) == len(sent) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d stores announced", len(lags), len(sent))
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	slices.Sort(lags)
	n := float64(rounds * perRound)
	onRate, offRate := n/onTime.Seconds(), n/offTime.Seconds()
	b.ReportMetric(lags[len(lags)/2], "lag_p50_ms")
	b.ReportMetric(lags[len(lags)*99/100], "lag_p99_ms")
	b.ReportMetric(onRate, "on_stores/s")
	b.ReportMetric(offRate, "off_stores/s")
	b.ReportMetric(onRate/offRate, "on_off")
	// The servers' own CPU per store: what the stream costs kvdock itself,
	// apart from the subscriber and the worker sharing these cores.
	b.ReportMetric(float64(onCPU.Microseconds())/n, "on_cpu_us/store")
	b.ReportMetric(float64(offCPU.Microseconds())/n, "off_cpu_us/store")
	b.ReportMetric(onCPU.Seconds()/offCPU.Seconds(), "cpu_on_off")
	b.ReportMetric(float64((onSelf-offSelf).Microseconds())/n, "sub_cpu_us/store")
	// Where the on server's extra time goes: libzmq's I/O threads (the
	// PUB's beside the wire server's, which both have), the threads' wakes
	// and the fresh pages the replay buffer's payloads take.
	b.ReportMetric(float64((on1.ZMQIO-on0.ZMQIO-(off1.ZMQIO-off0.ZMQIO)).Microseconds())/n, "zmq_io_on_off_us/store")
	b.ReportMetric(float64(on1.Switches-on0.Switches)/n, "on_switches/store")
	b.ReportMetric(float64(off1.Switches-off0.Switches)/n, "off_switches/store")
	b.ReportMetric(float64(on1.MinorFaults-on0.MinorFaults)/n, "on_faults/store")
	b.ReportMetric(float64(off1.MinorFaults-off0.MinorFaults)/n, "off_faults/store")
	mu.Lock()
	b.ReportMetric(float64(len(arrivals))/n, "batches/store")
	mu.Unlock()
	// Load from elsewhere comes in spells: the median of the rounds'
	// ratios (each pair run back to back) is the steadier figure.
	slices.Sort(pairs)
	b.ReportMetric(pairs[len(pairs)/2], "on_off_median")
	// and its spread: a quarter of the pairs fall below p25, a quarter above p75.
	b.ReportMetric(pairs[len(pairs)/4], "on_off_p25")
	b.ReportMetric(pairs[len(pairs)*3/4], "on_off_p75")
}
