package httpapi

import (
	"net/http"
	"time"

	"kvdock/core/engine"
)

// RestartStatus is /status's restart block: what this start adopted of the
// previous process's pool (a restart that kept it), or why nothing.
type RestartStatus struct {
	Adopted         bool  `json:"adopted"`
	AdoptedObjects  int   `json:"adopted_objects"`
	AdoptedBytes    int64 `json:"adopted_bytes"`
	AdoptedContexts int   `json:"adopted_contexts"`
	// AdoptedLookups are the LOOKUPs the previous process answered and no
	// QUERY_PREFETCH_STATUS had asked for yet, answered now by this one.
	AdoptedLookups  int `json:"adopted_lookups"`
	HeldObjects     int `json:"held_objects"`
	RefusedContexts int `json:"refused_contexts"`
	// Dropped counts the parts of the record left out one by one (an
	// object, a registration, a lookup, a read lock past the caps);
	// DroppedReasons gives them by kind, with the first of each.
	Dropped        int        `json:"dropped"`
	DroppedReasons []string   `json:"dropped_reasons,omitempty"`
	GapMS          int64      `json:"gap_ms"`
	Generation     uint64     `json:"generation"`
	Reason         string     `json:"reason"`
	At             *time.Time `json:"at,omitempty"`
	// StatsCarried: the previous process's figures were taken over
	// (stats_rule). PromptLinks are the adopted objects' links to their
	// parent chunk restored, PromptLinksDropped those left out (the events
	// say why).
	StatsCarried       bool `json:"stats_carried"`
	PromptLinks        int  `json:"prompt_links"`
	PromptLinksDropped int  `json:"prompt_links_dropped"`
	// Transfers are the transfers the previous process prepared that were
	// restored for their commits here, TransfersRefused those that were not.
	// HandoverParked and HandoverLost are what the previous stop's handover
	// parked and answered, and the requests it read after its last answer.
	Transfers        int   `json:"transfers"`
	TransfersRefused int   `json:"transfers_refused"`
	HandoverParked   int64 `json:"handover_parked"`
	HandoverLost     int64 `json:"handover_lost"`
}

// restartStatus renders the snapshot's restart; reason says "no restart
// record" when the start found none.
func restartStatus(r engine.Restart) RestartStatus {
	reason := r.Reason
	if !r.Adopted && reason == "" {
		reason = "no restart record: the previous stop did not keep the pool"
	}
	var reasons []string
	for _, d := range r.DropReasons {
		reasons = append(reasons, shown(d, shownMessageBytes))
	}
	return RestartStatus{Adopted: r.Adopted, AdoptedObjects: r.Objects, AdoptedBytes: r.Bytes, AdoptedContexts: r.Contexts,
		AdoptedLookups: r.Lookups, HeldObjects: r.Held, RefusedContexts: len(r.Refused), GapMS: r.Gap.Milliseconds(), Generation: r.Generation,
		Dropped: r.Dropped, DroppedReasons: reasons,
		Reason: shown(reason, shownMessageBytes), At: timePtr(r.At),
		StatsCarried: r.StatsCarried, PromptLinks: r.Links, PromptLinksDropped: r.LinksDropped,
		Transfers: r.Transfers, TransfersRefused: r.TransfersRefused, HandoverParked: r.HandoverParked, HandoverLost: r.HandoverLost}
}

// RestartResult is the POST /restart answer.
type RestartResult struct {
	Status string `json:"status"`
}

// restart asks the process to do what SIGUSR2 does: stop keeping the pool
// and execute its binary again (Options.Restart). It answers before the
// restart begins; the new process is seen on /status (restart block).
func (s *Server) restart(w http.ResponseWriter, r *http.Request) {
	if s.opts.Restart == nil {
		writeError(w, http.StatusNotImplemented, "this server cannot restart itself (not kvdock serve)")
		return
	}
	if err := s.opts.Restart(); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	s.log.Info("restart asked over HTTP", "by", string(origin(r)), "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, RestartResult{Status: "restarting"})
}
