//go:build torch2

package torchpickle

// Built only with -tags torch2 (task test:torch2): these tests need the
// Debian trixie root of scripts/torch2-env.sh, which CI does not build.

import (
	"os"
	"testing"
)

// TestInteropWithTorch2 has torch 2.x load every pickle kvdock encodes
// (torch.equal against the source bytes, float8 included) and decodes fresh
// torch 2.x pickles. It needs KVDOCK_TORCH2_PYTHON (task test:torch2).
func TestInteropWithTorch2(t *testing.T) {
	py := os.Getenv(torch2PythonEnv)
	if py == "" {
		t.Fatalf("%s not set: run `task test:torch2` (scripts/torch2-env.sh), which builds the torch 2.x root and sets it", torch2PythonEnv)
	}
	runInterop(t, py, append(encodeCases(), float8Cases()...))
}
