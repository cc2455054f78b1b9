// Package httpjson reads a JSON document over HTTP for tests, such as a
// running kvdock's /status.
package httpjson

import (
	"encoding/json"
	"net/http"
	"testing"
)

// Get decodes the document at url into v; it fails t when the GET fails,
// the answer is not 200 OK or the body does not decode.
func Get(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
}
