package harness

import (
	"encoding/json"
	"path/filepath"
	"testing"
)

// RestartWorker is a running tests/interop/py/restart_worker.py: LMCache
// workers that live across kvdock restarts, driven by command lines
// (store, check, loop, stop) each answered with a RestartReport.
type RestartWorker struct{ *PyWorker }

// StartRestartWorker runs py/restart_worker.py against endpoint with its
// JSON parameters.
func StartRestartWorker(t testing.TB, endpoint, params string) *RestartWorker {
	t.Helper()
	script := filepath.Join(repoRoot(), "tests", "interop", "py", "restart_worker.py")
	return &RestartWorker{StartPyWorker(t, script, endpoint, params)}
}

// RestartReport is one answer of tests/interop/py/restart_worker.py.
type RestartReport struct {
	Ready      bool     `json:"ready"`
	Looping    bool     `json:"looping"`
	Modes      []string `json:"modes"`
	ShmName    string   `json:"shm_name"`
	Requests   int      `json:"requests"`
	Timeouts   int      `json:"timeouts"`
	Refused    int      `json:"refused"`
	Missed     int      `json:"missed"`
	Wrong      int      `json:"wrong"`
	Stores     int      `json:"stores"`
	Retrieves  int      `json:"retrieves"`
	SlowestS   float64  `json:"slowest_s"`
	Committed  int      `json:"committed"`
	Prompts    int      `json:"prompts"`
	Identical  int      `json:"identical"`
	Chunks     int      `json:"chunks"`
	Iterations int      `json:"iterations"`
	Seconds    float64  `json:"seconds"`
	Pings      []any    `json:"pings"`
	Failures   []struct {
		T   float64 `json:"t"`
		Op  string  `json:"op"`
		Why string  `json:"why"`
	} `json:"failures"`
}

// Failed is every request or operation that did not do what it asked.
func (r RestartReport) Failed() int { return r.Timeouts + r.Refused + r.Missed + r.Wrong }

// Ask sends one command line and decodes the answer.
func (w *RestartWorker) Ask(cmd string) RestartReport {
	w.t.Helper()
	w.Send(cmd)
	return w.Report()
}

// Report decodes the worker's next answer.
func (w *RestartWorker) Report() RestartReport {
	w.t.Helper()
	b, err := json.Marshal(w.Next())
	if err != nil {
		w.t.Fatal(err)
	}
	var r RestartReport
	if err := json.Unmarshal(b, &r); err != nil {
		w.t.Fatalf("worker line %s: %v", b, err)
	}
	return r
}

// StoreAll stores a batch under tag and requires every prompt to commit.
func (w *RestartWorker) StoreAll(tag string, want int) {
	w.t.Helper()
	r := w.Ask("store " + tag)
	if r.Committed != want || r.Failed() != 0 {
		w.t.Fatalf("store %s: %d of %d committed: %+v", tag, r.Committed, want, r)
	}
	for _, p := range r.Pings {
		if p != true {
			w.t.Fatalf("store %s: PING answered %v", tag, r.Pings)
		}
	}
}

// CheckAll requires every prompt committed so far to hit in full and come
// back identical, and returns how many prompts that is.
func (w *RestartWorker) CheckAll(after string) int {
	w.t.Helper()
	r := w.Ask("check")
	if r.Prompts == 0 || r.Identical != r.Prompts || r.Failed() != 0 {
		w.t.Fatalf("after %s: %d of %d prompts identical (%d missed, %d wrong, %d unanswered, %d refused); first failures %+v",
			after, r.Identical, r.Prompts, r.Missed, r.Wrong, r.Timeouts, r.Refused, r.Failures)
	}
	return r.Prompts
}
