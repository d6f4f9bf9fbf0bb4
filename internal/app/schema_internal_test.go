package app

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/batcherd/batcherd/internal/api"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// A schema check that cannot read the schema (the connection broke, the server went
// away mid-check, as a chaos run's database restart does) is an ordinary failure,
// exit 1, not schema drift, exit 3: drift is a fact about the schema, and calling a
// network blip drift sends an operator to the wrong runbook (and made a live
// `batcherd verify` during a restart look like drift). Real drift stays exit 3
// (TestServeRefusesSchemaDrift, cmd/batcherd's exit-code tests).
func TestSchemaReadFailureIsNotDrift(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the database server")
	}
	st, _ := storetest.New(t)
	if err := checkSchema(context.Background(), st, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("migrated schema: %v", err)
	}
	// The pool is gone: every read of the schema fails.
	st.Close()
	err := checkSchema(context.Background(), st, slog.New(slog.DiscardHandler))
	if err == nil {
		t.Fatal("schema check on a closed pool succeeded")
	}
	if errors.Is(err, ErrSchemaDrift) || ExitCode(err) != ExitFailure {
		t.Fatalf("unreadable schema reported as drift (exit %d): %v", ExitCode(err), err)
	}
}

// Readiness keeps an answer about the schema (it checks out, or it drifted) for a
// while, but not a check that could not run: one cancelled or timed-out check must
// not hold the replica out of its Service for the next 15 s.
func TestReadinessDoesNotKeepAFailedCheck(t *testing.T) {
	st, _ := storetest.New(t)
	a := &App{st: st, draining: make(chan struct{})}
	ready := a.readiness()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if err := ready(gone); err == nil {
		t.Fatal("a check on an ended context succeeded")
	}
	if err := ready(context.Background()); err != nil {
		t.Fatalf("the next probe got the failed check's answer: %v", err)
	}
	close(a.draining)
	if err := ready(context.Background()); !errors.Is(err, api.ErrDraining) {
		t.Fatalf("draining: %v", err)
	}
}
