package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/drift"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
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
	drifted, err := verifyDrift(ctx, cfg, st, env)
	if err != nil {
		return fmt.Errorf("verify: drift: %w", err)
	}
	switch {
	case schemaErr != nil:
		return schemaErr
	case !rep.Clean():
		return fmt.Errorf("%w: %d", ErrViolations, len(rep.Violations)+drifted)
	case drifted > 0:
		return fmt.Errorf("%w: %d file(s) of the repositories differ from the database (drift)", ErrViolations, drifted)
	}
	return nil
}

// verifyDrift compares each repository's bindings/ tree with the database's bindings
// (the drift loop's check, run now) and prints one line per file that differs. It
// needs GitLab, which the rest of verify does not: without BATCHERD_GITLAB_URL and
// BATCHERD_GITLAB_TOKEN it says so and checks nothing. It returns the files found.
func verifyDrift(ctx context.Context, cfg *config.Config, st *store.Store, env Env) (int, error) {
	if cfg.GitLabURL == "" || cfg.GitLabToken == "" || len(cfg.Repos) == 0 {
		fmt.Fprintln(env.Stdout, "[drift] not checked: set BATCHERD_GITLAB_URL, BATCHERD_GITLAB_TOKEN and BATCHERD_REPOS to compare each repository's bindings/ tree with the database")
		return 0, nil
	}
	gl, err := mr.New(mr.Config{BaseURL: cfg.GitLabURL, Token: cfg.GitLabToken, CallTimeout: cfg.GitLabTimeout, TargetBranch: cfg.TargetBranch})
	if err != nil {
		return 0, err
	}
	total := 0
	for _, repo := range cfg.Repos {
		rep, err := drift.Check(ctx, gl, st, repo, gl.TargetBranch())
		if err != nil {
			return total, fmt.Errorf("repository %s: %w", repo, err)
		}
		for _, f := range rep.Files {
			fmt.Fprintf(env.Stdout, "[drift] %s: %s %s: %s\n", repo, f.Kind, f.Path, f.Detail)
		}
		c := rep.Counts()
		fmt.Fprintf(env.Stdout, "[drift] %s (%s): %d unexpected, %d missing, %d modified\n", repo, gl.TargetBranch(), c.Unexpected, c.Missing, c.Modified)
		total += len(rep.Files)
	}
	return total, nil
}
