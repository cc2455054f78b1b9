package ctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"kvdock/settings"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

const statusUsage = `usage: kvdock ctl status [--http-host HOST] [--http-port PORT] [--json]

Prints a running kvdock's state, SHM decision, pool usage and worker contexts,
read from its HTTP API (GET /status). Host and port default to
$KVDOCK_HTTP_HOST and $KVDOCK_HTTP_PORT, else 127.0.0.1:8080.

Flags:
`

// Status is `kvdock ctl status`: GET /status from kvdock's HTTP API and
// print it as a table (or raw with --json). It returns the exit code: 0 on
// an answer, 1 when the API does not answer or errs, 2 on usage errors.
func Status(args []string, stdout, stderr io.Writer) int {
	def := settings.Default().HTTP
	host, port := def.Host, def.Port
	if v, ok := os.LookupEnv(settings.EnvPrefix + "HTTP_HOST"); ok && v != "" {
		host = v
	}
	if v, ok := os.LookupEnv(settings.EnvPrefix + "HTTP_PORT"); ok && v != "" {
		p, err := strconv.Atoi(v)
		if err != nil {
			fmt.Fprintf(stderr, "kvdock ctl status: %sHTTP_PORT=%q is not a port number\n", settings.EnvPrefix, v)
			return 2
		}
		port = p
	}

	fs := pflag.NewFlagSet("kvdock ctl status", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&host, "http-host", host, "host of kvdock's HTTP API")
	fs.IntVar(&port, "http-port", port, "port of kvdock's HTTP API")
	raw := fs.Bool("json", false, "print the /status document as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for an answer")
	fs.Usage = func() { fmt.Fprint(stderr, statusUsage+fs.FlagUsages()) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvdock ctl status: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if port <= 0 || port > 65535 {
		fmt.Fprintf(stderr, "kvdock ctl status: HTTP port %d: the HTTP API is off (port 0) or the port is invalid; pass --http-port with the port kvdock serves it on\n", port)
		return 2
	}

	url := "http://" + net.JoinHostPort(statusDialHost(host), strconv.Itoa(port)) + "/status"
	body, err := statusFetch(url, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "kvdock ctl status: kvdock's HTTP API does not answer at %s: %v\n(is kvdock running, with --http-port %d?)\n", url, err, port)
		return 1
	}
	if *raw {
		_, _ = stdout.Write(body)
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
	statusPrint(stdout, st)
	return 0
}

// statusDialHost turns a bind-all address into one a client can dial.
func statusDialHost(host string) string {
	switch host {
	case "", "0.0.0.0":
		return "127.0.0.1"
	case "::", "[::]":
		return "::1"
	}
	return strings.Trim(host, "[]")
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

// statusBytes renders a byte count with a binary unit.
func statusBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
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
	fmt.Fprintf(tw, "protocol\t%s, chunk %d tokens, hash %s\n", st.Protocol, st.ChunkSize, st.HashAlgorithm)
	if st.ShmShared {
		fmt.Fprintf(tw, "SHM\ton: %s (%s): %s\n", st.ShmName, statusBytes(st.PoolSize), st.ShmReason)
	} else {
		fmt.Fprintf(tw, "SHM\toff, pickle for every worker: %s\n", st.ShmReason)
	}
	p := st.Pool
	kind := "anonymous memory"
	if p.Shared {
		kind = "segment " + p.Segment
	}
	fmt.Fprintf(tw, "pool\t%s of %s used (%.1f%%), %d objects, %s\n",
		statusBytes(p.UsedBytes), statusBytes(p.CapacityBytes), 100*p.UsageRatio, p.Objects, kind)
	bad := int64(0)
	for _, n := range st.Requests.BadInput {
		bad += n
	}
	fmt.Fprintf(tw, "requests\t%d handled, %d in flight, %d bad input\n", st.Requests.Total, st.Requests.InFlight, bad)
	fmt.Fprintf(tw, "lookups\t%d, %d of %d tokens hit, %d prefetch jobs active\n",
		st.Lookup.Lookups, st.Lookup.HitTokens, st.Lookup.RequestedTokens, st.ActivePrefetchJobs)
	if !st.GPU.Available {
		fmt.Fprintf(tw, "GPU\tn/a: %s\n", statusOrDash(st.GPU.Reason))
	} else {
		for _, d := range st.GPU.Devices {
			fmt.Fprintf(tw, "GPU %d\t%s, %s of %s used\n", d.Index, d.Name,
				statusBytes(int64(d.MemoryUsedBytes)), statusBytes(int64(d.MemoryTotalBytes)))
		}
	}
	_ = tw.Flush()

	fmt.Fprintf(w, "\n%d worker context(s)\n", len(st.Contexts))
	if len(st.Contexts) == 0 {
		return
	}
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tMODEL\tWORLD\tLAYOUT\tMODE\tSTORES\tRETRIEVES\tHITS\tREASON")
	for _, c := range st.Contexts {
		dims := make([]string, len(c.Shape))
		for i, d := range c.Shape {
			dims[i] = strconv.Itoa(d)
		}
		lay := fmt.Sprintf("%s %s", strings.Join(dims, "x"), c.Dtype)
		if c.UseMLA {
			lay += " MLA"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\n", c.InstanceID, c.ModelName, c.WorldSize, lay,
			c.Mode, c.Stores, c.Retrieves, c.HitChunks, c.Reason)
	}
	_ = tw.Flush()
}

func statusOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
