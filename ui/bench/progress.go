package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// progress shows what the run is doing on stderr: phase, elapsed time, GB
// moved. On a terminal one line is redrawn in place a few times a second
// and erased at the end. Elsewhere (a log file, CI, a pipe) a redrawn line
// is garbage, and a line a second floods the log of a long run; so a plain
// line is written when the phase changes (store, retrieve, small requests,
// references; not every round), and every heartbeat within a long phase
// to show the run is alive, never more than one a second. A nil *progress
// shows nothing (--json).
type progress struct {
	w         io.Writer
	tty       bool
	start     time.Time
	every     time.Duration // redraw (terminal) or check (plain) interval
	heartbeat time.Duration // plain lines: the longest silence within a phase
	moved     atomic.Int64
	// cols is the terminal's width: the redrawn line must not wrap, or
	// "\r" would redraw only its last row.
	cols int

	mu     sync.Mutex
	phase  string // what a plain line names; a change prints one
	detail string // e.g. "round 3": the terminal line only
	// printed and last are the phase and time of the last plain line
	// (the loop's own).
	printed string
	last    time.Time
	changed chan struct{} // a phase change: show it now, within the limits
	stop    chan struct{}
	done    chan struct{}
}

// minRedraw is the shortest interval between two redraws on a terminal.
const minRedraw = 100 * time.Millisecond

// newProgress starts the reporter on w; tty selects the redrawn line.
func newProgress(w io.Writer, tty bool) *progress {
	p := &progress{w: w, tty: tty, start: time.Now(), every: time.Second, heartbeat: 10 * time.Second,
		changed: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if tty {
		p.every = 250 * time.Millisecond
		p.cols = 80
		if f, ok := w.(*os.File); ok {
			if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Col > 0 {
				p.cols = int(ws.Col)
			}
		}
	}
	go p.loop()
	return p
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// setPhase names the phase now running; detail is shown on a terminal only.
func (p *progress) setPhase(phase, detail string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.phase, p.detail = phase, detail
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// add counts bytes moved by the workers (stored or retrieved).
func (p *progress) add(n int64) {
	if p != nil {
		p.moved.Add(n)
	}
}

// render returns what to write at now ("" for nothing): on a terminal the
// redrawn line, else a plain line when the phase changed or the heartbeat
// passed, and never within p.every of the previous one.
func (p *progress) render(now time.Time) string {
	p.mu.Lock()
	phase, detail := p.phase, p.detail
	p.mu.Unlock()
	if phase == "" {
		return ""
	}
	what := phase
	if p.tty && detail != "" {
		what += ", " + detail
	}
	text := fmt.Sprintf("kvdock bench: %s · %.1f s · %.3f GB moved", what, now.Sub(p.start).Seconds(), float64(p.moved.Load())/1e9)
	since := now.Sub(p.last)
	if p.tty {
		// Phases of a tiny workload change thousands of times a second.
		if since < minRedraw {
			return ""
		}
		p.last = now
		if r := []rune(text); p.cols > 1 && len(r) > p.cols-1 {
			text = string(r[:p.cols-2]) + "…"
		}
		return "\r\x1b[K" + text
	}
	if !p.last.IsZero() && (since < p.every || (phase == p.printed && since < p.heartbeat)) {
		return ""
	}
	p.printed, p.last = phase, now
	return text + "\n"
}

func (p *progress) loop() {
	defer close(p.done)
	tick := time.NewTicker(p.every)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			if p.tty {
				fmt.Fprint(p.w, "\r\x1b[K")
			}
			return
		case <-tick.C:
		case <-p.changed:
		}
		if out := p.render(time.Now()); out != "" {
			fmt.Fprint(p.w, out)
		}
	}
}

// close stops the reporter and erases its line on a terminal; nothing is
// written to w after it returns.
func (p *progress) close() {
	if p == nil {
		return
	}
	close(p.stop)
	<-p.done
}
