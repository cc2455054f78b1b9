package ctl

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"kvdock/core/logcap"
	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

// runClear is `kvdock ctl clear`. It asks first on a terminal; elsewhere it
// clears only with --yes, because a script must neither hang on a question
// nobody answers nor destroy the cache by default. It clears through the
// HTTP API, whose answer says what went (and whose token protects it);
// with the API off (--http-port 0) it sends the ZMQ CLEAR, which answers
// nothing to count.
func runClear(l *settings.Loaded, r wireRequest, f flagSet, env Env) int {
	stderr := env.Stderr
	cfg := l.Config
	if *f.tier != "" {
		return runClearTier(cfg, f, env)
	}
	viaHTTP := cfg.HTTP.Port != 0
	target := "tcp://" + settings.DialAddr(cfg.Server.Host, cfg.Server.Port)
	url := ""
	if viaHTTP {
		url = "http://" + settings.DialAddr(cfg.HTTP.Host, cfg.HTTP.Port) + "/clear-cache"
		target = url
	}
	if code, ok := confirm(env, *f.yes, "clear", "clear", "cleared",
		fmt.Sprintf("Clear every object in kvdock's cache (%s)? Workers will recompute what they miss.", target)); !ok {
		return code
	}
	if !viaHTTP {
		t := targetOf(cfg, l.Sources["server.protocol"], *f.timeout)
		if _, code := callWire(cfg, t, r, *f.timeout, stderr); code != 0 {
			return code
		}
		fmt.Fprintln(env.Stdout, "cleared (over ZMQ CLEAR, which does not say what went: the HTTP API is off)")
		return 0
	}
	res, err := clearHTTP(url, cfg.HTTP.Token, *f.timeout)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl clear: %v\n", err)
		return 1
	}
	fmt.Fprintf(env.Stdout, "cleared %d objects (%s)\n", res.Objects, settings.BytesText(res.Bytes))
	return 0
}

// clearHTTP posts /clear-cache and returns its answer.
func clearHTTP(url, token string, timeout time.Duration) (httpapi.ClearResult, error) {
	cr, code, err := postDecode(url, token, timeout, "clear result", func(cr *httpapi.ClearResult) bool { return cr.Status == "ok" })
	if err != nil && code == 0 {
		return cr, fmt.Errorf("%w\n(--http-port 0 clears over ZMQ instead, without counts)", err)
	}
	return cr, err
}

// postHTTP posts to one of kvdock's mutating endpoints as kvdock ctl, with
// the token, and returns the status and (at most 64 KiB of) the body.
func postHTTP(url, token string, timeout time.Duration) (int, []byte, error) {
	return sendHTTP(http.MethodPost, url, token, timeout, 64<<10)
}

// postDecode posts to url (postHTTP) and decodes the answer into a T. The
// error is the post's (code 0: no answer), the server's refusal
// (httpFailure), or that the body is not a kvdock answer of its kind (what,
// as "clear result"), which ok tells from the decoded T.
func postDecode[T any](url, token string, timeout time.Duration, what string, ok func(*T) bool) (T, int, error) {
	var v T
	code, body, err := postHTTP(url, token, timeout)
	if err != nil {
		return v, 0, err
	}
	decodeErr := json.Unmarshal(body, &v)
	if err := httpFailure(url, code, body); err != nil {
		return v, code, err
	}
	if decodeErr != nil || !ok(&v) {
		return v, code, fmt.Errorf("%s did not answer a kvdock %s: %q", url, what, logcap.Truncate(termtext.Clean(string(body)), 200))
	}
	return v, code, nil
}

// httpFailure explains a non-200 answer (nil for 200): the token, or the
// server's reason (every kvdock error answer is an httpapi.ErrorBody).
func httpFailure(url string, code int, body []byte) error {
	switch code {
	case http.StatusOK:
		return nil
	case http.StatusUnauthorized:
		return fmt.Errorf("%s refused: kvdock requires its HTTP token; set KVDOCK_HTTP_TOKEN (or http.token in the settings file) to it", url)
	}
	reason := ""
	var eb httpapi.ErrorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
		reason = eb.Error
	}
	return fmt.Errorf("%s: HTTP %d: %s", url, code, logcap.Truncate(termtext.Clean(reason), 200))
}

// confirm asks question on env's terminal unless yes was given: ok when the
// operator answered y. Otherwise it says what was not done ("kvdock ctl
// clear: not cleared"; verb and done are "clear" and "cleared") and returns
// the exit status: 2 with no terminal to ask on, 1 for any answer but y.
func confirm(env Env, yes bool, cmd, verb, done, question string) (code int, ok bool) {
	if yes {
		return 0, true
	}
	if !env.Terminal {
		fmt.Fprintf(env.Stderr, "kvdock ctl %s: not %s: there is no terminal to ask on; add --yes to %s without asking\n", cmd, done, verb)
		return 2, false
	}
	fmt.Fprintf(env.Stderr, "%s [y/N] ", question)
	// A line is an answer; whatever else arrives is not read.
	ans, _ := bufio.NewReader(io.LimitReader(env.Stdin, 256)).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(ans)) {
	case "y", "yes":
		return 0, true
	}
	fmt.Fprintf(env.Stderr, "kvdock ctl %s: not %s\n", cmd, done)
	return 1, false
}
