package tier

import (
	"strings"
	"testing"

	"kvdock/core/keys"
	"kvdock/core/layout"
)

// TestKeyCarriesGroup: a hybrid model's groups get their own backend keys
// (even with equal layouts), each under its own layout's fingerprint, and
// group 0 keeps the name every plain model has always had.
func TestKeyCarriesGroup(t *testing.T) {
	lay0, err := layout.New(2, 16, 4, "float16", false)
	if err != nil {
		t.Fatal(err)
	}
	lay1, err := layout.New(1, 16, 8, "float32", false)
	if err != nil {
		t.Fatal(err)
	}
	k := keys.ObjectKey{Model: "m", KVRank: keys.KVRank(1, 0)}
	k1 := k
	k1.Group = 1
	plain := Key(k, lay0)
	if strings.Contains(plain, "/g") || !strings.HasSuffix(plain, "@01000100@"+Fingerprint(lay0)) {
		t.Fatalf("group 0 key changed: %s", plain)
	}
	if Key(k1, lay0) == plain {
		t.Fatal("group 1 aliases group 0 under the same layout")
	}
	if g1 := Key(k1, lay1); !strings.Contains(g1, "@01000100/g1@"+Fingerprint(lay1)) {
		t.Fatalf("group 1 key: %s", g1)
	}
}
