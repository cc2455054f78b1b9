package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
	"kvdock/settings"
	"kvdock/transfer/worker"
	"kvdock/ui/httpapi"
	"kvdock/ui/termtext"
)

// statusTimeout bounds the wait for /status (as ctl's default timeout).
const statusTimeout = 5 * time.Second

// statusLimit bounds the /status document read from the target (a peer).
const statusLimit = 16 << 20

// target is what the bench learned about a running server before measuring:
// the registration reply of a probe worker and, when the HTTP API answers,
// kvdock's /status.
type target struct {
	shmName  string // advertised at registration ("" = pickle for everyone)
	poolSize int64  // advertised at registration
	// attachErr is why this process cannot open the advertised segment.
	attachErr error
	statusURL string
	status    *httpapi.Status // nil when /status did not answer or is not this server's
	statusErr error           // why status is nil ("" when the HTTP API is off)
}

func (t *target) advertised() bool { return t.shmName != "" && t.poolSize > 0 }

// pool is the server's pool size and where the figure came from; 0 when
// neither /status nor the registration says.
func (t *target) pool() (int64, string) {
	if t.status != nil && t.status.Pool.CapacityBytes > 0 {
		return t.status.Pool.CapacityBytes, "pool from " + t.statusURL
	}
	if t.advertised() {
		return t.poolSize, "pool advertised at registration"
	}
	return 0, ""
}

// residentPool is the part of the server's pool to subtract from its peak
// RSS, and how it was found. A prefaulted pool (kvdock's default) is
// resident in full. One not prefaulted is resident only where it was
// touched, unknown from here: the prefaulted part is subtracted, so the
// pages the run touched count as overhead (an overestimate, never a
// negative figure).
func (t *target) residentPool() (int64, string) {
	if t.status == nil {
		n, from := t.pool()
		return n, from
	}
	p := t.status.Pool
	if p.CapacityBytes > 0 && p.PrefaultedBytes >= p.CapacityBytes {
		return p.CapacityBytes, "prefaulted pool from " + t.statusURL
	}
	return max(0, min(p.PrefaultedBytes, p.CapacityBytes)), fmt.Sprintf(
		"prefaulted part of the pool from %s (%d of %d bytes: pool pages the run touched count as overhead)", t.statusURL, p.PrefaultedBytes, p.CapacityBytes)
}

// benchRoom is what the server's pool lets benchmark traffic use: the
// bytes below its eviction watermark that other models' objects leave
// (core/l1 keeps a benchmark to them and never lets it evict another
// model's chunks); ok is false when /status does not say.
func (t *target) benchRoom() (room int64, ok bool) {
	if t == nil || t.status == nil || t.status.Pool.CapacityBytes <= 0 {
		return 0, false
	}
	p := t.status.Pool
	return max(0, int64(p.TriggerWatermark*float64(p.CapacityBytes))-(p.UsedBytes-p.BenchBytes)), true
}

// probeTarget registers one worker to read the registration reply (the
// segment name and pool size every worker gets), withdraws it, checks that
// the advertised segment can be opened from here, and reads /status when an
// HTTP address is known.
func probeTarget(ctx context.Context, o Options, prof *protocol.Profile, instance int64) (*target, error) {
	endpoint := endpointOf(o.Host, o.Port)
	c, err := client.Dial(endpoint, prof, client.Options{Timeout: o.Timeout})
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	defer c.Close()
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	// Pickle: the probe only reads the reply; attaching is checked below
	// without mapping (a MAP_POPULATE of a large pool would cost seconds).
	wk, err := worker.Register(rctx, c, worker.Config{
		InstanceID: instance, Model: benchModel(o.Model, true),
		Layers: o.Model.Layers, Hidden: o.Model.Hidden, Dtype: o.Model.Dtype, MLA: o.Model.MLA, Pickle: true,
	})
	if err != nil {
		return nil, fmt.Errorf("the server at %s did not accept a worker: %w", endpoint, err)
	}
	// The name is the server's word: it is shown to people, so without
	// control characters (a name that needed cleaning opens no segment).
	t := &target{shmName: termtext.Clean(wk.ShmName()), poolSize: wk.PoolSize()}
	_ = wk.Unregister(rctx)
	if t.advertised() {
		t.attachErr = canOpenSegment("/dev/shm", t.shmName)
	}
	if o.HTTPPort > 0 {
		t.statusURL = "http://" + settings.DialAddr(o.HTTPHost, o.HTTPPort) + "/status"
		// A hung HTTP API delays the run by at most this much.
		t.status, t.statusErr = fetchStatus(ctx, t.statusURL, min(o.Timeout, statusTimeout))
		if t.status != nil {
			if why := t.notThisServer(o.Port); why != "" {
				t.status, t.statusErr = nil, errors.New(why)
			}
		}
	}
	return t, nil
}

// notThisServer says why a /status document is not the target's ("" when it
// is): another kvdock's HTTP API (two on one host) must not lend its pool
// size or its SHM decision.
func (t *target) notThisServer(zmqPort int) string {
	ep := t.status.Endpoint
	i := strings.LastIndexByte(ep, ':')
	if i < 0 || ep[i+1:] != strconv.Itoa(zmqPort) {
		return fmt.Sprintf("it is the HTTP API of the server at %q, not of the one on port %d", ep, zmqPort)
	}
	if t.status.ShmName != t.shmName {
		return fmt.Sprintf("it advertises segment %q, registration answered %q", t.status.ShmName, t.shmName)
	}
	return ""
}

// canOpenSegment checks that the advertised segment exists here and is
// readable and writable: the SHM workers map it (a server on another
// machine, or of another user, advertises one the bench cannot use).
func canOpenSegment(dir, name string) error {
	bare := strings.TrimPrefix(name, "/")
	if bare == "" || strings.ContainsAny(bare, "/\x00") || bare == "." || bare == ".." {
		return fmt.Errorf("the advertised segment name %q is not a file name", name)
	}
	f, err := os.OpenFile(filepath.Join(dir, bare), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// fetchStatus GETs kvdock's /status (bounded in time and size).
func fetchStatus(ctx context.Context, addr string, timeout time.Duration) (*httpapi.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr, nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is said by the caller
		}
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d", res.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(res.Body, statusLimit+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(body) > statusLimit {
		return nil, fmt.Errorf("the answer is larger than %d bytes", statusLimit)
	}
	var st httpapi.Status
	if err := json.Unmarshal(body, &st); err != nil || st.Endpoint == "" {
		return nil, errors.New("the answer is not a kvdock status document")
	}
	// Its strings end up in the skip reasons printed to a terminal.
	termtext.CleanAll(&st)
	return &st, nil
}

// httpAddress is the target's HTTP API address from the settings layers, as
// kvdock serve reads them (defaults < file < KVDOCK_* < flags); only the
// keys it reads can make it fail. The host defaults to the target's ZMQ
// host, not serve's 127.0.0.1: the HTTP API is on the server's machine.
func httpAddress(fs *pflag.FlagSet, environ []string, zmqHost string) (string, int, error) {
	l, err := settings.Load(settings.LoadOptions{Flags: fs, Environ: environ})
	var ve *settings.ValidationError
	if errors.As(err, &ve) && l != nil {
		var mine []settings.Problem
		for _, p := range ve.Problems {
			if p.Key == "http.host" || p.Key == "http.port" {
				mine = append(mine, p)
			}
		}
		if len(mine) > 0 {
			return "", 0, fmt.Errorf("the target's HTTP address: %w", &settings.ValidationError{Problems: mine})
		}
		err = nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("the target's HTTP address: %w", err)
	}
	host := l.Config.HTTP.Host
	if l.Sources["http.host"].Kind == settings.SourceDefault {
		host = zmqHost
	}
	return host, l.Config.HTTP.Port, nil
}

// servable says whether the target can serve mode, and in user words why
// not.
func (t *target) servable(mode string) (bool, string) {
	switch mode {
	case "shm":
		if !t.advertised() {
			why := "it was started with --shm-name \"\" or its pool is not shared"
			if t.status != nil && t.status.ShmReason != "" {
				why = t.status.ShmReason
			}
			return false, "the server shares no memory segment with its workers (its reason: " + why + "), so SHM workers have nothing to attach: it serves pickle workers only"
		}
		if t.attachErr != nil {
			return false, fmt.Sprintf("the server's segment %s cannot be opened from here (%v): SHM mode needs the bench on the server's machine, as the same user", t.shmName, t.attachErr)
		}
	case "pickle":
		if t.advertised() && t.status == nil {
			why := "its HTTP API is off here (--http-port 0)"
			if t.statusErr != nil {
				why = fmt.Sprintf("its /status (%s) could not be used: %v", t.statusURL, t.statusErr)
			}
			return false, fmt.Sprintf("the server shares segment %s, and %s, so the bench cannot tell it is a kvdock, which serves workers that fall back to pickle; "+
				"an LMCache server answers their retrieves as misses. Give --http-host/--http-port, or bench a server started with --shm-name \"\"", t.shmName, why)
		}
	}
	return true, ""
}
