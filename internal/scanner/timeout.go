package scanner

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
)

// timeoutConfig is the timeout sweep's slice of Config.
type timeoutConfig struct {
	interval time.Duration
	timeout  time.Duration
	lease    time.Duration
	limit    int
	workers  int
}

// timeoutLoop fails active batches older than the timeout (DB clock), through settle
// failure (close the MR, re-read, merged wins). A RUNNING batch without an MR is
// publish's to resume until it is past the timeout; then publish leaves it, and once
// the last publish reservation has lapsed it fails here too (never under a live one:
// store.BatchesTimedOut), and settle failure finds any MR a publisher opened by its
// branch.
type timeoutLoop struct {
	s   *Scanner
	cfg timeoutConfig
	log *slog.Logger
}

func (l *timeoutLoop) runOnce(ctx context.Context) error {
	old, err := l.s.st.BatchesTimedOut(ctx, l.cfg.timeout, l.cfg.limit)
	if err != nil {
		return err
	}
	started, failed := forEach(ctx, l.s, l.cfg.workers, old, func(ctx context.Context, b domain.Batch) error {
		log := batchLog(l.log, b)
		rb, err := l.s.st.BatchReserve(ctx, b.ID, b.Version, l.cfg.lease)
		if err != nil {
			return l.s.itemErr("timeout", log, "reserve failed", err)
		}
		l.s.step(ctx, "timeout.reserved", b.ID)
		msg := fmt.Sprintf("batch did not finish within %s (status %s)", l.cfg.timeout, rb.Status)
		class := domain.ClassTimeout
		if rb.Status == domain.BatchBlocked && rb.ErrorMessage != "" {
			msg += ": blocked: " + rb.ErrorMessage
		} else if rb.MRIID == nil {
			// Publishing never got as far as recording an MR: GitLab refused or was
			// unreachable for the whole timeout.
			class = domain.ClassUnavailable
			msg += ": no merge request was recorded (GitLab unavailable or refusing the publish)"
		}
		_, err = l.s.settleFailure(ctx, rb, failure{class, truncate(msg, 1024)}, log)
		if err == nil {
			l.s.m.outcomes.WithLabelValues("timeout", "timed_out").Inc()
		}
		return l.s.itemErr("timeout", log, "settling a timed-out batch failed", err)
	})
	return passResult(started, failed)
}
