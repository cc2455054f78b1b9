// Package httpapi is kvdock's operator HTTP API, served in headless and
// dashboard modes on --http-host/--http-port:
//
//	GET  /healthcheck  200 {"status":"healthy"} while serving, else 503 with the reason
//	GET  /status       the engine snapshot (upstream's report_status names plus kvdock's)
//	GET  /conf         the effective settings with the source of each value
//	GET  /metrics      Prometheus text from kvdock's private registry
//	POST /clear-cache  drop every object in the L1 pool; answers the objects and bytes dropped
//	POST /unregister?instance_id=N  remove worker instance N (as its own unregister would)
//	POST /reset-stats  zero the insight figures (hit ratio, tokens saved, miss breakdown, what-if)
//	POST /restart      restart in place keeping the pool (what SIGUSR2 does)
//
// Each path is also served under /api/. Mutating endpoints require
// "Authorization: Bearer <token>" when a token is configured; POST /restart
// requires one even without (the local token, localtoken.go). Errors are JSON
// {"status":"error","error":…} on every endpoint: 404 for an unknown path,
// 405 with Allow for a wrong method, 413 for a body over the limit, 401 for a
// missing token and, with another message, a wrong one; an endpoint's own
// failures (an unknown instance, an engine that cannot) likewise.
package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"kvdock/core/engine"
	"kvdock/settings"
	"kvdock/ui/metrics"
)

// Engine is what the API reads and commands; *engine.Engine is one.
type Engine interface {
	Snapshot() engine.Snapshot
	ClearCache(by engine.ClearOrigin) (engine.Cleared, error)
	RemoveInstance(id int64, by engine.ClearOrigin) error
}

// CtlAgent starts the User-Agent of `kvdock ctl`'s requests; a clear it
// sends is recorded as the ctl's, any other as the HTTP API's. It only
// labels the event: the token check is the same for everyone.
const CtlAgent = "kvdock-ctl"

// DefaultMaxBodyBytes is the largest request body accepted (413 beyond).
const DefaultMaxBodyBytes = 1 << 20

// Options configure a Server.
type Options struct {
	// Token, when not empty, is required as a bearer token on mutating
	// endpoints (settings http.token, --http-token, KVDOCK_HTTP_TOKEN).
	Token string
	// Metrics is the registry /metrics serves; nil builds one watching the
	// engine (its request metrics then stay at zero: pass the engine's
	// Observer here to have them fed).
	Metrics *metrics.Metrics
	// MaxBodyBytes limits request bodies (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// MaxConns bounds the open connections (default DefaultMaxConns);
	// IdleTimeout closes keep-alive connections without a request (default
	// DefaultIdleTimeout).
	MaxConns    int
	IdleTimeout time.Duration
	Logger      *slog.Logger
	// Restart, when set, makes POST /restart ask the process to restart in
	// place keeping the pool (kvdock ctl restart; what SIGUSR2 does).
	Restart func() error
	// StateDir, when set, is where a runner without a token writes the
	// local token (localtoken.go) at each start of the API.
	StateDir string
	// LocalToken is what POST /restart requires when no Token is set (it
	// needs a credential even on loopback); "" refuses it until a token is.
	LocalToken string
}

// Server is the HTTP API over one engine.
type Server struct {
	eng     Engine
	opts    Options
	log     *slog.Logger
	metrics http.Handler
	routes  map[string]route
	handler http.Handler
	conns   atomic.Pointer[connLimiter] // set by Serve
}

type route struct {
	method   string
	mutating bool
	// account: the request needs a credential even without a Token
	// (Options.LocalToken), as the account's own SIGUSR2 would.
	account bool
	serve   http.HandlerFunc
}

// New returns the API over eng.
func New(eng Engine, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.MaxBodyBytes = settings.PositiveOr(opts.MaxBodyBytes, DefaultMaxBodyBytes)
	opts.MaxConns = settings.PositiveOr(opts.MaxConns, DefaultMaxConns)
	opts.IdleTimeout = settings.PositiveOr(opts.IdleTimeout, DefaultIdleTimeout)
	if opts.Metrics == nil {
		opts.Metrics = metrics.New()
		opts.Metrics.Watch(eng)
	}
	s := &Server{eng: eng, opts: opts, log: opts.Logger, metrics: opts.Metrics.Handler()}
	s.routes = map[string]route{
		"/":            {method: http.MethodGet, serve: s.root},
		"/healthcheck": {method: http.MethodGet, serve: s.healthcheck},
		"/status":      {method: http.MethodGet, serve: s.status},
		"/conf":        {method: http.MethodGet, serve: s.conf},
		"/metrics":     {method: http.MethodGet, serve: s.metrics.ServeHTTP},
		"/clear-cache": {method: http.MethodPost, mutating: true, serve: s.clearCache},
		"/unregister":  {method: http.MethodPost, mutating: true, serve: s.unregister},
		"/reset-stats": {method: http.MethodPost, mutating: true, serve: s.resetStats},
		"/restart":     {method: http.MethodPost, mutating: true, account: true, serve: s.restart},
		"/l2/keys":     {method: http.MethodGet, serve: s.l2Keys},
		// LMCache's name for a clear of chosen tiers (tiers.go).
		"/cache/objects": {method: http.MethodDelete, mutating: true, serve: s.clearObjects},
	}
	for _, p := range []string{"/healthcheck", "/status", "/conf", "/metrics", "/clear-cache", "/unregister", "/reset-stats", "/restart", "/l2/keys", "/cache/objects"} {
		s.routes["/api"+p] = s.routes[p]
	}
	s.handler = http.HandlerFunc(s.dispatch)
	return s
}

// Handler is the API as an http.Handler (for tests and custom servers).
func (s *Server) Handler() http.Handler { return s.handler }

// Listen binds host:port for Serve; port 0 binds an ephemeral port (the
// settings treat http.port 0 as "disabled": callers check that first).
func Listen(host string, port int) (net.Listener, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("HTTP API: listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Conns counts the connections of the running Serve (zero before).
func (s *Server) Conns() ConnStats {
	if l := s.conns.Load(); l != nil {
		return l.stats()
	}
	return ConnStats{}
}

// Serve answers on ln until ctx is done, then shuts down gracefully (up to
// 5 s for requests in flight). It returns nil after a clean shutdown. At most
// Options.MaxConns connections are open at once (see connLimiter).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.opts.Token == "" && !isLoopback(ln.Addr()) {
		s.log.Warn("HTTP API bound to a non-loopback address without a token: anyone who can reach it may clear the cache; set --http-token or KVDOCK_HTTP_TOKEN",
			"addr", ln.Addr().String())
	}
	lim := newConnLimiter(ln, s.opts.MaxConns, s.log)
	s.conns.Store(lim)
	ln = lim
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnState:         lim.track,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.log.Info("HTTP API listening", "addr", ln.Addr().String(), "token", s.opts.Token != "")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("HTTP API: %w", err)
	case <-ctx.Done():
	}
	// Requests in flight get ShutdownGrace to finish; then every connection
	// is closed. A connection that never sent a request counts as active
	// for Shutdown for its first 5 s, so without the Close a client that
	// merely connected would hold kvdock's exit that long.
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownGrace)
	defer cancel()
	err := srv.Shutdown(shutCtx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("HTTP API shutdown: %w", err)
	}
	return nil
}

// isLoopback reports whether a listener address only accepts local peers.
func isLoopback(a net.Addr) bool {
	tcp, ok := a.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// writeJSON answers v as indented JSON.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code = http.StatusInternalServerError
		b = []byte(`{"status":"error","error":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// ErrorBody is every error answer.
type ErrorBody struct {
	Status string `json:"status"`
	Error  string `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, ErrorBody{Status: "error", Error: msg})
}

// dispatch routes by exact path, then checks method, size and token.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	defer func() {
		s.log.Debug("http", "method", r.Method, "path", r.URL.Path, "status", rw.code,
			"remote", r.RemoteAddr, "dur", time.Since(start))
	}()

	rt, ok := s.routes[r.URL.Path]
	if !ok {
		writeError(rw, http.StatusNotFound, fmt.Sprintf("no such endpoint %q; try /healthcheck, /status, /conf, /metrics, GET /l2/keys, POST /clear-cache, DELETE /cache/objects?tier=, POST /unregister, POST /reset-stats or POST /restart", r.URL.Path))
		return
	}
	if r.Method != rt.method && !(rt.method == http.MethodGet && r.Method == http.MethodHead) {
		allow := rt.method
		if rt.method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		rw.Header().Set("Allow", allow)
		writeError(rw, http.StatusMethodNotAllowed, fmt.Sprintf("%s does not accept %s; use %s", r.URL.Path, r.Method, rt.method))
		return
	}
	if r.ContentLength > s.opts.MaxBodyBytes {
		writeError(rw, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, s.opts.MaxBodyBytes))
		return
	}
	if why := s.unauthorized(r, rt.account); rt.mutating && why != "" {
		rw.Header().Set("WWW-Authenticate", `Bearer realm="kvdock"`)
		writeError(rw, http.StatusUnauthorized, why)
		return
	}
	// No endpoint reads a body, but a chunked one must still respect the
	// limit rather than be streamed in unbounded, and one that is there must
	// at least be JSON: garbage is a client bug worth a 400, not a silent
	// clear-cache.
	if r.Body != nil && r.Body != http.NoBody {
		body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, s.opts.MaxBodyBytes))
		if err == nil && len(bytes.TrimSpace(body)) > 0 && !json.Valid(body) {
			writeError(rw, http.StatusBadRequest, "request body is not valid JSON (no endpoint needs a body; send none)")
			return
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(rw, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds the limit of %d bytes", s.opts.MaxBodyBytes))
			return
		}
		if err != nil {
			writeError(rw, http.StatusBadRequest, "reading the request body: "+err.Error())
			return
		}
	}
	rt.serve(rw, r)
}

// Why a request is refused with 401: no token and a wrong one are
// different mistakes (the client was not given the token, or an old one).
const (
	tokenHow       = "this endpoint needs \"Authorization: Bearer <token>\" with the token set by --http-token or KVDOCK_HTTP_TOKEN"
	tokenMissing   = tokenHow + "; the request carries none"
	tokenNotBearer = tokenHow + "; the request's Authorization header is not a bearer token"
	tokenWrong     = "the bearer token does not match the one set by --http-token or KVDOCK_HTTP_TOKEN"
	tokenNoLocal   = "a restart needs a token even on loopback: set --http-token or KVDOCK_HTTP_TOKEN (kvdock writes a local one for kvdock ctl only in a state directory it can use)"
)

// unauthorized is why r may not change anything, "" when it may. The
// token is compared in constant time (hashes first, so the comparison does
// not leak the token's length either).
func (s *Server) unauthorized(r *http.Request, account bool) string {
	want := s.opts.Token
	if want == "" {
		if !account {
			return ""
		}
		if want = s.opts.LocalToken; want == "" {
			return tokenNoLocal
		}
	}
	auth := strings.TrimSpace(r.Header.Get("Authorization"))
	if auth == "" {
		return tokenMissing
	}
	scheme, tok, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return tokenNotBearer
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	sum := sha256.Sum256([]byte(want))
	if subtle.ConstantTimeCompare(got[:], sum[:]) != 1 {
		return tokenWrong
	}
	return ""
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) root(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"status":    "ok",
		"service":   "kvdock HTTP API",
		"endpoints": []string{"GET /healthcheck", "GET /status", "GET /conf", "GET /metrics", "GET /l2/keys?tier=&limit=", "POST /clear-cache", "DELETE /cache/objects?tier=l1|l2|all|N", "POST /unregister?instance_id=N", "POST /reset-stats", "POST /restart"},
	})
}

// Health is the /healthcheck answer.
type Health struct {
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
	State  string `json:"state"`
}

func (s *Server) healthcheck(w http.ResponseWriter, r *http.Request) {
	snap := s.eng.Snapshot()
	if snap.Healthy() {
		writeJSON(w, http.StatusOK, Health{Status: "healthy", State: snap.State.String()})
		return
	}
	reason := "engine " + snap.State.String()
	if snap.Error != "" {
		reason += ": " + snap.Error
	}
	writeJSON(w, http.StatusServiceUnavailable, Health{Status: "unhealthy", Reason: reason, State: snap.State.String()})
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, NewStatus(s.eng.Snapshot()))
}

func (s *Server) conf(w http.ResponseWriter, r *http.Request) {
	snap := s.eng.Snapshot()
	writeJSON(w, http.StatusOK, NewConf(snap.Config, snap.Sources))
}

// ClearResult is the /clear-cache answer: what the clear dropped (live
// objects, locked ones included, and their bytes rounded to the pool's
// alignment).
type ClearResult struct {
	Status  string `json:"status"`
	Objects int    `json:"objects_cleared"`
	Bytes   int64  `json:"bytes_cleared"`
}

// origin is who sent r, for the events: kvdock ctl or the HTTP API.
func origin(r *http.Request) engine.ClearOrigin {
	if strings.HasPrefix(r.UserAgent(), CtlAgent) {
		return engine.ClearByCtl
	}
	return engine.ClearByHTTP
}

func (s *Server) clearCache(w http.ResponseWriter, r *http.Request) {
	by := origin(r)
	c, err := s.eng.ClearCache(by)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.log.Info("cache cleared over HTTP", "by", string(by), "objects", c.Objects, "bytes", c.Bytes, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, ClearResult{Status: "ok", Objects: c.Objects, Bytes: c.Bytes})
}

// UnregisterResult is the /unregister answer.
type UnregisterResult struct {
	Status     string `json:"status"`
	InstanceID int64  `json:"instance_id"`
}

// unregister removes one worker instance on the operator's word: its
// context goes, its pending writes are aborted and its reads released (the
// dashboard's remove key and `kvdock ctl unregister` do the same). 400 for
// a missing or malformed id, 404 for one nobody registered.
func (s *Server) unregister(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()["instance_id"]
	if len(q) != 1 {
		writeError(w, http.StatusBadRequest, "give exactly one instance_id query parameter, e.g. /unregister?instance_id=1234")
		return
	}
	id, err := strconv.ParseInt(q[0], 10, 64)
	if err != nil {
		shown := q[0]
		if len(shown) > 32 {
			shown = shown[:32] + "…"
		}
		writeError(w, http.StatusBadRequest, fmt.Sprintf("instance_id %q is not a 64-bit integer", shown))
		return
	}
	by := origin(r)
	err = s.eng.RemoveInstance(id, by)
	switch {
	case errors.Is(err, engine.ErrUnknownInstance):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.log.Info("instance removed over HTTP", "by", string(by), "instance_id", id, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, UnregisterResult{Status: "ok", InstanceID: id})
}
