package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"kvdock/core/workers"
)

func TestShownNamesAreBoundedInJSON(t *testing.T) {
	plain := "meta-llama/Llama-3.1-8B-Instruct"
	if got := shown(plain, ShownNameBytes); got != plain {
		t.Fatalf("plain name shown as %q", got)
	}
	for _, name := range []string{
		strings.Repeat("\x01", 256),
		strings.Repeat("<", 256),
		strings.Repeat("\xff", 256),
		strings.Repeat("é", 128),
		strings.Repeat("a", 256),
	} {
		got := shown(name, ShownNameBytes)
		b, _ := json.Marshal(got)
		if len(b) > ShownNameBytes+len(`"…[256 bytes]"`) {
			t.Errorf("%q shown as %s: %d bytes of JSON", name[:8], b, len(b))
		}
		if !strings.HasSuffix(got, "…[256 bytes]") {
			t.Errorf("%q shown as %q: the cut is not noted", name[:8], got)
		}
	}
	if got := shown("a\nb", ShownNameBytes); got != "a?b" {
		t.Errorf("control character shown as %q", got)
	}
}

func TestDetailedKeepsTheMostRecentlyActiveInOrder(t *testing.T) {
	now := time.Now()
	cs := make([]workers.ContextInfo, MaxContextDetail+10)
	for i := range cs {
		cs[i] = workers.ContextInfo{InstanceID: int64(i), LastRequest: now.Add(time.Duration(i) * time.Second)}
	}
	got := detailed(cs)
	if len(got) != MaxContextDetail || got[0].InstanceID != 10 || got[len(got)-1].InstanceID != int64(len(cs)-1) {
		t.Fatalf("detailed %d contexts, %d..%d; want the %d most recent in id order", len(got), got[0].InstanceID, got[len(got)-1].InstanceID, MaxContextDetail)
	}
	if few := detailed(cs[:3]); len(few) != 3 {
		t.Fatalf("under the budget: %d of 3 detailed", len(few))
	}
}
