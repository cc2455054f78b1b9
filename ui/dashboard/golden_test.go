package dashboard

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// update rewrites the goldens: go test ./ui/dashboard -update
var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current views")

// golden compares got with testdata/name.golden (or writes it with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./ui/dashboard -update to create it)", err)
	}
	if string(want) != got {
		t.Fatalf("%s differs from the view; run with -update if the change is intended\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

// goldenView is the screen as plain text with trailing spaces removed
// (the ASCII profile already leaves no colour; ansi.Strip drops the bold
// and reverse attributes so the files read as text).
func goldenView(m *Model) string {
	return trimRight(screen(m)) + "\n"
}

func TestGoldenViews(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {160, 48}} {
		w, h := size[0], size[1]
		m := newTestModel(t, newFakeEngine(t), w, h)
		for p := range paneCount {
			m.goPane(p)
			name := fmt.Sprintf("%s_%dx%d", strings.ToLower(paneNames[p]), w, h)
			golden(t, name, goldenView(m))
		}
		// The details of the selected context and the apply confirmation.
		m.goPane(paneContexts)
		press(t, m, "enter")
		golden(t, fmt.Sprintf("details_%dx%d", w, h), goldenView(m))
		press(t, m, "5")
		selectKey(t, m, "server.shm_name")
		press(t, m, "enter", "ctrl+u")
		golden(t, fmt.Sprintf("edit_%dx%d", w, h), goldenView(m))
		press(t, m, "enter", "a")
		golden(t, fmt.Sprintf("confirm_%dx%d", w, h), goldenView(m))
	}
}
