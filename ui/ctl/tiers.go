package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"kvdock/core/logcap"
	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

// maxTiersAnswer bounds the /l2/keys answer ctl reads (keys are at most
// engine.MaxTierKeys per tier, each a few hundred bytes).
const maxTiersAnswer = 64 << 20

// runTiers is `kvdock ctl tiers`: each L2 tier with its state and object
// count, and with --keys N up to N of its keys (GET /l2/keys).
func runTiers(f flagSet, params []string, env Env) int {
	if len(params) > 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: tiers takes no arguments (--tier picks one)\n%s\n", usageLine)
		return 2
	}
	if *f.keys < 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl: --keys %d must be 0 or more\n", *f.keys)
		return 2
	}
	_, base, code, ok := f.httpAPI(env, "tiers")
	if !ok {
		return code
	}
	q := url.Values{"limit": {strconv.Itoa(*f.keys)}}
	if *f.tier != "" {
		q.Set("tier", *f.tier)
	}
	u := base + "/l2/keys?" + q.Encode()
	status, body, err := sendHTTP(http.MethodGet, u, "", *f.timeout, maxTiersAnswer)
	if err == nil {
		err = httpFailure(u, status, body)
	}
	var res httpapi.L2KeysResult
	if err == nil && json.Unmarshal(body, &res) != nil {
		err = fmt.Errorf("%s did not answer a kvdock tier listing: %q", u, logcap.Truncate(termtext.Clean(string(body)), 200))
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "kvdock ctl tiers: %v\n", err)
		return 1
	}
	if len(res.Tiers) == 0 {
		fmt.Fprintln(env.Stdout, "no L2 tier is configured")
		return 0
	}
	failed := false
	for _, t := range res.Tiers {
		head := fmt.Sprintf("tier %d  %s  %s  %s", t.Index, termtext.Clean(t.Type), termtext.Clean(t.Target), termtext.Clean(t.State))
		if t.Error != "" {
			failed = true
			fmt.Fprintf(env.Stdout, "%s  keys not listed: %s\n", head, logcap.Truncate(termtext.Clean(t.Error), 300))
			continue
		}
		fmt.Fprintf(env.Stdout, "%s  %d object(s)\n", head, t.Total)
		for _, k := range t.Keys {
			fmt.Fprintf(env.Stdout, "  %s\n", termtext.Clean(k))
		}
		if n := t.Total - int64(len(t.Keys)); *f.keys > 0 && n > 0 {
			fmt.Fprintf(env.Stdout, "  … %d more (--keys N lists more)\n", n)
		}
	}
	if failed {
		return 1
	}
	return 0
}

// runClearTier is `kvdock ctl clear --tier NAME|all`: DELETE
// /cache/objects?tier=NAME, which removes only kvdock's own files or keys
// of the tier (and, for all, L1 as well).
func runClearTier(cfg settings.Config, f flagSet, env Env) int {
	if cfg.HTTP.Port == 0 {
		fmt.Fprintf(env.Stderr, "kvdock ctl clear --tier: needs kvdock's HTTP API, and --http-port is 0\n")
		return 2
	}
	u := "http://" + settings.DialAddr(cfg.HTTP.Host, cfg.HTTP.Port) + "/cache/objects?" + url.Values{"tier": {*f.tier}}.Encode()
	what := "L2 tier " + termtext.Clean(*f.tier)
	switch *f.tier {
	case "all":
		what = "the L1 pool and every L2 tier"
	case "l2":
		what = "every L2 tier"
	case "l1":
		what = "the L1 pool"
	}
	if code, ok := confirm(env, *f.yes, "clear", "clear", "cleared",
		fmt.Sprintf("Clear every object kvdock keeps in %s (%s)? Only kvdock's own files and keys go; workers will recompute what they miss.", what, u)); !ok {
		return code
	}
	status, body, err := sendHTTP(http.MethodDelete, u, cfg.HTTP.Token, *f.timeout, 64<<10)
	if err == nil {
		err = httpFailure(u, status, body)
	}
	var res httpapi.ObjectsClearResult
	if err == nil && (json.Unmarshal(body, &res) != nil || res.Status == "") {
		err = fmt.Errorf("%s did not answer a kvdock clear result: %q", u, logcap.Truncate(termtext.Clean(string(body)), 200))
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "kvdock ctl clear: %v\n", err)
		return 1
	}
	if res.L1 != nil {
		fmt.Fprintf(env.Stdout, "L1: cleared %d objects (%s)\n", res.L1.Objects, settings.BytesText(res.L1.Bytes))
	}
	code := 0
	for _, t := range res.L2 {
		line := fmt.Sprintf("tier %d (%s %s): cleared %d objects (%s)", t.Index, termtext.Clean(t.Type), termtext.Clean(t.Target), t.Objects, settings.BytesText(t.Bytes))
		if t.Error != "" {
			line += "; failed: " + logcap.Truncate(termtext.Clean(t.Error), 300)
			code = 1
		}
		fmt.Fprintln(env.Stdout, line)
	}
	return code
}

// sendHTTP sends a body-less request to kvdock's HTTP API as kvdock ctl
// (with the token when given) and returns the status and at most limit
// bytes of the body.
func sendHTTP(method, url, token string, timeout time.Duration, limit int64) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("User-Agent", httpapi.CtlAgent)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("kvdock's HTTP API does not answer at %s: %w\n"+
			"(is kvdock running, with this --http-port?)", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, limit))
	if err != nil {
		return 0, nil, fmt.Errorf("reading the answer of %s: %w", url, err)
	}
	return res.StatusCode, body, nil
}
