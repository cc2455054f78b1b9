package gpu

import (
	"context"
	"sync"
	"testing"
	"time"

	"kvdock/core/testkit/poll"
)

func TestNone(t *testing.T) {
	src := None("no GPU configured")
	s := src.Sample()
	if s.Available || s.Reason != "no GPU configured" || s.Sampled.IsZero() {
		t.Fatalf("None sample = %+v", s)
	}
	src.Close()
}

func TestFakeReturnsCopies(t *testing.T) {
	in := Snapshot{Available: true, Devices: []Device{{Name: "a", Processes: []Process{{PID: 1}}}}}
	f := NewFake(in)
	in.Devices[0].Processes[0].PID = 99 // the caller's later edits do not leak in
	s := f.Sample()
	s.Devices[0].Name = "changed" // nor do edits of a returned snapshot
	if got := f.Sample(); got.Devices[0].Name != "a" || got.Devices[0].Processes[0].PID != 1 {
		t.Fatalf("Fake sample = %+v, want the original", got)
	}
	if f.Samples() != 2 || f.Closed() {
		t.Fatalf("samples = %d closed = %v", f.Samples(), f.Closed())
	}
	f.Close()
	if !f.Closed() {
		t.Fatal("Close not recorded")
	}
	var zero Fake
	if s := zero.Sample(); s.Available {
		t.Fatal("zero Fake is available")
	}
}

func TestSamplerLatestBeforeRun(t *testing.T) {
	s := NewSampler(NewFake(Snapshot{Available: true}))
	if l := s.Latest(); l.Available || l.Reason == "" || !l.Sampled.IsZero() {
		t.Fatalf("Latest before Run = %+v", l)
	}
}

func TestSamplerRunsUpdatesAndStops(t *testing.T) {
	f := NewFake(Snapshot{Available: true, Driver: "1"})
	s := NewSampler(f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx, time.Hour); close(done) }()

	// The first reading is immediate, not an hour away.
	poll.Until(t, 5*time.Second, "first sample", func() bool { return s.Latest().Driver == "1" })
	if f.Samples() != 1 {
		t.Fatalf("samples = %d, want 1", f.Samples())
	}

	// A shorter interval takes effect without waiting out the hour.
	f.Set(Snapshot{Available: true, Driver: "2"})
	s.SetInterval(5 * time.Millisecond)
	if s.Interval() != 5*time.Millisecond {
		t.Fatalf("Interval = %v", s.Interval())
	}
	poll.Until(t, 5*time.Second, "sample at the new interval", func() bool { return s.Latest().Driver == "2" })
	poll.Until(t, 5*time.Second, "repeated samples", func() bool { return f.Samples() >= 5 })

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	n := f.Samples()
	time.Sleep(30 * time.Millisecond)
	if f.Samples() != n {
		t.Fatalf("sampled after Run returned: %d → %d", n, f.Samples())
	}
	if f.Closed() {
		t.Fatal("Sampler closed its source")
	}
}

func TestSamplerLongerIntervalStopsFastSampling(t *testing.T) {
	f := NewFake(Snapshot{Available: true})
	s := NewSampler(f)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx, time.Millisecond)
	poll.Until(t, 5*time.Second, "fast samples", func() bool { return f.Samples() >= 3 })
	s.SetInterval(time.Hour)
	// One reading already due (its timer fired) may still land, whenever a
	// loaded machine runs the loop; at the old 1 ms pace 70 ms would bring
	// dozens.
	n := f.Samples()
	time.Sleep(70 * time.Millisecond)
	if f.Samples() > n+1 {
		t.Fatalf("still sampling after SetInterval(1h): %d → %d", n, f.Samples())
	}
}

func TestSamplerNonPositiveIntervalMeansDefault(t *testing.T) {
	s := NewSampler(None("x"))
	s.SetInterval(0)
	if s.Interval() != DefaultInterval {
		t.Fatalf("Interval = %v, want %v", s.Interval(), DefaultInterval)
	}
	s.SetInterval(-time.Second)
	if s.Interval() != DefaultInterval {
		t.Fatalf("Interval = %v, want %v", s.Interval(), DefaultInterval)
	}
}

// blockingSource blocks in Sample until released, like a hung driver.
type blockingSource struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (b *blockingSource) Sample() Snapshot {
	b.once.Do(func() { close(b.entered) })
	<-b.release
	return Snapshot{Available: true, Driver: "late"}
}
func (b *blockingSource) Close() {}

func TestSamplerLatestNeverWaitsForSample(t *testing.T) {
	b := &blockingSource{entered: make(chan struct{}), release: make(chan struct{})}
	s := NewSampler(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx, time.Hour)
	<-b.entered
	got := make(chan Snapshot)
	go func() { got <- s.Latest() }()
	select {
	case l := <-got:
		if l.Available {
			t.Fatalf("Latest during a hung reading = %+v, want the not-yet-sampled snapshot", l)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Latest blocked on a reading in progress")
	}
	close(b.release)
	poll.Until(t, 5*time.Second, "late sample", func() bool { return s.Latest().Driver == "late" })
}

func TestSamplerLatestIsACopy(t *testing.T) {
	s := NewSampler(NewFake(Snapshot{Available: true, Devices: []Device{{Name: "a"}}}))
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx, time.Hour)
	poll.Until(t, 5*time.Second, "sample", func() bool { return s.Latest().Available })
	cancel()
	l := s.Latest()
	l.Devices[0].Name = "b"
	if s.Latest().Devices[0].Name != "a" {
		t.Fatal("Latest shares its devices with the caller")
	}
}

func TestSamplerRunWithDoneContext(t *testing.T) {
	f := NewFake(Snapshot{Available: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	NewSampler(f).Run(ctx, time.Millisecond)
	if f.Samples() != 0 {
		t.Fatalf("sampled %d times with a done context", f.Samples())
	}
}
