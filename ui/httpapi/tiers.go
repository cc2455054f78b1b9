package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"kvdock/core/engine"
	"kvdock/core/tierstate"
)

// The L2 tiers in reach, as LMCache's server offers them: GET /l2/keys
// lists the tiers' own keys, DELETE /cache/objects?tier=l1|l2|all|N clears
// L1, every tier, both, or one tier (by index or by type when only one
// tier has it). A tier's listing and clear touch only kvdock's own values
// (the fs tier's verified files, the resp tier's indexed keys under its
// prefix), never anything else where the tier lives.

// TierEngine is what the tier endpoints need of the engine; an Engine
// without it answers them 501.
type TierEngine interface {
	TierKeys(ctx context.Context, i, limit int) ([]string, int64, error)
	ClearTier(ctx context.Context, i int, by engine.ClearOrigin) (engine.TierCleared, error)
}

// DefaultKeysLimit is how many keys of each tier /l2/keys lists unless
// ?limit= says otherwise (at most engine.MaxTierKeys).
const DefaultKeysLimit = 100

// TierKeys is one tier's part of the /l2/keys answer.
type TierKeys struct {
	Index  int    `json:"index"`
	Type   string `json:"type"`
	Target string `json:"target"`
	State  string `json:"state"`
	// Total is how many objects the tier holds; Keys at most limit of
	// them, most recently used first.
	Total int64    `json:"total"`
	Keys  []string `json:"keys"`
	Error string   `json:"error,omitempty"`
}

// L2KeysResult is the /l2/keys answer.
type L2KeysResult struct {
	Tiers []TierKeys `json:"tiers"`
}

// TierClearResult is one tier's part of the /cache/objects answer.
type TierClearResult struct {
	Index   int    `json:"index"`
	Type    string `json:"type"`
	Target  string `json:"target"`
	Objects int64  `json:"objects_cleared"`
	Bytes   int64  `json:"bytes_cleared"`
	Error   string `json:"error,omitempty"`
}

// ObjectsClearResult is the DELETE /cache/objects answer: status "ok" when
// every part cleared, "partial" when a tier failed (its error says why).
type ObjectsClearResult struct {
	Status string            `json:"status"`
	L1     *ClearResult      `json:"l1,omitempty"`
	L2     []TierClearResult `json:"l2,omitempty"`
}

// pickTiers reads the tier parameter: l1, l2 (every tier), all (both), a
// tier's index, or its type when only one tier has it. withL1 false
// refuses l1 and all (a listing is of the tiers only).
func pickTiers(v string, tiers []tierstate.Tier, withL1 bool) (l1 bool, idx []int, err error) {
	every := func() []int {
		out := make([]int, len(tiers))
		for i := range tiers {
			out[i] = i
		}
		return out
	}
	switch v = strings.ToLower(strings.TrimSpace(v)); v {
	case "l1":
		if withL1 {
			return true, nil, nil
		}
	case "all":
		if withL1 {
			return true, every(), nil
		}
		return false, every(), nil
	case "l2", "":
		if v == "" && withL1 {
			break
		}
		return false, every(), nil
	}
	if i, err := strconv.Atoi(v); err == nil && v != "" {
		if i < 0 || i >= len(tiers) {
			return false, nil, fmt.Errorf("tier %d: there are %d tier(s) (0 to %d)", i, len(tiers), len(tiers)-1)
		}
		return false, []int{i}, nil
	}
	var found []int
	for i, t := range tiers {
		if strings.EqualFold(t.Type, v) {
			found = append(found, i)
		}
	}
	switch {
	case len(found) == 1:
		return false, found, nil
	case len(found) > 1:
		return false, nil, fmt.Errorf("tier %q: %d tiers have that type; give the index", v, len(found))
	}
	shown := v
	if len(shown) > 32 {
		shown = shown[:32] + "…"
	}
	accepted := "l2, all, a tier's index or its type"
	if withL1 {
		accepted = "l1, l2, all, a tier's index or its type"
	}
	return false, nil, fmt.Errorf("tier %q: want %s", shown, accepted)
}

func (s *Server) tierEngine(w http.ResponseWriter) (TierEngine, bool) {
	te, ok := s.eng.(TierEngine)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this server cannot list or clear its tiers")
	}
	return te, ok
}

func (s *Server) l2Keys(w http.ResponseWriter, r *http.Request) {
	te, ok := s.tierEngine(w)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit := DefaultKeysLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > engine.MaxTierKeys {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit: want a count from 0 to %d", engine.MaxTierKeys))
			return
		}
		limit = n
	}
	tiers := s.eng.Snapshot().Tiers
	_, idx, err := pickTiers(q.Get("tier"), tiers, false)
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	res := L2KeysResult{Tiers: []TierKeys{}}
	for _, i := range idx {
		t := tiers[i]
		tk := TierKeys{Index: i, Type: t.Type, Target: t.Target, State: string(t.State), Keys: []string{}}
		ks, total, err := te.TierKeys(r.Context(), i, limit)
		if err != nil {
			tk.Error = err.Error()
		} else {
			tk.Keys, tk.Total = ks, total
		}
		res.Tiers = append(res.Tiers, tk)
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) clearObjects(w http.ResponseWriter, r *http.Request) {
	te, ok := s.tierEngine(w)
	if !ok {
		return
	}
	qs := r.URL.Query()["tier"]
	if len(qs) != 1 {
		writeError(w, http.StatusBadRequest, "give exactly one tier query parameter: l1, l2, all, a tier's index or its type, e.g. /cache/objects?tier=l2")
		return
	}
	tiers := s.eng.Snapshot().Tiers
	l1, idx, err := pickTiers(qs[0], tiers, true)
	if err == nil && !l1 && len(idx) == 0 {
		err = errors.New("no L2 tier is configured")
	}
	if err != nil {
		writeError(w, http.StatusNotFound, err.Error())
		return
	}
	by := origin(r)
	res := ObjectsClearResult{Status: "ok"}
	if l1 {
		c, err := s.eng.ClearCache(by)
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		res.L1 = &ClearResult{Status: "ok", Objects: c.Objects, Bytes: c.Bytes}
	}
	for _, i := range idx {
		c, err := te.ClearTier(r.Context(), i, by)
		tr := TierClearResult{Index: i, Type: tiers[i].Type, Target: tiers[i].Target, Objects: c.Objects, Bytes: c.Bytes}
		if err != nil {
			tr.Error, res.Status = err.Error(), "partial"
		}
		res.L2 = append(res.L2, tr)
	}
	s.log.Info("objects cleared over HTTP", "by", string(by), "tier", qs[0], "status", res.Status, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, res)
}
