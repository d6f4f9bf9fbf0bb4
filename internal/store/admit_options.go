package store

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"
)

// AdmitMode selects how OperationCreate runs its transaction.
type AdmitMode int8

const (
	// AdmitGrouped (the default) coalesces concurrent admissions of this Store into
	// group transactions (admit_group.go). Every caller still gets its own exact answer.
	AdmitGrouped AdmitMode = iota
	// AdmitSingle runs the group transaction for each request alone (no coalescing):
	// the statement-level savings without group commit. For measurements.
	AdmitSingle
	// AdmitSerial runs the original per-request transaction (operationCreateSerial)
	// for every request. For measurements and as the reference the tests compare with.
	AdmitSerial
)

// String names the mode in reports.
func (m AdmitMode) String() string {
	switch m {
	case AdmitGrouped:
		return "grouped"
	case AdmitSingle:
		return "single"
	case AdmitSerial:
		return "serial"
	}
	return "unknown"
}

// AdmitOptions tunes admission. Zero values take the defaults.
type AdmitOptions struct {
	Mode AdmitMode
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

// admitters maps a Store to its admission queue without keeping the Store alive (the
// Store type is shared with other files; the queue lives here). An entry is removed
// when its Store is collected.
var admitters sync.Map // weak.Pointer[Store] → *admitter

func (s *Store) admitter() *admitter {
	wp := weak.Make(s)
	if a, ok := admitters.Load(wp); ok {
		return a.(*admitter)
	}
	a := &admitter{opts: AdmitOptions{}.withDefaults()}
	got, loaded := admitters.LoadOrStore(wp, a)
	if !loaded {
		runtime.AddCleanup(s, func(k weak.Pointer[Store]) { admitters.Delete(k) }, wp)
	}
	return got.(*admitter)
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

// admit runs one OperationCreate through the configured mode.
func (s *Store) admit(ctx context.Context, p OperationCreateParams) (Operation, bool, error) {
	if err := p.checkStorable(); err != nil {
		return Operation{}, false, err
	}
	a := s.admitter()
	a.mu.Lock()
	mode := a.opts.Mode
	a.mu.Unlock()
	// Urgent applications are few and must not wait for a group: the per-request path
	// writes their priority (the group's multi-row writes carry normal ones only).
	if mode == AdmitSerial || (p.Priority != "" && p.Priority != PriorityNormal) {
		return s.operationCreateSerial(ctx, p)
	}
	if err := ctx.Err(); err != nil {
		return Operation{}, false, err
	}
	r := &admitReq{p: p, done: make(chan struct{})}
	if mode == AdmitSingle {
		r.state.Store(1)
		s.runAdmitGroup(a, []*admitReq{r})
	} else if !a.submit(ctx, s, r) {
		return Operation{}, false, ctx.Err()
	}
	if r.outcome == admitSerial {
		return s.operationCreateSerial(ctx, p)
	}
	if r.err != nil {
		return Operation{}, false, r.err
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
