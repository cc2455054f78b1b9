package rpc

import (
	"strings"
	"testing"
	"time"
)

// TestRecentAnswersReachBack: the ring tells each peer's last answer since
// a time while it holds every answer since then; it says it cannot when
// the answers since passed its size or one went to an id too long to keep.
func TestRecentAnswersReachBack(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	var r recentAnswers
	last := map[string]time.Time{}
	if !r.since(at(0), last) || len(last) != 0 {
		t.Fatalf("an empty ring: %v", last)
	}
	for i := range 10 {
		r.note(keyOf([]byte{0, byte(i % 3)}), at(i))
	}
	if !r.since(at(5), last) || len(last) != 3 || !last["\x00\x02"].Equal(at(8)) || !last["\x00\x00"].Equal(at(9)) || !last["\x00\x01"].Equal(at(7)) {
		t.Fatalf("since 5 ms: %v", last)
	}
	// More answers than the ring holds, all since the time asked: not known.
	for i := range recentAnswerCount {
		r.note(keyOf([]byte{1, byte(i)}), at(100+i/100))
	}
	if r.since(at(50), map[string]time.Time{}) {
		t.Fatal("the ring claimed answers it no longer holds")
	}
	if got := map[string]time.Time{}; !r.since(at(120), got) || len(got) == 0 {
		t.Fatalf("since 120 ms, inside the ring: %v", got)
	}
	// An id too long to keep, answered since: not known; before: no matter.
	r.note(keyOf([]byte(strings.Repeat("x", maxPeerKey+1))), at(200))
	r.note(keyOf([]byte("w")), at(201))
	if r.since(at(199), map[string]time.Time{}) {
		t.Fatal("an answer to an id too long to keep went unnoticed")
	}
	if got := map[string]time.Time{}; !r.since(at(200).Add(time.Microsecond), got) || !got["w"].Equal(at(201)) || len(got) != 1 {
		t.Fatalf("since after the long id: %v", got)
	}
}
