package dashboard

import (
	"fmt"
	"strings"
	"testing"
)

// TestStatusHasItsOwnLine: an apply's result shows under the rates line;
// the pool line and the rates stay, at both sizes.
func TestStatusHasItsOwnLine(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		m := newTestModel(t, newFakeEngine(t), w, h)
		press(t, m, "5")
		selectKey(t, m, "eviction.ratio")
		press(t, m, "enter", "ctrl+u")
		typeText(t, m, "0.3")
		press(t, m, "enter", "a", "y")
		lines := strings.Split(screen(m), "\n")
		mustContain(t, lines[1], "pool SHM lmcache_l1_pool_demo 50% used")
		mustContain(t, lines[2], "hit 62%")
		mustContain(t, lines[3], "OK applied (live): eviction.ratio")
		if len(lines) != h {
			t.Fatalf("%d lines on a screen %d high", len(lines), h)
		}
		golden(t, fmt.Sprintf("status_%dx%d", w, h), goldenView(m))
	}
}
