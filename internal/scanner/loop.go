package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"time"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// loopSpec is one loop as Run drives it.
type loopSpec struct {
	name  string
	run   func(ctx context.Context) error
	every time.Duration                     // fixed interval (jittered ±10%), or
	next  func(now time.Time) time.Duration // a schedule (claim's cron)
	kick  <-chan struct{}                   // wakes the loop before its tick
}

// errSomeFailed is returned by a runOnce whose every item failed (already logged and
// counted per item): the loop backs off instead of hammering a sick dependency.
var errSomeFailed = errors.New("every item of the pass failed")

// runLoop drives one loop until stop ends. Work runs on work, which outlives stop by
// the shutdown grace period.
func (s *Scanner) runLoop(stop, work context.Context, l loopSpec) {
	log := s.log.With("loop", l.name)
	first := l.every
	if l.next != nil {
		first = l.next(time.Now())
	}
	// Start jitter: replicas started together (a rollout) should not poll in lockstep.
	if !sleep(stop, randDur(min(s.cfg.StartJitter, first)), nil) {
		return
	}
	failures := 0
	for stop.Err() == nil {
		err := s.runPass(work, l, log)
		var wait time.Duration
		if l.next != nil {
			wait = l.next(time.Now())
		} else {
			wait = jitter(l.every)
		}
		switch {
		case err == nil || isCanceled(err):
			failures = 0
		default:
			// Backoff only ever lengthens the wait: a loop whose interval is longer than
			// BackoffMax (orphans, cleanup) would otherwise rerun its whole pass more
			// often while it fails than while it succeeds, on every replica at once.
			failures++
			wait = max(wait, backoff(s.cfg.BackoffBase, s.cfg.BackoffMax, failures))
			log.Debug("pass failed; backing off", "failures", failures, "wait", wait)
		}
		if !sleep(stop, wait, l.kick) {
			return
		}
	}
}

// runPass runs one pass with metrics, turning a panic into an error so one bad batch
// cannot take the replica down.
func (s *Scanner) runPass(ctx context.Context, l loopSpec, log *slog.Logger) (err error) {
	start := time.Now()
	defer func() {
		if r := recover(); r != nil {
			log.Error("loop pass panicked", "panic", r, "stack", string(debug.Stack()))
			s.m.errors.WithLabelValues(l.name, "panic").Inc()
			err = fmt.Errorf("panic: %v", r)
		}
		s.m.runs.WithLabelValues(l.name).Inc()
		s.m.duration.WithLabelValues(l.name).Observe(time.Since(start).Seconds())
	}()
	err = l.run(withLoop(ctx, l.name))
	if err != nil && !isCanceled(err) && !errors.Is(err, errSomeFailed) {
		s.m.errors.WithLabelValues(l.name, errClass(err)).Inc()
		log.Warn("loop pass failed", "err", err, "class", errClass(err))
	}
	return err
}

// loopKey is the context key under which runPass names the loop whose pass runs, so
// forEach can name it when one of the pass's items panics.
type loopKey struct{}

func withLoop(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, loopKey{}, name)
}

// loopOf names the loop running ctx's pass; "unknown" when the pass was not started by
// runPass (tests call runOnce directly).
func loopOf(ctx context.Context) string {
	if name, ok := ctx.Value(loopKey{}).(string); ok {
		return name
	}
	return "unknown"
}

// itemErr logs and counts the failure of one item (batch, binding, MR) of a pass.
// Lost races and cancellations are not errors.
func (s *Scanner) itemErr(loop string, log *slog.Logger, msg string, err error) error {
	switch {
	case err == nil:
		return nil
	case isCanceled(err):
		log.Debug(msg+": cancelled", "err", err)
	case isLost(err):
		s.m.outcomes.WithLabelValues(loop, "lost_race").Inc()
		log.Debug(msg+": lost race", "err", err)
		return nil
	default:
		class := errClass(err)
		s.m.errors.WithLabelValues(loop, class).Inc()
		lvl := slog.LevelWarn
		if class == "gitlab_permanent" || class == "other" {
			lvl = slog.LevelError
		}
		log.Log(context.Background(), lvl, msg, "err", err, "class", class)
	}
	return err
}

// passResult turns the per-item tally of a pass into its result.
func passResult(started, failed int) error {
	if started > 0 && failed == started {
		return errSomeFailed
	}
	return nil
}

// errClass names an error for the errors metric.
func errClass(err error) string {
	if c := mr.ClassOf(err); c != mr.ClassNone {
		return "gitlab_" + c.String()
	}
	switch {
	case errors.Is(err, store.ErrCommitUnknown):
		return "db_commit_unknown"
	case errors.Is(err, store.ErrNotPrimary):
		return "db_not_primary"
	case errors.Is(err, store.ErrUnavailable):
		return "db_unavailable"
	case store.IsDBError(err):
		return "db"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, store.ErrNotFound):
		return "not_found"
	}
	return "other"
}

// sleep waits d, returning early (true) on a kick, false when ctx ended.
func sleep(ctx context.Context, d time.Duration, kick <-chan struct{}) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	case <-kick:
		return true
	}
}

// backoff is capped exponential backoff with "equal jitter": half fixed so retries
// never collapse to zero, half random so replicas failing together spread out.
func backoff(base, max time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return d/2 + randDur(d/2)
}

// jitter spreads a fixed interval by ±10% so replicas drift apart.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d - d/10 + randDur(d/5)
}

func randDur(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d)))
}
