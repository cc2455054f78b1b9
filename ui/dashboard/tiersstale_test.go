package dashboard

import (
	"fmt"
	"testing"
	"time"

	"kvdock/core/tierstate"
)

// TestTiersStaleGolden: figures the screen has not refreshed for 10 s say
// their age and STALE; a tier that is down shows what it held as last
// known; the header names the down tier, and its reason says the address
// once.
func TestTiersStaleGolden(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		f := newFakeEngine(t)
		withTiers(t, f, []tierstate.Tier{
			{Index: 0, Type: "resp", Target: "127.0.0.1:6391", State: tierstate.Down, Since: t0.Add(-40 * time.Second),
				Reason: "ping: dial tcp 127.0.0.1:6391: connect: connection refused", UsedBytes: 305 << 20, CapacityBytes: 307 << 20, Objects: 122},
		})
		f.mu.Lock()
		f.snap.Taken = t0.Add(-10 * time.Second)
		f.mu.Unlock()
		m := newTestModel(t, f, w, h)
		m.goPane(paneTiers)
		v := goldenView(m)
		mustContain(t, v, "L2 tier 0 resp DOWN", "STALE", "last known 305 MiB / 307 MiB")
		golden(t, fmt.Sprintf("tiers_stale_%dx%d", w, h), v)
	}
}
