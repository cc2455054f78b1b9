package httpapi_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"kvdock/ui/httpapi"
)

// errorShape checks that body is {"status":"error","error":"…"} and
// nothing else, and returns the message.
func errorShape(t *testing.T, what string, code int, body []byte) string {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Errorf("%s: %d, not JSON: %s", what, code, body)
		return ""
	}
	msg, _ := doc["error"].(string)
	if keys := slices.Sorted(maps.Keys(doc)); !slices.Equal(keys, []string{"error", "status"}) || doc["status"] != "error" || msg == "" {
		t.Errorf("%s: %d %s; want exactly {\"status\":\"error\",\"error\":…}", what, code, body)
	}
	return msg
}

// TestErrorShapeOnEveryEndpoint: every endpoint, under / and /api/,
// answers its errors with one shape: a wrong method, a missing token, and
// each endpoint's own failures (an unknown instance, an engine that
// cannot clear, reset or restart).
func TestErrorShapeOnEveryEndpoint(t *testing.T) {
	h := start(t, "s3cret")
	auth := map[string]string{"Authorization": "Bearer s3cret"}
	for _, p := range []string{"/healthcheck", "/status", "/conf", "/metrics", "/clear-cache", "/unregister", "/reset-stats", "/restart"} {
		for _, path := range []string{p, "/api" + p} {
			r := h.do(http.MethodDelete, path, nil, auth)
			if r.code != http.StatusMethodNotAllowed {
				t.Errorf("DELETE %s = %d", path, r.code)
			}
			errorShape(t, "DELETE "+path, r.code, r.body)
			if p == "/clear-cache" || p == "/unregister" || p == "/reset-stats" || p == "/restart" {
				r = h.do(http.MethodPost, path, nil, nil)
				if r.code != http.StatusUnauthorized {
					t.Errorf("POST %s without a token = %d", path, r.code)
				}
				errorShape(t, "POST "+path+" without a token", r.code, r.body)
			}
		}
	}
	r := h.do(http.MethodGet, "/nope", nil, nil)
	errorShape(t, "GET /nope", r.code, r.body)
	for _, path := range []string{"/unregister?instance_id=777", "/unregister?instance_id=x", "/unregister"} {
		r = h.do(http.MethodPost, path, nil, auth)
		if r.code != http.StatusNotFound && r.code != http.StatusBadRequest {
			t.Errorf("POST %s = %d", path, r.code)
		}
		errorShape(t, "POST "+path, r.code, r.body)
	}
	// This server was not given a way to restart itself (kvdock serve gives one).
	r = h.do(http.MethodPost, "/restart", nil, auth)
	if r.code != http.StatusNotImplemented {
		t.Errorf("POST /restart = %d", r.code)
	}
	errorShape(t, "POST /restart", r.code, r.body)

	// An engine that cannot clear or reset.
	srv := httptest.NewServer(httpapi.New(fakeEngine{}, httpapi.Options{}).Handler())
	defer srv.Close()
	for _, path := range []string{"/clear-cache", "/reset-stats"} {
		res, err := http.Post(srv.URL+path, "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		var body json.RawMessage
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode < 500 {
			t.Errorf("POST %s on a fake engine = %d", path, res.StatusCode)
		}
		errorShape(t, "POST "+path+" (fake engine)", res.StatusCode, body)
	}
}

// TestMissingAndWrongTokenSayWhich: both are 401, with a message that says
// which mistake it was.
func TestMissingAndWrongTokenSayWhich(t *testing.T) {
	h := start(t, "s3cret")
	msgs := map[string]string{}
	for name, hdr := range map[string]map[string]string{
		"missing":    nil,
		"wrong":      {"Authorization": "Bearer nope"},
		"not bearer": {"Authorization": "Basic czNjcmV0"},
	} {
		r := h.do(http.MethodPost, "/clear-cache", nil, hdr)
		if r.code != http.StatusUnauthorized || r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s token: %d, WWW-Authenticate %q", name, r.code, r.header.Get("WWW-Authenticate"))
		}
		msgs[name] = errorShape(t, name+" token", r.code, r.body)
	}
	if !strings.Contains(msgs["missing"], "carries none") || !strings.Contains(msgs["wrong"], "does not match") ||
		!strings.Contains(msgs["not bearer"], "not a bearer token") {
		t.Errorf("messages do not say which: %q", msgs)
	}
	if msgs["missing"] == msgs["wrong"] || strings.Contains(msgs["wrong"], "s3cret") {
		t.Errorf("messages: %q", msgs)
	}
	if r := h.do(http.MethodPost, "/clear-cache", nil, map[string]string{"Authorization": "Bearer s3cret"}); r.code != http.StatusOK {
		t.Errorf("right token: %d %s", r.code, r.body)
	}
}
