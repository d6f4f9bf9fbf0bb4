package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/verify"
)

// Verify audits the live database read-only and prints a report. It returns
// ErrViolations (exit 1) when any invariant is broken, and ErrSchemaDrift (exit 3)
// when the schema itself has drifted.
func Verify(ctx context.Context, cfg *config.Config, env Env) error {
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	schemaErr := checkSchema(ctx, st, env.Log)
	var schema *SchemaError
	if errors.As(schemaErr, &schema) {
		if len(schema.Pending) > 0 {
			return schemaErr // nothing to audit before the tables exist
		}
		fmt.Fprintf(env.Stdout, "[I8] schema: %d problem(s), listed with the fix after the report\n", len(schema.Problems))
	} else if schemaErr != nil {
		return schemaErr
	}
	rep, err := verify.Run(ctx, st.DB(), verify.Options{})
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	rep.Print(env.Stdout)
	switch {
	case schemaErr != nil:
		return schemaErr
	case !rep.Clean():
		return fmt.Errorf("%w: %d", ErrViolations, len(rep.Violations))
	}
	return nil
}
