package harness

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// scripts/mariadb-bootstrap.sh (make db), run against a private MariaDB, creates a test
// user that can create and drop exactly the databases the tests, the demo and the bench
// name for themselves (made here by the code that makes them, where it can be called),
// and nothing else: no global privilege, no other database.
func TestBootstrapGrantsOnlyTheTestDatabases(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private mariadbd (skipped under -short)")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	m, err := StartMariaDB(ctx, MariaDBOptions{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() }) // after the databases' own cleanups below

	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bootstrap := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "mariadb-bootstrap.sh"), args...)
		cmd.Env = append(os.Environ(), "BATCHERD_DB_PORT="+strconv.Itoa(m.Port), "BATCHERD_TEST_USER=granttest",
			"BATCHERD_TEST_PASSWORD=granttest-pw",
			"BATCHERD_DB_SOCKET="+m.Socket) // root's socket fallback must reach this server, not the machine's
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("mariadb-bootstrap.sh %v: %v\n%s", args, err, out)
		}
	}
	bootstrap()
	t.Run("run-db", func(t *testing.T) { testRunDB(ctx, t, m, bootstrap) })

	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr = "granttest", "granttest-pw", "tcp", "127.0.0.1:"+strconv.Itoa(m.Port)
	serverDSN := cfg.FormatDSN()
	db, err := sql.Open("mysql", serverDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	// The names the code makes: storetest (every package's tests) and the harness
	// (end-to-end tests; the demo's prefix is cmd/batcherd-demo's dbPrefix).
	t.Setenv("BATCHERD_TEST_DSN", serverDSN)
	_ = storetest.NewDatabase(t)
	for _, prefix := range []string{"bt_harness", "bt_e2e", "batcherd_demo"} {
		c := &Cluster{Opts: Options{ServerDSN: serverDSN, DBPrefix: prefix}}
		if err := c.createDatabase(ctx); err != nil {
			t.Fatalf("prefix %s: %v", prefix, err)
		}
		if err := c.dropDatabase(); err != nil {
			t.Fatalf("prefix %s: %v", prefix, err)
		}
	}
	// bench/db.go's names (bench_<time>_<what>_<random>).
	if _, err := db.ExecContext(ctx, "CREATE DATABASE bench_20260101000000_x_ab"); err != nil {
		t.Errorf("bench database: %v", err)
	} else if _, err := db.ExecContext(ctx, "DROP DATABASE bench_20260101000000_x_ab"); err != nil {
		t.Errorf("drop bench database: %v", err)
	}

	// Nothing else: '_' is literal in the patterns, and there is no global privilege.
	for _, name := range []string{"btx_1", "batcherd", "batcherd_demox", "benchx", "mysql_copy"} {
		if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err == nil {
			t.Errorf("the test user could create database %s", name)
			_, _ = db.ExecContext(ctx, "DROP DATABASE `"+name+"`")
		}
	}
	rows, err := db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(g, " ON *.* ") && !strings.HasPrefix(g, "GRANT USAGE ON *.*") {
			t.Errorf("global privilege: %s", g)
		}
	}
}

// testRunDB: `make run-db` (the README's run section) makes the database batcherd and a
// user that can migrate it and pass the schema check, and create no other database.
func testRunDB(ctx context.Context, t *testing.T, m *MariaDB, bootstrap func(...string)) {
	bootstrap("--run-db")
	bootstrap("--run-db") // idempotent
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = "batcherd_run", "batcherd_run", "tcp", "127.0.0.1:"+strconv.Itoa(m.Port), "batcherd"
	st, err := store.Open(ctx, cfg.FormatDSN(), store.Options{MaxOpenConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx, nil); err != nil {
		t.Fatalf("migrate as the run user: %v", err)
	}
	if _, err := st.CheckSchema(ctx); err != nil {
		t.Fatalf("schema check as the run user: %v", err)
	}
	if _, err := st.DB().ExecContext(ctx, "CREATE DATABASE bt_run_user_may_not"); err == nil {
		t.Error("the run user could create another database")
	}
}
