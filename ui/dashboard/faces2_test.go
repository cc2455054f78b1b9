package dashboard

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// tableRow is a row of the settings table: selection, edit mark, key.
var tableRow = regexp.MustCompile(`^[> ] [ *] \S`)

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

// TestSettingsTableColumns: long keys lose their middle inside KEY (the
// footer and the editor show them whole), every row keeps its columns,
// CLASS shows "next-start" whole, byte values read in binary units while
// the editor takes the number of bytes; at 80 and 160 columns.
func TestSettingsTableColumns(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		m := newTestModel(t, newFakeEngine(t), w, h)
		press(t, m, "5")
		selectKey(t, m, "server.go_memory_limit_mb")
		s := screen(m)
		golden(t, fmt.Sprintf("settings_long_keys_%dx%d", w, h), goldenView(m))
		mustContain(t, s, "256 MiB", "128 MiB", "1.0 GiB", "next-start", "server.go_memory_limit_mb: ")
		mustNotContain(t, s, "268435456", "next-~", "resta~")
		if w == 80 {
			mustContain(t, s, "more above", "server.worker_…grace_seconds")
		} else {
			mustContain(t, s, "server.worker_registration_grace_seconds 3600")
		}
		// Every row's columns line up with the header's.
		lines := strings.Split(s, "\n")
		var head string
		for _, l := range lines {
			if strings.HasPrefix(l, "    KEY ") {
				head = l
			}
		}
		col := func(l, title string) int { return strings.Index(l, title) }
		for _, l := range lines {
			if !tableRow.MatchString(l) {
				continue
			}
			for _, title := range []string{"SOURCE", "CLASS"} {
				at := col(head, title)
				if got := []rune(l); len(got) <= at || got[at-1] != ' ' || got[at] == ' ' {
					t.Errorf("%d cols: %s column out of line in %q", w, title, l)
				}
			}
		}
		selectKey(t, m, "server.queued_request_bytes")
		press(t, m, "enter")
		s = screen(m)
		mustContain(t, s, "server.queued_request_bytes: ", "default 256 MiB", "new value: 268435456", "a whole number of bytes · 268435456 = 256 MiB")
		golden(t, fmt.Sprintf("edit_bytes_%dx%d", w, h), goldenView(m))
	}
}
