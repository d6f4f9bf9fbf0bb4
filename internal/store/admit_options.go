package store

import (
	"context"
	"fmt"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
)

// AdmitOptions tunes admission. Zero values take the defaults.
//
// There is one admission path: concurrent admissions of one Store coalesce into group
// transactions (admit_group.go), each caller getting its own exact answer, and what a
// group cannot answer exactly runs through the per-request transaction
// (OperationCreateSerial). The options only size and pace the groups; MaxGroup 1 with
// MaxInflight at the number of callers runs each request alone through the group code
// (what bench measures as "single").
type AdmitOptions struct {
	// MaxGroup is the most requests one group transaction takes [64].
	MaxGroup int
	// MaxInflight is the most group transactions in flight at once [2]. While they
	// run, new requests queue and form the next groups; a lone request never waits.
	MaxInflight int
	// Linger makes a worker wait this long before taking a group, to let more requests
	// join [0: none]. Under a closed-loop load the in-flight groups already batch the
	// arrivals, so lingering only adds latency; it is here to be measured.
	Linger time.Duration
	// PlainStatements runs each group with one statement per write (BEGIN, read, one
	// multi-row statement per table, COMMIT) even on a server that takes compound
	// statements, where a group otherwise needs one or two round trips
	// (admit_compound.go).
	PlainStatements bool
}

func (o AdmitOptions) withDefaults() AdmitOptions {
	if o.MaxGroup <= 0 {
		o.MaxGroup = 64
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 2
	}
	if o.Linger < 0 {
		o.Linger = 0
	}
	return o
}

// AdmitStats counts what admission did on one Store since it was opened.
type AdmitStats struct {
	Groups   int64 // group transactions started
	Compound int64 // of which ran with compound statements (admit_compound.go)
	// Optimistic groups tried the one-round-trip write; OptimisticMisses of them were
	// refused (a stored key, an existing binding, …) and took the read path.
	Optimistic, OptimisticMisses int64
	Grouped                      int64 // requests that went through a group
	Serial                       int64 // requests answered by the per-request transaction instead (deferred or fallback)
	Fallbacks                    int64 // groups whose writes failed and were handed back to per-request transactions
	Abandoned                    int64 // requests whose caller's context ended before a group took them
	MaxGroup                     int64 // largest group
}

// admitter returns this Store's admission queue, made on first use (a Store made by
// Open has one at once; the lazy path keeps a zero Store usable in tests).
func (s *Store) admitter() *admitter {
	s.admitOnce.Do(func() { s.admit = &admitter{opts: AdmitOptions{}.withDefaults()} })
	return s.admit
}

// SetAdmitOptions changes how this Store admits operations (benchmarks, tests). Safe to
// call at any time; requests already queued keep going through groups.
func (s *Store) SetAdmitOptions(o AdmitOptions) {
	a := s.admitter()
	a.mu.Lock()
	a.opts = o.withDefaults()
	a.mu.Unlock()
}

// AdmitStats returns the admission counters of this Store.
func (s *Store) AdmitStats() AdmitStats {
	c := &s.admitter().stats
	return AdmitStats{
		Groups: c.groups.Load(), Compound: c.compound.Load(),
		Optimistic: c.optimistic.Load(), OptimisticMisses: c.optimisticMisses.Load(), Grouped: c.grouped.Load(), Serial: c.serial.Load(),
		Fallbacks: c.fallbacks.Load(), Abandoned: c.abandoned.Load(), MaxGroup: c.maxGroup.Load(),
	}
}

// admitGrouped runs one OperationCreate through the group path.
func (s *Store) admitGrouped(ctx context.Context, p OperationCreateParams) (domain.Operation, bool, error) {
	if err := p.checkStorable(); err != nil {
		return domain.Operation{}, false, err
	}
	a := s.admitter()
	// Urgent applications are few and must not wait for a group: the per-request path
	// writes their priority (the group's multi-row writes carry normal ones only).
	if p.Priority != "" && p.Priority != domain.PriorityNormal {
		return s.OperationCreateSerial(ctx, p)
	}
	if err := ctx.Err(); err != nil {
		return domain.Operation{}, false, err
	}
	r := &admitReq{p: p, done: make(chan struct{})}
	if !a.submit(ctx, s, r) {
		return domain.Operation{}, false, ctx.Err()
	}
	if r.outcome == admitSerial {
		return s.OperationCreateSerial(ctx, p)
	}
	if r.err != nil {
		return domain.Operation{}, false, r.err
	}
	return r.op, true, nil
}

// checkStorable refuses what the database cannot hold before the request meets others:
// the driver refuses to send a time past year 9999, and inside an admission group that
// refusal would fail every request in the group with an unknown outcome.
func (p OperationCreateParams) checkStorable() error {
	if p.ExpiresAt == nil {
		return nil
	}
	switch y := p.ExpiresAt.UTC().Year(); {
	case y > 9999:
		return fmt.Errorf("%w: expires_at is past 9999-12-31T23:59:59Z, the latest time the database can store", ErrInvalidRequest)
	case y < 1:
		return ErrExpiresInPast
	}
	return nil
}
