package app

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/batcherd/batcherd/internal/api"
	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/ui"
)

// handler builds the HTTP API over the scanner (admin rounds and settlement go through
// the very code the loops run).
func (a *App) handler() (http.Handler, error) {
	authn, err := a.authenticator()
	if err != nil {
		return nil, err
	}
	// The status page checks logins with the same authenticator as the API.
	page, err := ui.New(ui.Config{
		Auth:           authn,
		InsecureNoAuth: a.cfg.InsecureNoAuth,
		SessionKey:     []byte(a.cfg.UISessionKey),
		SessionTTL:     a.cfg.UISessionTTL,
		Repos:          a.cfg.Repos,
	}, a.st, a.log.With("component", "ui"))
	if err != nil {
		return nil, err
	}
	return api.New(api.Config{
		Auth:           authn,
		InsecureNoAuth: a.cfg.InsecureNoAuth,
		// Four eyes is on unless BATCHERD_FOUR_EYES=false.
		AllowSelfApproval: !a.cfg.FourEyes,
		WebhookSecret:     a.cfg.WebhookSecret,
		Repos:             a.cfg.Repos,
		AutoApprove:       a.cfg.AutoApprove,
		IdempotencyTTL:    a.cfg.IdempotencyTTL,
		LogRequests:       a.cfg.LogRequests,
	}, api.Deps{
		Store:       a.st,
		Log:         a.log.With("component", "api"),
		Registry:    a.reg,
		Rounds:      a.sc,
		Settler:     a.sc,
		SchemaCheck: a.readiness(),
		Kick:        a.sc.Kick,
		Context:     a.bg,
		UI:          page,
	})
}

// authenticator builds the principals of BATCHERD_API_TOKENS / BATCHERD_ADMIN_TOKENS
// and, when configured, the OIDC issuer (an issuer unreachable now is a warning).
func (a *App) authenticator() (*auth.Authenticator, error) {
	toks, err := auth.ParseTokens(a.cfg.TokenLists()...)
	if err != nil {
		return nil, err
	}
	// From here on batcherd holds the tokens only as the digests in toks: the
	// configuration's copies go (it stays with the replica for its whole life).
	a.cfg.ForgetTokens()
	var o *auth.OIDC
	if a.cfg.OIDCEnabled() {
		o, err = auth.NewOIDC(a.bg, auth.OIDCConfig{
			Issuer:        a.cfg.OIDCIssuer,
			Audience:      a.cfg.OIDCAudience,
			UsernameClaim: a.cfg.OIDCUsernameClaim,
			GroupsClaim:   a.cfg.OIDCGroupsClaim,
			AdminGroups:   a.cfg.OIDCAdminGroups,
			Log:           a.log,
		})
		if err != nil {
			return nil, fmt.Errorf("%sOIDC_ISSUER: %w", config.Prefix, err)
		}
	}
	return auth.New(toks, o), nil
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
			return api.ErrDraining
		default:
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Since(checked) < 15*time.Second {
			return last
		}
		_, err := a.st.CheckSchema(ctx)
		// Only an answer is kept: a schema that checks out or one that drifted. A check
		// that could not run (a timeout, a dropped connection) is tried again by the
		// next probe instead of failing readiness for 15 s.
		if err == nil || errors.Is(err, store.ErrSchemaDrift) {
			last, checked = err, time.Now()
		}
		return err
	}
}
