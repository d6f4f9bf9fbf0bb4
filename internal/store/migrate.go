package store

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"

	batchsql "github.com/batcherd/batcherd/sql"
)

// Migrate applies every embedded migration not yet applied (goose, table
// goose_db_version). It is safe to run from several processes at once only in the
// sense that goose takes no lock: run it from one place (the Kubernetes Job, or
// `batcherd migrate` before starting replicas).
func (s *Store) Migrate(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	fsys, err := fs.Sub(batchsql.Migrations, "migrations")
	if err != nil {
		return err
	}
	// Out of order: a migration's number is reserved when its change starts, so one can
	// land after a higher one (00011 after 00012), and a database migrated in between
	// must take it, not refuse with goose's "missing migrations". Every migration is
	// independent of the ones numbered around it; PendingMigrations lists such a gap too.
	p, err := goose.NewProvider(goose.DialectMySQL, s.db.DB, fsys,
		goose.WithVerbose(false), goose.WithAllowOutofOrder(true))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	res, err := p.Up(ctx)
	for _, r := range res {
		log.Info("migration applied", "version", r.Source.Version, "file", r.Source.Path, "duration", r.Duration)
	}
	if err != nil {
		return fmt.Errorf("applying migrations: %w", err)
	}
	// The installation id is written once, by the first migrate that finds no row
	// (installation.go); later runs keep it.
	if err := s.ensureInstallation(ctx); err != nil {
		return fmt.Errorf("writing the installation id: %w", err)
	}
	return nil
}
