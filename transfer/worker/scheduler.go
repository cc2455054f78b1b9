package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"kvdock/core/protocol"
	"kvdock/core/rpc/client"
)

// ErrPrefetchPending is returned (wrapped) when a prefetch did not finish
// within the Scheduler's patience.
var ErrPrefetchPending = errors.New("prefetch still running")

// Scheduler is the scheduler side of the protocol (spec 4.5): LOOKUP, the
// prefetch status polls, FREE_LOOKUP_LOCKS and END_SESSION. It keeps no
// state but its settings; the zero Poll and Patience take the defaults.
type Scheduler struct {
	C *client.Client
	// Poll is the pause between QUERY_PREFETCH_STATUS calls while the
	// server answers "still running" (default 1 ms): the protocol has no
	// completion notice, a scheduler polls.
	Poll time.Duration
	// Patience bounds how long Hits waits for a prefetch (default 5 s).
	Patience time.Duration
	// Limits bound the decoding of replies.
	Limits protocol.Limits
}

// Lookup sends LOOKUP for key (worker_id nil) with tpSize; the job is
// tracked under key.RequestID and its hits stay read-locked.
func (s Scheduler) Lookup(ctx context.Context, key protocol.Key, tpSize int) error {
	if _, err := s.C.Call(ctx, protocol.Lookup, key, int64(tpSize)); err != nil {
		return fmt.Errorf("%s: %w", protocol.Lookup, err)
	}
	return nil
}

// PrefetchStatus sends QUERY_PREFETCH_STATUS: done is false while the
// prefetch runs (a reply without result frame).
func (s Scheduler) PrefetchStatus(ctx context.Context, requestID string) (hits int, done bool, err error) {
	r, err := s.C.Call(ctx, protocol.QueryPrefetchStatus, requestID)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", protocol.QueryPrefetchStatus, err)
	}
	if !r.Present {
		return 0, false, nil
	}
	v, err := protocol.DecodeResult(protocol.ResultOptInt, r.Raw, s.Limits)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %w", protocol.QueryPrefetchStatus, err)
	}
	n := v.(int64)
	if n < 0 || n > int64(protocol.DefaultMaxTokens) {
		return 0, false, fmt.Errorf("%s answered %d: %w", protocol.QueryPrefetchStatus, n, ErrBadReply)
	}
	return int(n), true, nil
}

// Hits sends LOOKUP and polls its status until the prefetch is done; it
// returns the hit chunks, which stay read-locked for a PREPARE_RETRIEVE of
// the same request id (END_SESSION or FREE_LOOKUP_LOCKS lets them go).
func (s Scheduler) Hits(ctx context.Context, key protocol.Key, tpSize int) (int, error) {
	if err := s.Lookup(ctx, key, tpSize); err != nil {
		return 0, err
	}
	poll, patience := s.Poll, s.Patience
	if poll <= 0 {
		poll = time.Millisecond
	}
	if patience <= 0 {
		patience = 5 * time.Second
	}
	deadline := time.Now().Add(patience)
	for {
		n, done, err := s.PrefetchStatus(ctx, key.RequestID)
		if err != nil || done {
			return n, err
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%s %q: still running after %v: %w", protocol.QueryPrefetchStatus, key.RequestID, patience, ErrPrefetchPending)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s %q: %w", protocol.QueryPrefetchStatus, key.RequestID, ctx.Err())
		case <-time.After(poll):
		}
	}
}

// FreeLookupLocks sends FREE_LOOKUP_LOCKS for [key.Start, key.End).
func (s Scheduler) FreeLookupLocks(ctx context.Context, key protocol.Key, tpSize int) error {
	if _, err := s.C.Call(ctx, protocol.FreeLookupLocks, key, int64(tpSize)); err != nil {
		return fmt.Errorf("%s: %w", protocol.FreeLookupLocks, err)
	}
	return nil
}

// EndSession sends END_SESSION for requestID.
func (s Scheduler) EndSession(ctx context.Context, requestID string) error {
	if _, err := s.C.Call(ctx, protocol.EndSession, requestID); err != nil {
		return fmt.Errorf("%s: %w", protocol.EndSession, err)
	}
	return nil
}
