// Package bench measures batcherd against the database's own limits and against the
// alternatives (issue 8; docs/ARCHITECTURE.md, "Database facts"): admission throughput and latency, claim and
// settlement cost, slot contention and an end-to-end run. The measurements are plain
// functions so that both the Go benchmarks (bench_test.go, `go test -bench`) and the
// driver program (cmd/benchrun, `make bench`, which writes BENCHMARKS.md) run them.
//
// Everything talks to the server named by BATCHERD_TEST_DSN (default
// batcherd:batcherd@tcp(127.0.0.1:3306)/) in databases it creates and drops itself.
package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/batcherd/batcherd/internal/store"
)

// DefaultServerDSN is used when BATCHERD_TEST_DSN is unset.
const DefaultServerDSN = "batcherd:batcherd@tcp(127.0.0.1:3306)/"

// ServerDSN is the server the measurements use, without a database.
func ServerDSN() string {
	if v := os.Getenv("BATCHERD_TEST_DSN"); v != "" {
		return v
	}
	return DefaultServerDSN
}

// DB is one database created for a measurement and dropped by Close.
type DB struct {
	Name string
	DSN  string // go-sql-driver DSN of the database
	srv  string
}

// NewDB creates a fresh database (named bench_<what>_<random>) and migrates it.
func NewDB(ctx context.Context, what string) (*DB, error) {
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		return nil, fmt.Errorf("BATCHERD_TEST_DSN: %w", err)
	}
	cfg.DBName = ""
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "bench_" + time.Now().UTC().Format(nameTime) + "_" + what + "_" + hex.EncodeToString(b[:])
	if len(name) > 64 {
		name = name[:64]
	}
	srv := cfg.FormatDSN()
	admin, err := sql.Open("mysql", srv)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		return nil, fmt.Errorf("create database (is MariaDB running? make db): %w", err)
	}
	cfg.DBName = name
	d := &DB{Name: name, DSN: cfg.FormatDSN(), srv: srv}
	st, err := d.Open(ctx, 4)
	if err != nil {
		d.Close()
		return nil, err
	}
	defer st.Close()
	if err := st.Migrate(ctx, nil); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Open opens a Store (its own pool of conns connections) on the database.
func (d *DB) Open(ctx context.Context, conns int) (*store.Store, error) {
	return store.Open(ctx, d.DSN, store.Options{MaxOpenConns: conns})
}

// Raw opens a plain pool on the database with the options the store forces
// (interpolated parameters, UTC), for the raw ceilings and for fixtures.
func (d *DB) Raw(conns int) (*sql.DB, error) {
	cfg, err := store.ParseDSN(d.DSN, store.Options{MaxOpenConns: conns})
	if err != nil {
		return nil, err
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	return db, nil
}

// Reset empties every table of the database but goose's version table, so the next
// measurement starts from the same empty tables as every other one. Without it each
// throughput run would write into what all runs before it left behind: the admission
// tables outgrow the server's buffer pool within a few runs (four rows per admission
// against one per raw INSERT), and the later runs would measure page eviction rather
// than admission.
func (d *DB) Reset(ctx context.Context) error {
	admin, err := sql.Open("mysql", d.DSN)
	if err != nil {
		return err
	}
	defer admin.Close()
	admin.SetMaxOpenConns(1)
	rows, err := admin.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name <> 'goose_db_version'`)
	if err != nil {
		return err
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return err
		}
		tables = append(tables, t)
	}
	rows.Close()
	for _, t := range tables {
		if _, err := admin.ExecContext(ctx, "TRUNCATE TABLE `"+t+"`"); err != nil {
			return fmt.Errorf("reset %s: %w", t, err)
		}
	}
	return nil
}

// Close drops the database.
func (d *DB) Close() error {
	admin, err := sql.Open("mysql", d.srv)
	if err != nil {
		return err
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+d.Name+"`")
	return err
}

// nameTime is the UTC creation time in a database's name, so DropStale can tell old
// leftovers from the databases of a run going on right now.
const nameTime = "20060102150405"

// DropStale drops bench_* databases created more than an hour ago: what killed runs
// left behind.
func DropStale(ctx context.Context) {
	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		return
	}
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return
	}
	defer admin.Close()
	rows, err := admin.QueryContext(ctx, `SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'bench\_%'`)
	if err != nil {
		return
	}
	var names []string
	for rows.Next() {
		var n string
		if rows.Scan(&n) == nil {
			names = append(names, n)
		}
	}
	rows.Close()
	for _, n := range names {
		ts, _, _ := strings.Cut(strings.TrimPrefix(n, "bench_"), "_")
		created, err := time.Parse(nameTime, ts)
		if err != nil || time.Since(created) < time.Hour {
			continue
		}
		_, _ = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+n+"`")
	}
}
