package harness

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A private MariaDB starts on its own port, lets batcherd's account create a
// database, keeps the data across a restart on the same port, and leaves nothing
// behind when closed.
func TestPrivateMariaDB(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private mariadbd (skipped under -short)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m, err := StartMariaDB(ctx, MariaDBOptions{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	db, err := sql.Open("mysql", m.ServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec := func(q string) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec("CREATE DATABASE t1")
	mustExec("CREATE TABLE t1.x (id INT PRIMARY KEY) ENGINE=InnoDB")
	mustExec("INSERT INTO t1.x VALUES (42)")
	port, pid := m.Port, m.Process().Pid()

	if err := m.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if m.Port != port || m.Process().Pid() == pid || m.Starts() != 2 {
		t.Fatalf("after restart: port %d (was %d), pid %d (was %d), starts %d", m.Port, port, m.Process().Pid(), pid, m.Starts())
	}
	var n int
	// The pool's old connections died with the server; database/sql retries on a
	// fresh one.
	if err := db.QueryRowContext(ctx, "SELECT id FROM t1.x").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after restart: %d, %v", n, err)
	}
	// Stop, then Start by hand, as a chaos run does.
	if err := m.Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if m.Running() {
		t.Fatal("still running after Stop")
	}
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("ping answered while the server is stopped")
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("ping after Start: %v", err)
	}
	// A crash: committed rows survive (crash recovery from the redo log).
	mustExec("INSERT INTO t1.x VALUES (43)")
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM t1.x").Scan(&n); err != nil || n != 2 {
		t.Fatalf("after kill -9 and start: %d rows, %v", n, err)
	}
	dir := m.Dir
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after Close: %v", dir, err)
	}
	if m.Running() {
		t.Fatal("mariadbd runs after Close")
	}
}

// Directories of runs that died are removed; a live run's directory is kept.
func TestCleanStaleMariaDBDirs(t *testing.T) {
	parent := t.TempDir()
	mk := func(name, owner string) string {
		d := filepath.Join(parent, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(d, "owner.pid"), []byte(owner), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		old := time.Now().Add(-2 * time.Hour)
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
		return d
	}
	dead := mk(mariaDBDirPrefix+"dead", "999999999")
	mine := mk(mariaDBDirPrefix+"mine", strconv.Itoa(os.Getpid()))
	other := mk("something-else", "")
	removed, err := CleanStaleMariaDBDirs(parent, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != dead {
		t.Fatalf("removed %v, want [%s]", removed, dead)
	}
	for _, d := range []string{mine, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
}
