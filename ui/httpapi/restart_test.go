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
	none := httpapi.New(fakeEngine{}, httpapi.Options{LocalToken: "l"})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/api/restart", nil)
	req.Header.Set("Authorization", "Bearer l")
	none.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusNotImplemented {
		t.Fatalf("without Restart: %d", rec.Code)
	}
}

// TestHostileRestartNeedsACredentialWithoutToken: with no token set (the
// loopback default) a restart still needs one: the local token, else it is
// refused; the other mutating endpoints stay open there.
func TestHostileRestartNeedsACredentialWithoutToken(t *testing.T) {
	asked := 0
	ask := func() error { asked++; return nil }
	post := func(api *httpapi.Server, path, hdr string) int {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, nil)
		if hdr != "" {
			req.Header.Set("Authorization", hdr)
		}
		api.Handler().ServeHTTP(rec, req)
		return rec.Code
	}
	noLocal := httpapi.New(fakeEngine{}, httpapi.Options{Restart: ask})
	local := httpapi.New(fakeEngine{}, httpapi.Options{Restart: ask, LocalToken: "local"})
	for _, c := range []struct {
		api  *httpapi.Server
		hdr  string
		want int
	}{
		{noLocal, "", http.StatusUnauthorized},
		{noLocal, "Bearer ", http.StatusUnauthorized},
		{local, "", http.StatusUnauthorized},
		{local, "Bearer other", http.StatusUnauthorized},
		{local, "Bearer local", http.StatusOK},
	} {
		if code := post(c.api, "/restart", c.hdr); code != c.want {
			t.Errorf("POST /restart %q: %d, want %d", c.hdr, code, c.want)
		}
	}
	if asked != 1 {
		t.Errorf("the process was asked %d times, want once (with the local token)", asked)
	}
	if code := post(local, "/reset-stats", ""); code == http.StatusUnauthorized {
		t.Errorf("POST /reset-stats without a token on loopback: %d", code)
	}
}
