package engine

import (
	"log/slog"
	"sync"
	"time"

	"kvdock/core/logcap"
	"kvdock/core/workers"
)

// EventKind groups events for the log pane.
type EventKind string

// Event kinds beyond the transfer module's own.
const (
	EventLifecycle EventKind = "lifecycle"
	EventRestart   EventKind = "restart"
	EventError     EventKind = "error"
	// EventRefused: a lock cap refused a lookup's read locks (at most one
	// event a second); the miss breakdown counts those chunks as refused.
	EventRefused EventKind = "refused"
)

// Event is one line of the engine's story: registrations, fallbacks,
// restarts, errors.
type Event struct {
	Seq     uint64
	Time    time.Time
	Kind    EventKind
	Level   slog.Level
	Message string
}

// eventLog keeps the recent events and fans new ones out to subscribers.
type eventLog struct {
	mu   sync.Mutex
	now  func() time.Time
	ring []Event
	next int
	full bool
	seq  uint64
	subs map[chan Event]struct{}
}

func newEventLog(n int, now func() time.Time) *eventLog {
	return &eventLog{now: now, ring: make([]Event, n), subs: make(map[chan Event]struct{})}
}

// add records an event. Messages carry peer strings (model names, error
// texts): they are cut to logcap.DefaultMaxString bytes.
func (l *eventLog) add(kind EventKind, level slog.Level, msg string) {
	msg = logcap.Truncate(msg, logcap.DefaultMaxString)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	ev := Event{Seq: l.seq, Time: l.now(), Kind: kind, Level: level, Message: msg}
	l.ring[l.next] = ev
	l.next = (l.next + 1) % len(l.ring)
	if l.next == 0 {
		l.full = true
	}
	for ch := range l.subs {
		select {
		case ch <- ev:
		default: // a slow subscriber misses events rather than stalling the engine
		}
	}
}

// recent returns up to n events, oldest first.
func (l *eventLog) recent(n int) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var all []Event
	if l.full {
		all = append(all, l.ring[l.next:]...)
	}
	all = append(all, l.ring[:l.next]...)
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return all
}

// Subscribe returns a channel of new events and a function that ends the
// subscription. Events are dropped for a subscriber that does not keep up.
func (e *Engine) Subscribe(buffer int) (<-chan Event, func()) {
	ch := make(chan Event, buffer)
	e.events.mu.Lock()
	e.events.subs[ch] = struct{}{}
	e.events.mu.Unlock()
	return ch, func() {
		e.events.mu.Lock()
		delete(e.events.subs, ch)
		e.events.mu.Unlock()
	}
}

// transferEvent forwards the transfer module's events into the log (add
// cuts their peer-derived texts).
func (e *Engine) transferEvent(ev workers.Event) {
	e.events.add(EventKind(ev.Kind), ev.Level, ev.Message)
}
