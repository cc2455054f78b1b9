package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// childServer is a kvdock server the bench started as a separate process
// (--server-process), so that its peak RSS and CPU time are the server's
// alone: in process, the workers' own message buffers count in.
type childServer struct {
	cmd  *exec.Cmd
	dir  string
	port int
	http int
}

// startChild starts this executable as a headless kvdock on free loopback
// ports with an empty settings file, a pool of pool bytes and SHM on
// (a segment name of its own) or off, and extra flags, and waits until its
// pool is prefaulted.
func startChild(ctx context.Context, o Options, mode string, pool int64, extra ...string) (*childServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("server process: %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	hport, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kvdock-bench-server-")
	if err != nil {
		return nil, fmt.Errorf("server process: %w", err)
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, nil, 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("server process: %w", err)
	}
	shm := ""
	if mode == "shm" {
		shm = fmt.Sprintf("kvdock_bench_srv_%d_%d", os.Getpid(), time.Now().UnixNano()%1e9)
	}
	lay, err := o.Model.chunkLayout(inProcessChunkTokens)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	args := []string{
		"--config", cfgPath, "--headless", "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--http-host", "127.0.0.1", "--http-port", strconv.Itoa(hport), "--shm-name", shm,
		"--l1-size-gb", strconv.FormatFloat(float64(pool)/(1<<30), 'f', -1, 64),
		"--max-message-bytes", strconv.FormatInt(max(1<<30, int64(o.Chunks)*lay.Bytes*2+(1<<20)), 10),
		"--protocol", o.Protocol, "--log-level", "warn", "--log-file", filepath.Join(dir, "kvdock.log"),
	}
	args = append(args, extra...)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+dir, "XDG_STATE_HOME="+dir)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("server process: %w", err)
	}
	c := &childServer{cmd: cmd, dir: dir, port: port, http: hport}
	if err := c.waitReady(ctx, 60*time.Second); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// waitReady polls /status until the pool is prefaulted in full.
func (c *childServer) waitReady(ctx context.Context, limit time.Duration) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/status", c.http)
	deadline := time.Now().Add(limit)
	exited := make(chan error, 1)
	go func() { exited <- c.cmd.Wait() }()
	for {
		var st struct {
			Pool struct {
				Capacity   int64 `json:"capacity_bytes"`
				Prefaulted int64 `json:"prefaulted_bytes"`
			} `json:"pool"`
		}
		if resp, err := http.Get(url); err == nil {
			err = json.NewDecoder(resp.Body).Decode(&st)
			_ = resp.Body.Close()
			if err == nil && st.Pool.Capacity > 0 && st.Pool.Prefaulted >= st.Pool.Capacity {
				go func() { <-exited }() // reaped when it ends
				return nil
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(c.dir, "kvdock.log"))
			return fmt.Errorf("server process exited before it was ready (%v): %s", err, tail(string(log), 2000))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("server process: pool not prefaulted within " + limit.String())
		}
	}
}

// stop ends the server (SIGTERM, then SIGKILL after 10 s) and removes its files.
func (c *childServer) stop() {
	p := c.cmd.Process
	_ = p.Signal(syscall.SIGTERM)
	for i := 0; i < 200 && p.Signal(syscall.Signal(0)) == nil; i++ {
		time.Sleep(50 * time.Millisecond)
	}
	_ = p.Kill()
	_ = os.RemoveAll(c.dir)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// executeInChild runs the one requested mode against a server process
// started for it (--server-process), as against any target server.
func executeInChild(ctx context.Context, o Options) (*Result, error) {
	lay, err := o.Model.chunkLayout(inProcessChunkTokens)
	if err != nil {
		return nil, err
	}
	o.progress.setPhase("starting the server process", "")
	c, err := startChild(ctx, o, o.Mode, poolFor(o, lay.Bytes))
	if err != nil {
		return nil, err
	}
	defer c.stop()
	o.Host, o.Port, o.HTTPHost, o.HTTPPort, o.ServerPID = "127.0.0.1", c.port, "127.0.0.1", c.http, c.cmd.Process.Pid
	res, err := Execute(ctx, o)
	if res != nil {
		res.Config.ServerProcess = true
		res.Notes = append(res.Notes, "server process: the bench started the server as a separate kvdock process (--server-process) with an empty settings file; CPU and peak RSS are that process's alone")
	}
	return res, err
}
