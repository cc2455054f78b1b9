package ctl

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

// restartWait bounds how long `kvdock ctl restart` waits for the new
// process to answer /status: the old one's drain and stop, the exec, the
// adoption and the bind.
const restartWait = 30 * time.Second

// runRestart is `kvdock ctl restart`: the server stops keeping its pool and
// executes its binary again (what SIGUSR2 does), through the HTTP API's
// POST /restart behind its token. It asks first on a terminal (workers see
// a short gap), and without a terminal only with --yes. It then waits for
// the new process's /status and prints what it adopted and the gap.
func runRestart(f flagSet, params []string, env Env) int {
	stderr := env.Stderr
	cfg, base, code, ok := f.bareHTTPAPI(env, "restart", params)
	if !ok {
		return code
	}
	if code, ok := confirm(env, *f.yes, "restart", "restart", "restarted",
		fmt.Sprintf("Restart kvdock (%s) in place, keeping its cache? Workers wait for the gap.", base)); !ok {
		return code
	}
	before, _ := restartStatusOf(base, *f.timeout)
	url := base + "/restart"
	token, local := restartToken(cfg, env)
	_, code, err := postDecode(url, token, *f.timeout, "restart", func(rr *httpapi.RestartResult) bool { return rr.Status == "restarting" })
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl restart: %v\n", err)
		if local != nil && code != 0 && code != http.StatusOK {
			fmt.Fprintf(stderr, "kvdock ctl restart: no token set, and the server's local one could not be read: %v\n", local)
		}
		return 1
	}
	deadline := time.Now().Add(restartWait)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		st, err := restartStatusOf(base, *f.timeout)
		if err != nil || st.At == nil || (before.At != nil && !st.At.After(*before.At)) {
			continue // the old process, or nobody yet
		}
		if !st.Adopted {
			fmt.Fprintf(env.Stdout, "restarted, nothing adopted: %s\n", termtext.Clean(st.Reason))
			return 1
		}
		fmt.Fprintf(env.Stdout, "restarted: adopted %d objects (%s) and %d contexts, gap %d ms\n",
			st.AdoptedObjects, settings.BytesText(st.AdoptedBytes), st.AdoptedContexts, st.GapMS)
		return 0
	}
	fmt.Fprintf(stderr, "kvdock ctl restart: asked, but no restarted kvdock answered %s/status within %s; see its log\n", base, restartWait)
	return 1
}

// restartToken is the credential of a restart: the HTTP token of the
// settings layers, else the local token the server wrote in the state
// directory (a restart needs one even on loopback; httpapi/localtoken.go),
// with why that one could not be read.
func restartToken(cfg settings.Config, env Env) (string, error) {
	if cfg.HTTP.Token != "" {
		return cfg.HTTP.Token, nil
	}
	getenv := func(name string) string {
		for _, kv := range env.Environ {
			if k, v, ok := strings.Cut(kv, "="); ok && k == name {
				return v
			}
		}
		return ""
	}
	home := func() (string, error) {
		if h := getenv("HOME"); h != "" {
			return h, nil
		}
		return os.UserHomeDir()
	}
	dir, err := cfg.Server.StateDirPath(getenv, home)
	if err != nil {
		return "", err
	}
	tok, err := httpapi.ReadLocalToken(dir, cfg.HTTP.Port)
	if err != nil {
		return "", err
	}
	return tok, nil
}

// restartStatusOf reads the restart block of base's /status.
func restartStatusOf(base string, timeout time.Duration) (httpapi.RestartStatus, error) {
	body, err := statusFetch(base+"/status", timeout)
	if err != nil {
		return httpapi.RestartStatus{}, err
	}
	var st struct {
		Restart httpapi.RestartStatus `json:"restart"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return httpapi.RestartStatus{}, fmt.Errorf("%s/status: %w", base, err)
	}
	return st.Restart, nil
}
