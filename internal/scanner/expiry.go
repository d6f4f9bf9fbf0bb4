package scanner

import (
	"context"
	"log/slog"
	"time"

	"github.com/google/uuid"
)

// expiryConfig is the expiry loop's slice of Config.
type expiryConfig struct {
	interval time.Duration
	limit    int
}

// expiryLoop admits a revoke operation for every active binding past its expires_at
// (DB clock). The revoke then travels the normal path (claim, publish, merge).
// BindingExpire is guarded on the binding's version, so two replicas expiring the same
// binding make one revoke; the loser's lost race is silent.
type expiryLoop struct {
	s   *Scanner
	cfg expiryConfig
	log *slog.Logger
}

func (l *expiryLoop) runOnce(ctx context.Context) error {
	expired, err := l.s.st.BindingsExpired(ctx, l.cfg.limit)
	if err != nil {
		return err
	}
	started, failed, made := 0, 0, 0
	for _, b := range expired {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		started++
		log := l.log.With("repo", b.Repo, "subject", b.Subject, "target", b.Target)
		op, err := l.s.st.BindingExpire(ctx, b, uuid.NewString())
		if err != nil {
			if l.s.itemErr("expiry", log, "expiring binding failed", err) != nil {
				failed++
			}
			continue
		}
		made++
		l.s.m.outcomes.WithLabelValues("expiry", "revoke_admitted").Inc()
		log.Info("binding expired: revoke admitted", "operation_id", op.OperationID)
	}
	if made > 0 {
		kick(l.s.kickPublish)
	}
	return passResult(started, failed)
}
