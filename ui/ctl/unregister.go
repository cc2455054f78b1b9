package ctl

import (
	"fmt"
	"strconv"

	"kvdock/core/logcap"
	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

// httpAPI checks the flags of a command sent to kvdock's HTTP API and
// loads the settings: the settings and the API's base URL, or the exit
// status when it cannot go on (the problem printed).
func (f flagSet) httpAPI(env Env, cmd string) (cfg settings.Config, base string, code int, ok bool) {
	if *f.timeout <= 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: --timeout %v must be positive\n", *f.timeout)
		return cfg, "", 2, false
	}
	if f.fs.Changed("json") {
		fmt.Fprintf(env.Stderr, "kvdock ctl: --json applies only to status\n%s\n", usageLine)
		return cfg, "", 2, false
	}
	cfg, err := f.load(env)
	if err != nil {
		fmt.Fprintf(env.Stderr, "kvdock ctl: %v\n", err)
		return cfg, "", 2, false
	}
	if cfg.HTTP.Port == 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl %s: needs kvdock's HTTP API, and --http-port is 0\n", cmd)
		return cfg, "", 2, false
	}
	return cfg, "http://" + settings.DialAddr(cfg.HTTP.Host, cfg.HTTP.Port), 0, true
}

// bareHTTPAPI is httpAPI for a command that takes no arguments.
func (f flagSet) bareHTTPAPI(env Env, cmd string, params []string) (cfg settings.Config, base string, code int, ok bool) {
	if !noArgs(env, cmd, params) {
		return cfg, "", 2, false
	}
	return f.httpAPI(env, cmd)
}

// runUnregister is `kvdock ctl unregister ID`: the operator removes a
// worker instance (one that died without unregistering, in a seed-era
// profile that never reaps) through the HTTP API's POST /unregister, behind
// its token. Like clear it asks first on a terminal and needs --yes
// elsewhere.
func runUnregister(f flagSet, params []string, env Env) int {
	stderr := env.Stderr
	if len(params) != 1 {
		fmt.Fprintf(stderr, "kvdock ctl: unregister takes exactly one instance id\n%s\n", usageLine)
		return 2
	}
	id, err := strconv.ParseInt(params[0], 10, 64)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl: unregister: instance id %q is not a 64-bit integer\n", logcap.Truncate(termtext.Clean(params[0]), 40))
		return 2
	}
	cfg, base, code, ok := f.httpAPI(env, "unregister")
	if !ok {
		return code
	}
	url := base + "/unregister?instance_id=" + strconv.FormatInt(id, 10)
	if code, ok := confirm(env, *f.yes, "unregister", "remove", "removed",
		fmt.Sprintf("Remove worker instance %d from kvdock? Its pending stores are aborted; a live worker must register again.", id)); !ok {
		return code
	}
	if _, _, err := postDecode(url, cfg.HTTP.Token, *f.timeout, "result", func(ur *httpapi.UnregisterResult) bool { return ur.Status == "ok" }); err != nil {
		fmt.Fprintf(stderr, "kvdock ctl unregister: %v\n", err)
		return 1
	}
	fmt.Fprintf(env.Stdout, "instance %d removed\n", id)
	return 0
}
