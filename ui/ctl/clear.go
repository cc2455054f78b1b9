package ctl

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"kvdock/assets"
	"kvdock/core/logcap"
	"kvdock/core/protocol"
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
func runClear(cfg settings.Config, f flagSet, env Env) int {
	stderr := env.Stderr
	viaHTTP := cfg.HTTP.Port != 0
	target := "tcp://" + net.JoinHostPort(dialHost(cfg.Server.Host), strconv.Itoa(cfg.Server.Port))
	url := ""
	if viaHTTP {
		url = "http://" + net.JoinHostPort(dialHost(cfg.HTTP.Host), strconv.Itoa(cfg.HTTP.Port)) + "/clear-cache"
		target = url
	}
	if !*f.yes {
		if !env.Terminal {
			fmt.Fprintln(stderr, "kvdock ctl clear: not cleared: there is no terminal to ask on; add --yes to clear without asking")
			return 2
		}
		fmt.Fprintf(stderr, "Clear every object in kvdock's cache (%s)? Workers will recompute what they miss. [y/N] ", target)
		// A line is an answer; whatever else arrives is not read.
		ans, _ := bufio.NewReader(io.LimitReader(env.Stdin, 256)).ReadString('\n')
		switch strings.ToLower(strings.TrimSpace(ans)) {
		case "y", "yes":
		default:
			fmt.Fprintln(stderr, "kvdock ctl clear: not cleared")
			return 1
		}
	}
	if !viaHTTP {
		prof, err := assets.Profile(cfg.Server.ClientProtocol())
		if err != nil {
			fmt.Fprintf(stderr, "kvdock ctl: --protocol: %v\n", err)
			return 2
		}
		if _, addr, err := call(cfg, prof, *f.timeout, protocol.Clear); err != nil {
			explainCallError(stderr, "clear", addr, prof.Name, *f.timeout, err)
			return 1
		}
		fmt.Fprintln(env.Stdout, "cleared (over ZMQ CLEAR, which does not say what went: the HTTP API is off)")
		return 0
	}
	res, err := clearHTTP(url, cfg.HTTP.Token, *f.timeout)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl clear: %v\n", err)
		return 1
	}
	fmt.Fprintf(env.Stdout, "cleared %d objects (%s)\n", res.Objects, statusBytes(res.Bytes))
	return 0
}

// clearHTTP posts /clear-cache and returns its answer.
func clearHTTP(url, token string, timeout time.Duration) (httpapi.ClearResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return httpapi.ClearResult{}, err
	}
	req.Header.Set("User-Agent", httpapi.CtlAgent)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return httpapi.ClearResult{}, fmt.Errorf("kvdock's HTTP API does not answer at %s: %w\n"+
			"(is kvdock running, with this --http-port? --http-port 0 clears over ZMQ instead, without counts)", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if err != nil {
		return httpapi.ClearResult{}, fmt.Errorf("reading the answer of %s: %w", url, err)
	}
	var cr httpapi.ClearResult
	decodeErr := json.Unmarshal(body, &cr)
	switch {
	case res.StatusCode == http.StatusUnauthorized:
		return cr, fmt.Errorf("%s refused: kvdock requires its HTTP token; set KVDOCK_HTTP_TOKEN (or http.token in the settings file) to it", url)
	case res.StatusCode != http.StatusOK:
		var eb httpapi.ErrorBody
		why := cr.Reason
		if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
			why = eb.Error
		}
		return cr, fmt.Errorf("%s: HTTP %d: %s", url, res.StatusCode, logcap.Truncate(termtext.Clean(why), 200))
	case decodeErr != nil || cr.Status != "ok":
		return cr, fmt.Errorf("%s did not answer a kvdock clear result: %q", url, logcap.Truncate(termtext.Clean(string(body)), 200))
	}
	return cr, nil
}
