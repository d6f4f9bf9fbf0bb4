package store

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	batchsql "github.com/batcherd/batcherd/sql"
)

// PendingMigrations lists the embedded migrations this database has not applied, as
// file names in the order `batcherd migrate` would apply them; empty when it is up to
// date. It only reads (goose's table goose_db_version, absent on a database never
// migrated), so check-schema and serve can tell "not migrated" from drift.
func (s *Store) PendingMigrations(ctx context.Context) ([]string, error) {
	files, err := fs.Glob(batchsql.Migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	var tables int
	if err := s.db.GetContext(ctx, &tables,
		`SELECT COUNT(*) FROM information_schema.TABLES
		  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'goose_db_version'`); err != nil {
		return nil, translate(err)
	}
	applied := map[int64]bool{}
	if tables > 0 {
		// goose records every up and down: a version's latest row says whether it is applied.
		var rows []struct {
			Version int64 `db:"version_id"`
			Applied bool  `db:"is_applied"`
		}
		if err := s.db.SelectContext(ctx, &rows,
			`SELECT g.version_id, g.is_applied FROM goose_db_version g
			   JOIN (SELECT version_id, MAX(id) AS id FROM goose_db_version GROUP BY version_id) l ON l.id = g.id`); err != nil {
			return nil, translate(err)
		}
		for _, r := range rows {
			applied[r.Version] = r.Applied
		}
	}
	var pending []string
	for _, f := range files {
		name := path.Base(f)
		num, _, _ := strings.Cut(name, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration %s: no version number", name)
		}
		if !applied[v] {
			pending = append(pending, name)
		}
	}
	return pending, nil
}
