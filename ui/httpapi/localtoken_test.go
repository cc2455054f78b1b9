package httpapi

import (
	"os"
	"path/filepath"
	"testing"
)

// TestHostileLocalTokenFile: the local token is written 0600 and read back;
// a token file readable by others, a link, or too long is refused.
func TestHostileLocalTokenFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	tok, err := WriteLocalToken(dir, 8080)
	if err != nil {
		t.Fatal(err)
	}
	path := LocalTokenFile(dir, 8080)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %v, %v; want mode 0600", fi.Mode(), err)
	}
	if got, err := ReadLocalToken(dir, 8080); err != nil || got != tok {
		t.Fatalf("read back %q, %v", got, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLocalToken(dir, 8080); err == nil {
		t.Fatal("a token file readable by others was read")
	}
	if err := os.Symlink(path, LocalTokenFile(dir, 8081)); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLocalToken(dir, 8081); err == nil {
		t.Fatal("a linked token file was read")
	}
	if err := os.WriteFile(LocalTokenFile(dir, 8082), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLocalToken(dir, 8082); err == nil {
		t.Fatal("a 4 KiB token file was read")
	}
}
