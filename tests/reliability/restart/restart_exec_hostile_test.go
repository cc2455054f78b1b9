package restart

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"kvdock/tests/harness"
)

// keptPrompt stores a prompt of chunks chunks on srv through a worker
// registered under id, and returns a check that it is still all there,
// byte for byte.
func keptPrompt(t *testing.T, srv *harness.Server, id int64, chunks int) func(when string) {
	t.Helper()
	c := srv.Dial(t, srv.Protocol)
	w := harness.NewWorker(t, c, id, "exec-model", false)
	toks := harness.Tokens(int(id), chunks, w.Chunk)
	data := make([][]byte, chunks)
	for i := range data {
		data[i] = harness.ChunkData(int(id), i, w.ChunkBytes)
	}
	ctx := context.Background()
	if got, err := w.Store(ctx, toks, data, "exec-store"); err != nil || got != "true" {
		t.Fatalf("store: %s %v", got, err)
	}
	n := 0
	return func(when string) {
		t.Helper()
		n++
		ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		got, err := w.Retrieve(ctx, toks, chunks, fmt.Sprintf("exec-read-%d", n))
		if err != nil || len(got) != chunks {
			t.Fatalf("%s: read %d of %d chunks (%v)\n%s", when, len(got), chunks, err, srv.Output())
		}
		for i := range got {
			if !bytes.Equal(got[i], data[i]) {
				t.Fatalf("%s: chunk %d differs", when, i)
			}
		}
	}
}

// waitLog polls srv's output for want (15 s at most); it fails when the
// server exits first.
func waitLog(t *testing.T, srv *harness.Server, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(srv.Output(), want) {
		if done, err := srv.Exited(); done {
			t.Fatalf("kvdock exited (%v) before logging %q\n%s", err, want, srv.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log within 15 s\n%s", want, srv.Output())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// servesUnrestarted checks that srv runs, answers NOOP and was not restarted
// since started (the /status started_at of the process that served then).
func servesUnrestarted(t *testing.T, srv *harness.Server, pid int, started string) {
	t.Helper()
	if done, err := srv.Exited(); done {
		t.Fatalf("kvdock exited (%v)\n%s", err, srv.Output())
	}
	if err := srv.WaitReady(15 * time.Second); err != nil {
		t.Fatalf("kvdock does not answer: %v\n%s", err, srv.Output())
	}
	if srv.PID() != pid {
		t.Fatalf("pid %d, want %d", srv.PID(), pid)
	}
	if got := srv.Status(t).StartedAt; started != "" && got.String() != started {
		t.Fatalf("the server restarted (started_at %s, was %s): a refused restart stops nothing\n%s", got, started, srv.Output())
	}
}

// TestHostileSIGUSR2StormKeepsServing: SIGUSR2 sent 2, 20 and 100 ms
// apart (each followed by a SIGHUP), over at least 20 restarts each,
// while each new image starts. SIGUSR2 and SIGHUP are ignored from the
// moment the exec begins until the new image handles them, so none kills
// the process (the bug: SIGUSR2's default action ended kvdock within 1–10
// restarts): it answers after every storm, same pid, with the prompt
// stored before the first.
func TestHostileSIGUSR2StormKeepsServing(t *testing.T) {
	srv := harness.StartKeeping(t, false)
	check := keptPrompt(t, srv, 2301, 4)
	pid := srv.PID()
	for _, gap := range []time.Duration{2 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond} {
		before := strings.Count(srv.Output(), "restart: executing")
		deadline := time.Now().Add(40 * time.Second)
		for strings.Count(srv.Output(), "restart: executing")-before < 20 {
			if done, err := srv.Exited(); done {
				t.Fatalf("%v apart: kvdock exited (%v) after %d restarts\n%s", gap, err,
					strings.Count(srv.Output(), "restart: executing")-before, srv.Output())
			}
			if time.Now().After(deadline) {
				t.Fatalf("%v apart: %d restarts in 40 s\n%s", gap, strings.Count(srv.Output(), "restart: executing")-before, srv.Output())
			}
			_ = syscall.Kill(pid, syscall.SIGUSR2)
			time.Sleep(gap) // the storm's pace, not a wait for a state
			// A SIGHUP (reload) in the exec window must not end it either.
			_ = syscall.Kill(pid, syscall.SIGHUP)
		}
		servesUnrestarted(t, srv, pid, "")
		check(fmt.Sprintf("after the storm %v apart", gap))
	}
	// The image that inherited SIGHUP ignored took it back: a reload runs.
	reloads := strings.Count(srv.Output(), "SIGHUP: settings unchanged")
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for strings.Count(srv.Output(), "SIGHUP: settings unchanged") == reloads {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP after the storms did not reload\n%s", srv.Output())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// restartOverHTTP is POST /restart with token: the status code and body.
func restartOverHTTP(t *testing.T, srv *harness.Server, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/restart", srv.HTTPPort), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("POST /restart: %v\n%s", err, srv.Output())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestHostileSIGUSR2BadSettingsKeepsServing: a typo in the settings file,
// then SIGUSR2 and `kvdock ctl restart` (POST /restart). The new settings
// are loaded and validated before anything stops, as SIGHUP does, so both
// are refused with the reason and the server serves on with its pool
// (the bug: SIGUSR2 stopped, kept the pool and the new image exited 2).
// Once the file is mended the restart happens.
func TestHostileSIGUSR2BadSettingsKeepsServing(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("log:\n  level: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "exec-token"
	srv := harness.StartKeeping(t, false, "--config", file, "--http-token", token)
	check := keptPrompt(t, srv, 2302, 3)
	pid := srv.PID()
	started := srv.Status(t).StartedAt.String()
	if err := os.WriteFile(file, []byte("log:\n  levle: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	waitLog(t, srv, "restart refused")
	servesUnrestarted(t, srv, pid, started)
	if !strings.Contains(srv.Output(), "levle") {
		t.Fatalf("the refusal does not name the bad key\n%s", srv.Output())
	}
	check("after SIGUSR2 with a bad settings file")

	code, body := restartOverHTTP(t, srv, token)
	if code != http.StatusConflict || !strings.Contains(body, "levle") {
		t.Fatalf("POST /restart with a bad settings file: %d %s", code, body)
	}
	servesUnrestarted(t, srv, pid, started)
	check("after POST /restart with a bad settings file")

	if err := os.WriteFile(file, []byte("log:\n  level: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.RestartSignal(t)
	if r := srv.LastRestart(t); !r.Adopted {
		t.Fatalf("restart after mending the file did not adopt: %+v", r)
	}
	check("after the restart with the file mended")
}

// TestHostileSIGUSR2BrokenBinaryKeepsServing: the binary at the server's
// path made non-executable, replaced by one that does not run, or deleted,
// then SIGUSR2. The binary is checked (it runs `--version`) before
// anything stops, so each is refused with the reason and the server
// serves on with its pool (the bug: the exec failed after the stop and
// kvdock exited 1). With the binary back, the restart happens.
func TestHostileSIGUSR2BrokenBinaryKeepsServing(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kvdock")
	orig, err := os.ReadFile(harness.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	put := func(data []byte, mode os.FileMode) {
		t.Helper()
		_ = os.Remove(bin) // a new inode: the running one stays as it was
		if err := os.WriteFile(bin, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	put(orig, 0o755)
	srv := harness.StartKeepingFrom(t, bin, false)
	check := keptPrompt(t, srv, 2303, 3)
	pid := srv.PID()
	for _, c := range []struct {
		name   string
		break_ func()
	}{
		{"not executable", func() { put(orig, 0o644) }},
		{"not a program", func() { put([]byte("#!/bin/sh\nexit 3\n"), 0o755) }},
		{"deleted", func() { _ = os.Remove(bin) }},
	} {
		started := srv.Status(t).StartedAt.String()
		refusals := strings.Count(srv.Output(), "restart refused")
		c.break_()
		if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for strings.Count(srv.Output(), "restart refused") == refusals {
			if done, err := srv.Exited(); done {
				t.Fatalf("binary %s: kvdock exited (%v)\n%s", c.name, err, srv.Output())
			}
			if time.Now().After(deadline) {
				t.Fatalf("binary %s: no refusal within 15 s\n%s", c.name, srv.Output())
			}
			time.Sleep(10 * time.Millisecond)
		}
		servesUnrestarted(t, srv, pid, started)
		check("binary " + c.name)
		put(orig, 0o755)
		srv.RestartSignal(t)
		if r := srv.LastRestart(t); !r.Adopted {
			t.Fatalf("restart with the binary back did not adopt: %+v\n%s", r, srv.Output())
		}
		check("binary back after " + c.name)
	}
}

// TestHostileConcurrentStartsOnAKeptPool: two kvdocks started at once with
// the same command line on one kept pool, over 10 rounds with a named
// segment and 10 with an auto one. The start lock in the state directory,
// held from taking the record until the wire server is bound, lets
// exactly one adopt; the other is refused with the reason and the kept
// cache is intact (the bug: now and then the one that found no record
// removed the kept segment as stale and started cold, and the adopter
// died).
func TestHostileConcurrentStartsOnAKeptPool(t *testing.T) {
	reasons := []string{"another kvdock is starting", "held by a live process", "address already in use"}
	for _, auto := range []bool{false, true} {
		t.Run(fmt.Sprintf("auto=%v", auto), func(t *testing.T) {
			srv := harness.StartKeeping(t, auto)
			check := keptPrompt(t, srv, 2304, 3)
			for round := range 10 {
				srv.StopKept(t)
				a, b := srv.Launch(t), srv.Launch(t)
				deadline := time.Now().Add(20 * time.Second)
				var winner, loser *harness.Server
				for winner == nil {
					if time.Now().After(deadline) {
						t.Fatalf("round %d: neither start exited within 20 s\nA:\n%s\nB:\n%s", round, a.Output(), b.Output())
					}
					if done, _ := a.Exited(); done {
						winner, loser = b, a
					} else if done, _ := b.Exited(); done {
						winner, loser = a, b
					} else {
						time.Sleep(10 * time.Millisecond)
					}
				}
				if _, err := loser.Exited(); err == nil {
					t.Fatalf("round %d: the start that lost exited 0\n%s", round, loser.Output())
				}
				said := false
				for _, r := range reasons {
					if strings.Contains(strings.ToLower(loser.Output()), r) {
						said = true
						t.Logf("round %d: the other start: %s", round, r)
					}
				}
				if !said {
					t.Fatalf("round %d: the start that lost does not say why\n%s", round, loser.Output())
				}
				if err := winner.WaitReady(15 * time.Second); err != nil {
					t.Fatalf("round %d: no server left: %v\nwinner:\n%s\nloser:\n%s", round, err, winner.Output(), loser.Output())
				}
				if r := winner.LastRestart(t); !r.Adopted || r.AdoptedObjects < 3 {
					t.Fatalf("round %d: the server left did not adopt the kept pool: %+v\nwinner:\n%s\nloser:\n%s", round, r, winner.Output(), loser.Output())
				}
				srv = winner
			}
			check("after the concurrent starts")
		})
	}
}

// TestHostileRestartOnLoopbackNeedsTheLocalToken: with no token set (the
// loopback default), any local process could POST /restart and interrupt
// every worker. A restart needs a credential even there: POST /restart
// without one, or with a wrong one, is refused (401, the same pid, no
// restart), while `kvdock ctl restart` reads the local token the server
// wrote in its state directory (mode 0600) and restarts it. /reset-stats
// stays open on loopback.
func TestHostileRestartOnLoopbackNeedsTheLocalToken(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	srv := harness.Start(t, "--state-dir", state)
	pid := srv.PID()
	post := func(path, auth string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", srv.HTTPPort, path), nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer guess"} {
		if code, body := post("/restart", auth); code != http.StatusUnauthorized {
			t.Fatalf("POST /restart with %q: %d %s", auth, code, body)
		}
	}
	if srv.PID() != pid || strings.Contains(srv.Output(), "restarting in place") {
		t.Fatalf("a refused restart restarted the server\n%s", srv.Output())
	}
	if code, body := post("/reset-stats", ""); code != http.StatusOK {
		t.Fatalf("POST /reset-stats on loopback without a token: %d %s", code, body)
	}
	tokenFile := filepath.Join(state, fmt.Sprintf("http-%d.token", srv.HTTPPort))
	fi, err := os.Stat(tokenFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("local token file %s: %v, %v; want mode 0600", tokenFile, fi, err)
	}
	gap := srv.RestartBy(t, func() error {
		cmd := exec.Command(harness.Binary(t), "ctl", "--http-port", fmt.Sprint(srv.HTTPPort), "--yes", "restart")
		cmd.Env = append(os.Environ(), "KVDOCK_CONFIG=", "KVDOCK_STATE_DIR="+state, "KVDOCK_HTTP_TOKEN=")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "restarted") {
			return fmt.Errorf("kvdock ctl restart: %v\n%s", err, out)
		}
		return nil
	})
	t.Logf("POST /restart without a credential: 401 twice; kvdock ctl restart with the local token: restarted, gap %v", gap)
	if srv.PID() != pid {
		t.Fatalf("pid changed: %d -> %d", pid, srv.PID())
	}
}
