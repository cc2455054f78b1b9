// Package poll is the tests' one way to wait for a condition that nothing
// signals: check it, sleep, check again, and fail the test with what was
// awaited once the limit passes.
package poll

import (
	"testing"
	"time"
)

// maxSleep bounds the pause between two checks: a long wait still notices
// its condition within this, and a costly condition (an HTTP round trip, a
// scan of a directory) runs at most this often.
const maxSleep = 50 * time.Millisecond

// Until checks cond until it holds, and fails t (naming what) if it still
// does not after limit. The pause between checks starts at a millisecond and
// doubles up to maxSleep, so a condition that turns quickly is seen at once.
func Until(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	sleep := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(sleep)
		sleep = min(2*sleep, maxSleep)
	}
}
