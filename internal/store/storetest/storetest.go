// Package storetest gives each test its own freshly migrated MariaDB/MySQL database,
// dropped when the test ends. Tests talk to the real server named by
// BATCHERD_TEST_DSN (default batcherd:batcherd@tcp(127.0.0.1:3306)/, which
// scripts/mariadb-bootstrap.sh creates); nothing is shared between tests.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/store"
)

// DefaultDSN is used when BATCHERD_TEST_DSN is unset. It has no database name: each
// test creates its own.
const DefaultDSN = "batcherd:batcherd@tcp(127.0.0.1:3306)/"

// ServerDSN returns the test server DSN without a database.
func ServerDSN() string {
	if v := os.Getenv("BATCHERD_TEST_DSN"); v != "" {
		return v
	}
	return DefaultDSN
}

// NewDatabase creates a uniquely named, empty database and returns a DSN pointing at
// it. It is dropped when t ends.
func NewDatabase(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		t.Fatalf("BATCHERD_TEST_DSN: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "bt_" + sanitize(t.Name()) + "_" + hex.EncodeToString(b[:])
	if len(name) > 64 {
		name = name[len(name)-64:]
		name = "b" + name[1:]
	}
	admin, err := sqlx.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("open admin connection: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4"); err != nil {
		t.Fatalf("create test database (is MariaDB running? run scripts/mariadb-bootstrap.sh): %v", err)
	}
	t.Cleanup(func() {
		a, err := sqlx.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return
		}
		defer a.Close()
		if _, err := a.Exec("DROP DATABASE IF EXISTS `" + name + "`"); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}

// New returns a Store on a fresh, migrated database, closed and dropped when t ends.
func New(t testing.TB) (*store.Store, string) {
	t.Helper()
	dsn := NewDatabase(t)
	ctx := context.Background()
	st, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 64})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx, nil); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return st, dsn
}

// Open opens another Store, with a pool of conns connections, on the database of dsn
// (from New), closed when t ends: a second replica, or a pool small enough to prove
// that a method never needs a second connection while it holds one.
func Open(t testing.TB, dsn string, conns int) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: conns})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if len(out) > 30 {
		out = out[:30]
	}
	return out
}
