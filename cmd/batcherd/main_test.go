package main

import (
	"bytes"
	"database/sql"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	_ "github.com/go-sql-driver/mysql"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/store/storetest"
	batchsql "github.com/batcherd/batcherd/sql"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpListsEverySubcommandAndVariable(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}} {
		code, out, _ := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d", args, code)
		}
		for _, c := range commands {
			if !strings.Contains(out, c.name) {
				t.Errorf("help misses subcommand %s", c.name)
			}
		}
		for _, v := range config.Vars() {
			if !strings.Contains(out, v.Name) {
				t.Errorf("help misses %s", v.Name)
			}
		}
	}
	code, out, _ := runCLI(t, "serve", "-h")
	if code != 0 || !strings.Contains(out, "BATCHERD_MERGE_MODE") || !strings.Contains(out, "@every 30s") {
		t.Fatalf("serve -h: exit %d\n%s", code, out)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	if code, _, errs := runCLI(t); code != 2 || !strings.Contains(errs, "Usage") {
		t.Fatalf("no args: exit %d, %q", code, errs)
	}
	if code, _, errs := runCLI(t, "frobnicate"); code != 2 || !strings.Contains(errs, "unknown subcommand") {
		t.Fatalf("unknown: exit %d, %q", code, errs)
	}
	if code, _, _ := runCLI(t, "migrate", "extra"); code != 2 {
		t.Fatalf("extra args: exit %d", code)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "batcherd ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

func TestInvalidConfigNamesVariableAndExits2(t *testing.T) {
	t.Setenv("BATCHERD_MYSQL_DSN", "")
	t.Setenv("BATCHERD_MERGE_MODE", "sometimes")
	code, _, errs := runCLI(t, "serve")
	if code != 2 || !strings.Contains(errs, "BATCHERD_MYSQL_DSN") || !strings.Contains(errs, "BATCHERD_MERGE_MODE") {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
}

func TestMigrateCheckSchemaVerify(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	t.Setenv("BATCHERD_MYSQL_DSN", dsn)
	t.Setenv("BATCHERD_LOG_FORMAT", "json")
	if code, out, errs := runCLI(t, "check-schema"); code != 3 {
		t.Fatalf("check-schema on an empty database: exit %d (want 3)\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "migrate"); code != 0 {
		t.Fatalf("second migrate must be a no-op: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "check-schema"); code != 0 {
		t.Fatalf("check-schema: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "verify"); code != 0 || !strings.Contains(out, "no violations") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errs)
	}
	if strings.Contains(dsn, ":batcherd@") {
		// The DSN password must never reach the output.
		_, out, errs := runCLI(t, "check-schema")
		if strings.Contains(out+errs, "batcherd@tcp") {
			t.Fatalf("DSN leaked into output:\n%s%s", out, errs)
		}
	}
}

// A configuration error exits 2 and names its variable, for every subcommand that reads
// the configuration: a value that does not parse, and a DSN batcherd cannot use (one
// without a database name used to reach the schema check and report drift in database
// "", exit 3; a malformed one failed at connect time with exit 1).
func TestConfigErrorsExit2NamingTheVariable(t *testing.T) {
	t.Setenv("BATCHERD_MYSQL_DSN", "batcherd:batcherd@tcp(127.0.0.1:3306)/batcherd")
	t.Setenv("BATCHERD_MAX_BATCH_SIZE", "many")
	code, _, errs := runCLI(t, "migrate")
	if code != 2 || !strings.Contains(errs, "BATCHERD_MAX_BATCH_SIZE") || strings.Contains(errs, "MaxBatchSize") {
		t.Errorf("unparsable BATCHERD_MAX_BATCH_SIZE: exit %d, stderr:\n%s", code, errs)
	}
	t.Setenv("BATCHERD_MAX_BATCH_SIZE", "")

	for _, c := range []struct{ dsn, says string }{
		{"batcherd:batcherd@tcp(127.0.0.1:3306)/", "names no database"},
		{"batcherd:batcherd@tcp(127.0.0.1:3306)", "no '/' before the database name"},
		{"batcherd:batcherd@127.0.0.1:3306/batcherd", "tcp(host:port)"},
	} {
		t.Setenv("BATCHERD_MYSQL_DSN", c.dsn)
		for _, sub := range []string{"migrate", "check-schema", "verify"} {
			code, out, errs := runCLI(t, sub)
			if code != 2 || !strings.Contains(errs, "BATCHERD_MYSQL_DSN") || !strings.Contains(errs, c.says) ||
				strings.Contains(out+errs, "drift") {
				t.Errorf("%s with DSN %q: exit %d (want 2), stdout %q, stderr:\n%s", sub, c.dsn, code, out, errs)
			}
		}
	}
}

// The DSN's password never reaches the output, however malformed the DSN: each shape
// below used to be quoted, in part or whole, by go-sql-driver's parse error (a '/' in
// the password makes its first half the "network", its second the database name).
func TestMalformedDSNNeverShowsThePassword(t *testing.T) {
	const pw = "Zq9xW7vK"
	t.Setenv("BATCHERD_GITLAB_URL", "http://127.0.0.1:1")
	t.Setenv("BATCHERD_GITLAB_TOKEN", "tok")
	t.Setenv("BATCHERD_REPOS", "a/b")
	t.Setenv("BATCHERD_API_TOKENS", "api")
	for _, dsn := range malformedDSNs(pw) {
		t.Setenv("BATCHERD_MYSQL_DSN", dsn)
		for _, sub := range []string{"serve", "migrate", "check-schema", "verify"} {
			code, out, errs := runCLI(t, sub)
			if code != 2 || !strings.Contains(errs, "BATCHERD_MYSQL_DSN") {
				t.Errorf("%s with DSN %q: exit %d (want 2), stderr:\n%s", sub, dsn, code, errs)
			}
			if frag := passwordFragment(out+errs, pw); frag != "" {
				t.Errorf("%s with DSN %q: output shows %q of the password:\n%s%s", sub, dsn, frag, out, errs)
			}
		}
	}
}

// malformedDSNs are DSNs of many wrong shapes, each holding the password pw.
func malformedDSNs(pw string) []string {
	half := len(pw) / 2
	split := pw[:half] + "/" + pw[half:] // a '/' inside the password
	return []string{
		"u:" + pw + "@tcp(db:3306)",                           // no database part
		"u:" + pw + "@tcp(db:3306)/",                          // empty database name
		"u:" + split,                                          // no '@', '/' in the password
		"u:" + split + "@tcp(db:3306)",                        // '/' in the password, no database
		"u:" + split + "@tcp(db:3306)/",                       // the same with an empty database
		"u:" + pw + "@db:3306/batcherd",                       // address without tcp()
		"mysql://u:" + pw + "@db:3306/batcherd",               // a URL
		"u:" + pw + "@tcp(db:3306/batcherd",                   // unterminated address
		"u:" + pw[:half] + ")" + pw[half:] + "@tcp(db:3306/b", // a ')' in the password
		"u:" + pw + "@tcp(db:3306)/b?parseTime=maybe",         // bad parameter
		"u:" + split + "?loc=" + pw + "@tcp(db)",              // the password in a parameter
		"u:" + pw + "@tcp(db:3306)/b%zz",                      // bad escape in the database name
		"u:" + split + "%zz@tcp(db:3306)",                     // bad escape after a '/' in the password
		pw,                                                    // only the password
	}
}

// passwordFragment returns a piece of pw (3 characters or more) that s contains, or "".
func passwordFragment(s, pw string) string {
	for n := len(pw); n >= 3; n-- {
		for i := 0; i+n <= len(pw); i++ {
			if strings.Contains(s, pw[i:i+n]) {
				return pw[i : i+n]
			}
		}
	}
	return ""
}

// An unmigrated database is answered alike by serve, check-schema and verify: exit 3,
// the fix (batcherd migrate) first, then one short line per migration not applied (it
// was one log record of 1,900 characters listing every index the migrations create,
// with the hint at its end). A migrated database that drifted lists its problems the
// same way, one per line, the fix first.
func TestUnmigratedDatabaseSaysMigrateFirst(t *testing.T) {
	migrations, err := fs.Glob(batchsql.Migrations, "migrations/*.sql")
	if err != nil || len(migrations) == 0 {
		t.Fatalf("embedded migrations: %v %v", migrations, err)
	}
	dsn := storetest.NewDatabase(t)
	t.Setenv("BATCHERD_MYSQL_DSN", dsn)
	t.Setenv("BATCHERD_LOG_FORMAT", "json")
	t.Setenv("BATCHERD_GITLAB_URL", "http://127.0.0.1:1")
	t.Setenv("BATCHERD_GITLAB_TOKEN", "tok")
	t.Setenv("BATCHERD_REPOS", "a/b")
	t.Setenv("BATCHERD_API_TOKENS", "api")
	t.Setenv("BATCHERD_HTTP_ADDR", "127.0.0.1:0")
	for _, sub := range []string{"serve", "check-schema", "verify"} {
		code, _, errs := runCLI(t, sub)
		lines := schemaLines(t, sub, errs)
		if code != 3 || len(lines) < len(migrations)+1 || !strings.HasPrefix(lines[0], "batcherd "+sub+": run 'batcherd migrate'") {
			t.Errorf("%s: exit %d (want 3), stderr:\n%s", sub, code, errs)
			continue
		}
		for i, m := range migrations {
			if want := "  migration " + path.Base(m) + " is not applied"; lines[1+i] != want {
				t.Errorf("%s: line %d is %q, want %q", sub, 2+i, lines[1+i], want)
			}
		}
	}

	if code, out, errs := runCLI(t, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errs)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec("ALTER TABLE binding DROP INDEX uk_subject_target"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("ALTER TABLE merge_batch_request DROP INDEX uk_operation_id, ADD INDEX uk_operation_id (operation_id)"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"serve", "check-schema"} {
		code, _, errs := runCLI(t, sub)
		lines := schemaLines(t, sub, errs)
		if code != 3 || len(lines) != 3 || !strings.HasPrefix(lines[0], "batcherd "+sub+": run 'batcherd migrate'") ||
			!strings.Contains(lines[1]+lines[2], "uk_subject_target") || !strings.Contains(lines[1]+lines[2], "uk_operation_id") {
			t.Errorf("%s on drift: exit %d (want 3), want the fix and one line per problem; stderr:\n%s", sub, code, errs)
		}
	}
}

// schemaLines returns stderr's lines that are not JSON log records, each checked to be
// short enough to read on a terminal.
func schemaLines(t *testing.T, sub, stderr string) []string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(stderr, "\n"), "\n") {
		if strings.HasPrefix(l, "{") {
			continue
		}
		if len(l) > 200 {
			t.Errorf("%s: a line of %d characters: %s", sub, len(l), l)
		}
		lines = append(lines, l)
	}
	return lines
}

// readBuildVersion reads the version and the VCS stamp the go command writes into a
// binary; -ldflags -X main.version wins over the module version.
func TestReadBuildVersion(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.0.0-20261201120000-abcdef012345+dirty"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abcdef0123456789"}, {Key: "vcs.time", Value: "2026-12-01T12:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	b := readBuildVersion(info, "")
	if got, want := b.String(), "batcherd v0.0.0-20261201120000-abcdef012345+dirty (revision abcdef0123456789 with uncommitted changes, committed 2026-12-01T12:00:00Z; go1.26.0)"; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if b := readBuildVersion(info, "v1.2.3"); b.Version != "v1.2.3" || b.Revision != "abcdef0123456789" {
		t.Errorf("stamped: %+v", b)
	}
	if b := readBuildVersion(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, ""); b.Version != "devel" || !strings.Contains(b.String(), "revision unknown") {
		t.Errorf("no VCS: %s", b)
	}
}

// The real binary, built from this checkout, prints the commit it was built from.
func TestVersionPrintsTheVCSRevision(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// The go command stamps a build only where .git is a directory (not in a git
	// worktree, whose .git is a file) and git answers.
	if st, err := os.Stat(filepath.Join(root, ".git")); err != nil || !st.IsDir() {
		t.Skip("not a git checkout the go command stamps (.git is not a directory)")
	}
	head, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("git rev-parse HEAD: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "batcherd")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/batcherd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("batcherd version: %v", err)
	}
	if want := "revision " + strings.TrimSpace(string(head)); !strings.HasPrefix(string(out), "batcherd ") || !strings.Contains(string(out), want) {
		t.Fatalf("batcherd version printed %q, want it to name %q", out, want)
	}
}

// The same token as an API and an admin token (or a bad principal name) ends serve with
// exit 2, naming the variables and entries, never the token.
func TestDuplicateTokenExits2WithoutShowingIt(t *testing.T) {
	const secret = "s3cr3t-shared-token"
	t.Setenv("BATCHERD_MYSQL_DSN", "batcherd:batcherd@tcp(127.0.0.1:1)/batcherd")
	t.Setenv("BATCHERD_GITLAB_URL", "http://127.0.0.1:1")
	t.Setenv("BATCHERD_GITLAB_TOKEN", "tok")
	t.Setenv("BATCHERD_REPOS", "a/b")
	for _, c := range []struct{ api, admin, says string }{
		{"requests=" + secret, "oncall=" + secret, `BATCHERD_ADMIN_TOKENS entry 1 (principal "oncall") has the same token as BATCHERD_API_TOKENS entry 1`},
		{secret + "," + secret, "oncall=x", "BATCHERD_API_TOKENS entry 2"},
		{"bad name=" + secret, "oncall=x", "BATCHERD_API_TOKENS entry 1"},
	} {
		t.Setenv("BATCHERD_API_TOKENS", c.api)
		t.Setenv("BATCHERD_ADMIN_TOKENS", c.admin)
		code, out, errs := runCLI(t, "serve")
		if code != 2 || !strings.Contains(errs, c.says) {
			t.Errorf("API %q admin %q: exit %d (want 2), stderr:\n%s", c.api, c.admin, code, errs)
		}
		if strings.Contains(out+errs, secret) {
			t.Errorf("the output shows the token:\n%s%s", out, errs)
		}
	}
}
