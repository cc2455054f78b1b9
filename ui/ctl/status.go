package ctl

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

const statusUsage = `usage: kvdock ctl status [--http-host HOST] [--http-port PORT] [--json]

Prints a running kvdock's state, SHM decision, pool usage, L2 tiers and worker contexts,
read from its HTTP API (GET /status). Host and port come from the settings,
as for kvdock serve: the settings file, $KVDOCK_HTTP_HOST and
$KVDOCK_HTTP_PORT, then the flags; by default 127.0.0.1:8080. It takes
every kvdock ctl flag (--port, --protocol, ... change nothing here), so one
alias such as kvdock ctl --port 5655 --http-port 8155 serves every command.

Flags:
`

const statusLine = "usage: kvdock ctl status [--http-host HOST] [--http-port PORT] [--json] (kvdock ctl status --help for more)"

// Status is `kvdock ctl status`: GET /status from kvdock's HTTP API and
// print it as a table (or raw with --json). It returns the exit code: 0 on
// an answer, 1 when the API does not answer or errs, 2 on usage errors.
func Status(args []string, env Env) int {
	f := newFlags("kvdock ctl status")
	// Every ctl flag is accepted, so one alias with --port and --http-port
	// serves every command; the ZMQ ones are hidden from this help, being
	// of no use to status.
	for _, name := range []string{"host", "port", "protocol", "http-token", "yes"} {
		_ = f.fs.MarkHidden(name)
	}
	help := func() { fmt.Fprint(env.Stdout, statusUsage+f.fs.FlagUsages()) }
	if code, done := f.parse(args, env.Stderr, help, statusLine); done {
		return code
	}
	return runStatus(f, f.fs.Args(), env)
}

// runStatus runs status with parsed flags and its positional arguments.
func runStatus(f flagSet, params []string, env Env) int {
	stderr := env.Stderr
	if len(params) > 0 {
		fmt.Fprintf(stderr, "kvdock ctl status: unexpected arguments %q\n%s\n", params, statusLine)
		return 2
	}
	cfg, err := f.load(env)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl status: %v\n", err)
		return 2
	}
	port := cfg.HTTP.Port
	if port <= 0 || port > 65535 {
		fmt.Fprintf(stderr, "kvdock ctl status: HTTP port %d: the HTTP API is off (port 0) or the port is invalid; pass --http-port with the port kvdock serves it on\n", port)
		return 2
	}

	url := "http://" + settings.DialAddr(cfg.HTTP.Host, port) + "/status"
	body, err := statusFetch(url, *f.timeout)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl status: kvdock's HTTP API does not answer at %s: %v\n(is kvdock running, with --http-port %d?)\n", url, err, port)
		return 1
	}
	if *f.json {
		_, _ = env.Stdout.Write(body)
		return 0
	}
	var st httpapi.Status
	if err := json.Unmarshal(body, &st); err != nil {
		fmt.Fprintf(stderr, "kvdock ctl status: %s did not answer a kvdock status document: %v\n", url, err)
		return 1
	}
	// Model names and reasons come from workers: print them without
	// their escape sequences (and without tabs, which would shift columns).
	termtext.CleanAll(&st)
	statusPrint(env.Stdout, st)
	return 0
}

func statusFetch(url string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		var eb httpapi.ErrorBody
		if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
			return nil, fmt.Errorf("HTTP %d: %s", res.StatusCode, termtext.Clean(eb.Error))
		}
		return nil, fmt.Errorf("HTTP %d", res.StatusCode)
	}
	return body, nil
}

// statusPrint writes the header lines and the contexts table.
func statusPrint(w io.Writer, st httpapi.Status) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	state := st.State
	if st.Error != "" {
		state += " (" + st.Error + ")"
	}
	up := time.Duration(st.UptimeSeconds * float64(time.Second)).Round(time.Second)
	fmt.Fprintf(tw, "state\t%s, up %s, kvdock %s\n", state, up, st.Version)
	fmt.Fprintf(tw, "endpoint\t%s\n", statusOrDash(st.Endpoint))
	fmt.Fprintf(tw, "protocol\t%s, chunk %d tokens, hash %s\n", protocolText(st), st.ChunkSize, st.HashAlgorithm)
	if st.ShmShared {
		fmt.Fprintf(tw, "SHM\ton: %s (%s): %s\n", st.ShmName, settings.BytesText(st.PoolSize), st.ShmReason)
	} else {
		fmt.Fprintf(tw, "SHM\toff, pickle for every worker: %s\n", st.ShmReason)
	}
	p := st.Pool
	kind := "anonymous memory"
	if p.Shared {
		kind = "segment " + p.Segment
	} else if p.PrivateSegment != "" {
		kind = "private segment " + p.PrivateSegment
	}
	fmt.Fprintf(tw, "pool\t%s of %s used (%.1f%%), %d objects, %s\n",
		settings.BytesText(p.UsedBytes), settings.BytesText(p.CapacityBytes), 100*p.UsageRatio, p.Objects, kind)
	bad := int64(0)
	for _, n := range st.Requests.BadInput {
		bad += n
	}
	fmt.Fprintf(tw, "requests\t%d handled, %d in flight, %d bad input\n", st.Requests.Total, st.Requests.InFlight, bad)
	fmt.Fprintf(tw, "lookups\t%d, %d of %d tokens hit, %d prefetch jobs active\n",
		st.Lookup.Lookups, st.Lookup.HitTokens, st.Lookup.RequestedTokens, st.ActivePrefetchJobs)
	fmt.Fprintf(tw, "saved\t%s\n", tokensText(st.TokensSaved))
	fmt.Fprintf(tw, "misses\t%s\n", missesText(st.Misses))
	if len(st.Tiers) == 0 {
		fmt.Fprintf(tw, "tiers\tnone (L1 only; --l2-adapter adds one)\n")
	}
	for _, t := range st.Tiers {
		state := strings.ToUpper(t.State)
		if t.Reason != "" {
			state += " (" + t.Reason + ")"
		}
		used := settings.BytesText(t.UsedBytes)
		if t.CapacityBytes > 0 {
			used += " of " + settings.BytesText(t.CapacityBytes)
		}
		fmt.Fprintf(tw, "tier %d\t%s %s: %s, %s used, %d hits, %d misses, %d corrupt rejected, %d writes dropped\n",
			t.Index, t.Type, t.Target, state, used, t.Hits, t.Misses, t.Corrupt, t.DroppedWrites)
	}
	if !st.GPU.Available {
		fmt.Fprintf(tw, "GPU\tn/a: %s\n", statusOrDash(st.GPU.Reason))
	} else {
		for _, d := range st.GPU.Devices {
			fmt.Fprintf(tw, "GPU %d\t%s, %s of %s used\n", d.Index, d.Name,
				settings.BytesText(int64(d.MemoryUsedBytes)), settings.BytesText(int64(d.MemoryTotalBytes)))
		}
	}
	_ = tw.Flush()

	fmt.Fprintf(w, "\n%d worker context(s)\n", len(st.Contexts))
	if len(st.Contexts) == 0 {
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tMODEL\tWORLD\tLAYOUT\tMODE\tSTATE\tSEEN\tSTORES\tRETRIEVES\tHITS\tREASON")
	for _, c := range st.Contexts {
		dims := make([]string, len(c.Shape))
		for i, d := range c.Shape {
			dims[i] = strconv.Itoa(d)
		}
		lay := fmt.Sprintf("%s %s", strings.Join(dims, "x"), c.Dtype)
		if c.UseMLA {
			lay += " MLA"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", c.InstanceID, c.ModelName, c.WorldSize, lay,
			c.Mode, statusOrDash(c.State), seenText(c), c.Stores, c.Retrieves, c.HitChunks, c.Reason)
	}
	_ = tw.Flush()
}

// seenText is how long ago a context was last heard of ("-": never).
func seenText(c httpapi.ContextStatus) string {
	if c.LastRequestAt == nil {
		return "-"
	}
	return time.Duration(c.LastSeenSeconds * float64(time.Second)).Round(time.Second).String()
}

func statusOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
