package workers_test

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// imports lists what the package in dir imports: its code, and its tests.
func imports(t *testing.T, dir string) (code, tests []string) {
	t.Helper()
	p, err := build.Default.ImportDir(dir, 0)
	if err != nil {
		t.Fatalf("read package %s: %v", dir, err)
	}
	return p.Imports, slices.Concat(p.TestImports, p.XTestImports)
}

// TestFacesDoNotImportTransfer holds DESIGN.md's rule this package exists
// for: the faces read worker snapshots from core, never from the transfer
// module (code and tests alike).
func TestFacesDoNotImportTransfer(t *testing.T) {
	checked := 0
	err := filepath.WalkDir(filepath.Join("..", "..", "ui"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if m, _ := filepath.Glob(filepath.Join(path, "*.go")); len(m) == 0 {
			return nil
		}
		checked++
		code, tests := imports(t, path)
		if slices.Contains(code, "kvdock/transfer/nongpu") {
			t.Errorf("%s imports kvdock/transfer/nongpu; read the types from kvdock/core/workers", path)
		}
		if slices.Contains(tests, "kvdock/transfer/nongpu") {
			t.Errorf("%s tests import kvdock/transfer/nongpu; build the fixtures from kvdock/core/workers", path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk ui: %v", err)
	}
	if checked < 5 {
		t.Fatalf("checked %d ui packages; the walk did not find the faces", checked)
	}
}

// TestWorkersIsACoreLeaf keeps the package importable by transfer modules:
// it may use other core leaves and settings, never the engine, a transfer
// module or a face.
func TestWorkersIsACoreLeaf(t *testing.T) {
	p, err := build.Default.ImportDir(".", 0)
	if err != nil {
		t.Fatalf("read package: %v", err)
	}
	for _, imp := range p.Imports {
		switch {
		case !strings.HasPrefix(imp, "kvdock/"):
		case imp == "kvdock/settings":
		case strings.HasPrefix(imp, "kvdock/core/") && !strings.HasPrefix(imp, "kvdock/core/engine"):
		default:
			t.Errorf("core/workers imports %s: a core leaf imports only core leaves and settings", imp)
		}
	}
}
