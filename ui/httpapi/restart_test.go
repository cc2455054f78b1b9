package httpapi_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"kvdock/ui/httpapi"
)

// /status always carries the restart block; a start without a record says so.
func TestStatusRestartBlock(t *testing.T) {
	h := start(t, token)
	var raw map[string]json.RawMessage
	h.getJSON("/status", &raw)
	var r httpapi.RestartStatus
	if err := json.Unmarshal(raw["restart"], &r); err != nil {
		t.Fatalf("restart block %s: %v", raw["restart"], err)
	}
	if r.Adopted || !strings.Contains(r.Reason, "no restart record") {
		t.Fatalf("restart block %+v", r)
	}
	for _, k := range []string{"adopted", "adopted_objects", "adopted_bytes", "adopted_contexts", "gap_ms", "reason"} {
		if !strings.Contains(string(raw["restart"]), `"`+k+`"`) {
			t.Errorf("restart block lacks %s: %s", k, raw["restart"])
		}
	}
}

// POST /restart needs the token, then asks Options.Restart once; a second
// ask while one is under way is a conflict; without the option it is 501.
func TestRestartAsksTheProcess(t *testing.T) {
	asked := 0
	api := httpapi.New(fakeEngine{}, httpapi.Options{Token: "t", Restart: func() error {
		asked++
		if asked > 1 {
			return errors.New("a restart is already under way")
		}
		return nil
	}})
	post := func(hdr string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/restart", nil)
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		api.Handler().ServeHTTP(rec, req)
		return rec
	}
	if rec := post(""); rec.Code != http.StatusUnauthorized || asked != 0 {
		t.Fatalf("without the token: %d, asked %d", rec.Code, asked)
	}
	if rec := post("Bearer t"); rec.Code != http.StatusOK || asked != 1 {
		t.Fatalf("with the token: %d %s, asked %d", rec.Code, rec.Body, asked)
	}
	if rec := post("Bearer t"); rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "under way") {
		t.Fatalf("second ask: %d %s", rec.Code, rec.Body)
	}
	none := httpapi.New(fakeEngine{}, httpapi.Options{})
	rec := httptest.NewRecorder()
	none.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/api/restart", nil))
	if rec.Code != http.StatusNotImplemented {
		t.Fatalf("without Restart: %d", rec.Code)
	}
}
