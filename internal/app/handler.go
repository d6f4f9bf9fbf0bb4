package app

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/batcherd/batcherd/internal/api"
)

// handler builds the HTTP API over the scanner (admin rounds and settlement go through
// the very code the loops run).
func (a *App) handler() (http.Handler, error) {
	return api.New(api.Config{
		APITokens:      a.cfg.APITokens,
		AdminTokens:    a.cfg.AdminTokens,
		InsecureNoAuth: a.cfg.InsecureNoAuth,
		WebhookSecret:  a.cfg.WebhookSecret,
		Repos:          a.cfg.Repos,
		AutoApprove:    a.cfg.AutoApprove,
		IdempotencyTTL: a.cfg.IdempotencyTTL,
	}, api.Deps{
		Store:       a.st,
		Log:         a.log.With("component", "api"),
		Registry:    a.reg,
		Rounds:      a.sc,
		Settler:     a.sc,
		SchemaCheck: a.readiness(),
		Kick:        a.sc.Kick,
		Context:     a.bg,
	})
}

// readiness is /readyz's check beyond the database ping: not draining, and the schema
// verified. The schema check reads information_schema, so its result is cached briefly:
// probes from every kubelet every few seconds should not become a load of their own.
func (a *App) readiness() func(context.Context) error {
	var (
		mu      sync.Mutex
		checked time.Time
		last    error
	)
	return func(ctx context.Context) error {
		select {
		case <-a.draining:
			return errors.New("shutting down")
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(checked) < 15*time.Second {
			return last
		}
		_, last = a.st.CheckSchema(ctx)
		checked = time.Now()
		return last
	}
}
