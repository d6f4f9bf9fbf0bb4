package app

import (
	"context"
	"errors"
	"log/slog"
	"testing"

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
