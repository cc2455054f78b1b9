package httpapi

import (
	"net/http"
	"time"

	"kvdock/core/engine"
)

// StatsResetter zeroes the engine's insight figures; *engine.Engine is one.
// An engine without it answers /reset-stats with 501.
type StatsResetter interface {
	ResetStats(by engine.ClearOrigin) (time.Time, error)
}

// ResetResult is the /reset-stats answer: when the figures start again.
type ResetResult struct {
	Status  string     `json:"status"`
	ResetAt *time.Time `json:"reset_at,omitempty"`
}

// resetStats zeroes the hit ratio, tokens saved, miss breakdown and
// what-if (after a benchmark run, say); the cache itself is untouched.
func (s *Server) resetStats(w http.ResponseWriter, r *http.Request) {
	rs, ok := s.eng.(StatsResetter)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this engine cannot reset its statistics")
		return
	}
	by := origin(r)
	at, err := rs.ResetStats(by)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.log.Info("statistics reset over HTTP", "by", string(by), "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, ResetResult{Status: "ok", ResetAt: &at})
}
