package ctl

import (
	"fmt"
	"time"

	"kvdock/ui/httpapi"
)

// runResetStats is `kvdock ctl reset-stats`: the hit ratio, tokens saved,
// miss breakdown and what-if start again from now (after a benchmark run,
// say), through the HTTP API's POST /reset-stats behind its token. It does
// not ask first: the cache, the workers and the counters of the pool are
// untouched, and a script resetting after its own benchmark must not need
// a terminal.
func runResetStats(f flagSet, params []string, env Env) int {
	stderr := env.Stderr
	cfg, base, code, ok := f.bareHTTPAPI(env, "reset-stats", params)
	if !ok {
		return code
	}
	url := base + "/reset-stats"
	rr, _, err := postDecode(url, cfg.HTTP.Token, *f.timeout, "reset result", func(rr *httpapi.ResetResult) bool { return rr.Status == "ok" && rr.ResetAt != nil })
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl reset-stats: %v\n", err)
		return 1
	}
	fmt.Fprintf(env.Stdout, "statistics reset at %s: hit ratio, tokens saved, miss breakdown and what-if start again\n", rr.ResetAt.Local().Format(time.DateTime))
	return 0
}
