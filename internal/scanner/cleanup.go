package scanner

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// cleanupConfig is the cleanup loop's slice of Config.
type cleanupConfig struct {
	interval  time.Duration
	chunk     int
	retention time.Duration
}

// cleanupLoop purges expired idempotency keys and old finished waiting rows, one
// bounded chunk per statement so no transaction holds many locks or grows the undo
// log, looping while a chunk comes back full.
type cleanupLoop struct {
	s   *Scanner
	cfg cleanupConfig
	log *slog.Logger
}

// maxChunksPerPass bounds one pass; what is left waits for the next tick rather than
// keeping the database busy.
const maxChunksPerPass = 100

func (l *cleanupLoop) runOnce(ctx context.Context) error {
	keys, err1 := l.drain(ctx, func(ctx context.Context) (int64, error) {
		return l.s.st.CleanupIdempotency(ctx, l.cfg.chunk)
	})
	rows, err2 := l.drain(ctx, func(ctx context.Context) (int64, error) {
		return l.s.st.CleanupWaiting(ctx, l.cfg.retention, l.cfg.chunk)
	})
	if keys+rows > 0 {
		l.s.m.outcomes.WithLabelValues("cleanup", "idempotency_keys_deleted").Add(float64(keys))
		l.s.m.outcomes.WithLabelValues("cleanup", "waiting_rows_deleted").Add(float64(rows))
		l.log.Info("cleanup", "idempotency_keys", keys, "waiting_rows", rows)
	}
	return errors.Join(err1, err2)
}

func (l *cleanupLoop) drain(ctx context.Context, chunk func(context.Context) (int64, error)) (int64, error) {
	var total int64
	for range maxChunksPerPass {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		n, err := chunk(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(l.cfg.chunk) {
			break
		}
	}
	return total, nil
}
