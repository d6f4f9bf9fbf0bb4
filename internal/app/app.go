// Package app owns batcherd's lifecycle: it turns a validated config into running
// components (store, GitLab client, scanner loops, HTTP server), starts them and stops
// them in order. cmd/batcherd is a thin shell over it, and end-to-end tests start the
// same App in-process on :0.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/scanner"
	"github.com/batcherd/batcherd/internal/store"
)

// Exit codes of the batcherd binary (documented in the README and `batcherd help`).
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2
	ExitSchemaDrift = 3
)

// Env is what a subcommand gets besides its configuration.
type Env struct {
	Log     *slog.Logger
	Stdout  io.Writer
	Version string
	// TuneScanner, when set, adjusts the scanner's configuration before it starts.
	// Tests use it for sub-second loop intervals; the binary leaves it nil.
	TuneScanner func(*scanner.Config)
}

// ErrSchemaDrift marks errors that mean "the live schema lacks a constraint batcherd
// relies on"; the binary exits with ExitSchemaDrift.
var ErrSchemaDrift = errors.New("schema drift")

// ErrViolations marks a verify run that found invariant violations (exit 1).
var ErrViolations = errors.New("invariant violations found")

// ExitCode maps an error returned by a subcommand to the process exit code.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrSchemaDrift):
		return ExitSchemaDrift
	case errors.Is(err, store.ErrInvalidDSN):
		return ExitUsage // a configuration error, whichever path found it
	case errors.Is(err, ErrPreflight):
		return ExitUsage // GitLab refuses the token or does not show a repository
	}
	return ExitFailure
}

// receiverIDs are the identities every event is written for (README "Events").
func receiverIDs(cfg *config.Config) []int64 {
	var ids []int64
	for _, r := range cfg.EventReceivers() {
		ids = append(ids, r.ID)
	}
	return ids
}

func openStore(ctx context.Context, cfg *config.Config) (*store.Store, error) {
	return store.Open(ctx, cfg.MySQLDSN, store.Options{MaxOpenConns: cfg.MySQLMaxConn, EventReceivers: receiverIDs(cfg)})
}

// Migrate applies the embedded migrations and then verifies the schema.
func Migrate(ctx context.Context, cfg *config.Config, env Env) error {
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx, env.Log); err != nil {
		return err
	}
	if err := checkSchema(ctx, st, env.Log); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "schema is up to date and verified")
	return nil
}

// CheckSchema verifies the live schema (I8) without changing anything.
func CheckSchema(ctx context.Context, cfg *config.Config, env Env) error {
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := checkSchema(ctx, st, env.Log); err != nil {
		return err
	}
	fmt.Fprintln(env.Stdout, "schema verified: every constraint batcherd relies on is present")
	return nil
}

// checkSchema runs the I8 check, logs the server's isolation settings and returns a
// *SchemaError (ErrSchemaDrift, exit 3) when migrations are pending or the schema
// drifted (schema.go).
func checkSchema(ctx context.Context, st *store.Store, log *slog.Logger) error {
	// Only what the check found is drift (exit 3). Failing to read the schema (the
	// connection broke, the server went away mid-check) is an ordinary failure (exit 1):
	// a network blip must not send an operator to the drift runbook. Found by the chaos
	// run's live `batcherd verify` during a database restart.
	pending, err := st.PendingMigrations(ctx)
	if err != nil {
		return fmt.Errorf("reading the schema: %w", err)
	}
	rep, err := st.CheckSchema(ctx)
	if err != nil && !errors.Is(err, store.ErrSchemaDrift) {
		return fmt.Errorf("reading the schema: %w", err)
	}
	if len(pending) > 0 || err != nil {
		return &SchemaError{Database: rep.Database, Pending: pending, Problems: rep.Problems}
	}
	log.Info("schema verified", rep.LogAttrs()...)
	return nil
}
