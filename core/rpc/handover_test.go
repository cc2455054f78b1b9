package rpc_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"kvdock/core/protocol"
	"kvdock/core/rpc"
)

// handoverCall sends one request and waits for the reply with its uid: true
// when answered within timeout.
func handoverCall(s *zmq.Socket, uid []byte, frames [][]byte, timeout time.Duration) (bool, error) {
	msg := append([][]byte{uid}, frames...)
	for i, f := range msg {
		flag := zmq.SNDMORE
		if i == len(msg)-1 {
			flag = 0
		}
		if _, err := s.SendBytes(f, flag); err != nil {
			return false, err
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		_ = s.SetRcvtimeo(left)
		rep, err := s.RecvMessageBytes(0)
		if err != nil {
			return false, nil // timed out
		}
		if len(rep) > 0 && bytes.Equal(rep[0], uid) {
			return true, nil
		}
	}
}

// dialDealer connects a worker's DEALER (no linger) to endpoint.
func dialDealer(endpoint string) (*zmq.Socket, error) {
	s, err := zmq.NewSocket(zmq.DEALER)
	if err != nil {
		return nil, err
	}
	_ = s.SetLinger(0)
	if err := s.Connect(endpoint); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// TestHandoverLosesNoRequest restarts a server ten times under synchronous
// Go workers looping a new-work request (NOOP, parked) and a finishing one
// (QUERY_PREFETCH_STATUS), each restart a handover stop and a new server on
// the same port: every request is answered, by the old server or the new
// one, but for the rare one a worker sends down the closing connection,
// which the old server counts.
func TestHandoverLosesNoRequest(t *testing.T) {
	for _, tc := range []struct {
		name     string
		handover bool
	}{{"handover", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			port := ln.Addr().(*net.TCPAddr).Port
			_ = ln.Close()
			var served, counted atomic.Int64
			start := func() (*rpc.Server, chan error) {
				var srv *rpc.Server
				deadline := time.Now().Add(15 * time.Second)
				for {
					srv, err = rpc.New(rpc.Options{Host: "127.0.0.1", Port: port, Profile: profile(t, "nongpu-v1")})
					if err != nil {
						t.Fatal(err)
					}
					srv.Handle(protocol.QueryPrefetchStatus, func(context.Context, *rpc.Request) (any, error) {
						served.Add(1)
						return 1, nil
					})
					srv.Handle(protocol.Noop, func(context.Context, *rpc.Request) (any, error) {
						served.Add(1)
						return "OK", nil
					})
					if err = srv.Bind(); err == nil {
						break
					}
					_ = srv.Shutdown(context.Background())
					if time.Now().After(deadline) {
						t.Fatalf("bind port %d again: %v", port, err)
					}
					time.Sleep(5 * time.Millisecond) // the old socket's port is released asynchronously
				}
				done := make(chan error, 1)
				go func() { done <- srv.Serve(context.Background()) }()
				return srv, done
			}
			srv, done := start()
			endpoint := "tcp://127.0.0.1:" + strconv.Itoa(port)

			const workers = 4
			think := 300 * time.Microsecond
			var stop atomic.Bool
			var sent, lost atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := dialDealer(endpoint)
					if err != nil {
						errs <- err
						return
					}
					defer s.Close()
					for n := 0; !stop.Load(); n++ {
						uid, err := protocol.Encode(int64(w*1_000_000 + n))
						if err != nil {
							errs <- err
							return
						}
						frames := [][]byte{enc(t, 19)} // NOOP
						if n%2 == 1 {
							frames = [][]byte{enc(t, 6), enc(t, fmt.Sprintf("req-%d", n))} // QUERY_PREFETCH_STATUS
						}
						time.Sleep(think)
						sent.Add(1)
						ok, err := handoverCall(s, uid, frames, 8*time.Second)
						if err != nil {
							errs <- err
							return
						}
						if !ok {
							lost.Add(1)
						}
					}
				}()
			}
			const restarts = 10
			for range restarts {
				time.Sleep(300 * time.Millisecond)
				if tc.handover {
					srv.SetHandover(&rpc.Handover{Finish: []string{protocol.QueryPrefetchStatus}})
				}
				if err := srv.Shutdown(context.Background()); err != nil {
					t.Fatalf("shutdown: %v", err)
				}
				if err := <-done; err != nil {
					t.Fatalf("serve: %v", err)
				}
				counted.Add(srv.Stats().HandoverLost)
				srv, done = start()
			}
			time.Sleep(150 * time.Millisecond)
			stop.Store(true)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			_ = srv.Shutdown(context.Background())
			<-done
			t.Logf("%d requests sent over %d restarts, %d served, %d never answered, %d counted as arrived after the last answer",
				sent.Load(), restarts, served.Load(), lost.Load(), counted.Load())
			// A Go worker that reacts within microseconds can still send
			// down the closing connection before its libzmq reads the end
			// (under load, ~1 in 300 worker restarts here): the server reads
			// and counts each such request, so none goes unseen. At most one
			// per worker per restart.
			if lost.Load() != counted.Load() {
				t.Errorf("%d requests never answered, the servers counted %d arriving after their last answers", lost.Load(), counted.Load())
			}
			if lost.Load() > workers*restarts/10 {
				t.Errorf("%d of %d requests never answered over %d restarts of %d workers, want at most %d", lost.Load(), sent.Load(), restarts, workers, workers*restarts/10)
			}
			if sent.Load() < 4*restarts {
				t.Errorf("only %d requests sent: the workers did not run through the restarts", sent.Load())
			}
		})
	}
}

// parkPhase starts a server, has workers DEALERs loop NOOPs (parked in a
// handover), the first silent of them sending nothing more from just
// before the stop, stops the server by a handover with think as its Think,
// and returns how long the park phase lasted (from the stop to the Parked
// call) and how many requests it parked.
func parkPhase(t *testing.T, workers, silent int, think time.Duration) (time.Duration, int) {
	t.Helper()
	srv, done := serveNoop(t, rpc.Options{Host: "127.0.0.1", Port: 0, Profile: profile(t, "nongpu-v1")})
	var stop, hush atomic.Bool
	var wg sync.WaitGroup
	var answered, idle atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := dialDealer(srv.Endpoint())
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			for n := 0; !stop.Load(); n++ {
				if w < silent && hush.Load() {
					idle.Add(1) // its last request answered: silent from now on
					for !stop.Load() {
						time.Sleep(time.Millisecond)
					}
					return
				}
				uid, _ := protocol.Encode(int64(w*1_000_000 + n))
				if ok, _ := handoverCall(s, uid, [][]byte{enc(t, 19)}, 2*time.Second); ok {
					answered.Add(1)
				}
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); answered.Load() < int64(50*workers); {
		if time.Now().After(deadline) {
			t.Fatalf("the workers got %d answers in 10 s", answered.Load())
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	hush.Store(true)
	for deadline := time.Now().Add(10 * time.Second); idle.Load() < int64(silent); {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d workers went silent in 10 s", idle.Load(), silent)
		}
		time.Sleep(time.Millisecond) // polling a condition, bounded by the deadline
	}
	parked := make(chan int, 1)
	begun := time.Now()
	var took time.Duration
	srv.SetHandover(&rpc.Handover{Think: think, Max: 4 * think, Parked: func(n int) {
		took = time.Since(begun)
		parked <- n
	}})
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	stop.Store(true)
	wg.Wait()
	return took, <-parked
}

// TestHandoverParkEndsOnceRecentWorkersAreParked: the park phase waits for
// the workers answered just before it began only until each one's next
// request is parked, not a whole Think after the last answer: workers that
// loop without pause are parked at once and the phase ends after its quiet
// spell. A worker answered just before the phase that sends nothing more
// holds the phase for Think, as it may be computing its next request.
func TestHandoverParkEndsOnceRecentWorkersAreParked(t *testing.T) {
	const think = 2 * time.Second
	took, n := parkPhase(t, 3, 0, think)
	t.Logf("workers that loop: park phase %v, %d parked", took, n)
	if took >= think/2 || n != 3 {
		t.Errorf("park phase of workers that send again at once: %v, %d parked; want well under the %v Think, 3 parked", took, n, think)
	}
	const short = 400 * time.Millisecond
	took, n = parkPhase(t, 3, 1, short)
	t.Logf("one worker silent: park phase %v, %d parked", took, n)
	if took < short/2 || n != 2 {
		t.Errorf("park phase with a worker answered just before it and silent since: %v, %d parked; want about the %v Think, 2 parked", took, n, short)
	}
}
