package harness

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP batcherd_scanner_loop_outcomes_total Normal outcomes.
# TYPE batcherd_scanner_loop_outcomes_total counter
batcherd_scanner_loop_outcomes_total{loop="claim",outcome="claimed",replica="replica-1"} 3
batcherd_scanner_loop_outcomes_total{loop="claim",outcome="nothing_to_claim",replica="replica-1"} 10
batcherd_scanner_loop_outcomes_total{loop="publish",outcome="published",replica="replica-1"} 2
batcherd_batch_settles_total{code="",outcome="succeeded",replica="replica-1"} 2
weird{a="x\"y\\z",b="line\nbreak"} 1.5e+00 1712345678
go_goroutines 42
`
	m, err := ParseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Sum("batcherd_scanner_loop_outcomes_total", "loop", "claim"); got != 13 {
		t.Errorf("claim outcomes = %v, want 13", got)
	}
	if got := m.Sum("batcherd_scanner_loop_outcomes_total", "loop", "claim", "outcome", "claimed"); got != 3 {
		t.Errorf("claimed = %v, want 3", got)
	}
	if got := m.Sum("go_goroutines"); got != 42 {
		t.Errorf("go_goroutines = %v", got)
	}
	w := m["weird"]
	if len(w) != 1 || w[0].Labels["a"] != `x"y\z` || w[0].Labels["b"] != "line\nbreak" || w[0].Value != 1.5 {
		t.Errorf("weird = %+v", w)
	}
	if _, err := ParseMetrics(`bad{a="x} 1`); err == nil {
		t.Error("unterminated label value parsed")
	}
}

func TestBindingPath(t *testing.T) {
	if got, want := BindingPath("team/alice", "db/orders prod"), "bindings/db%2Forders%20prod/team%2Falice.yaml"; got != want {
		t.Errorf("BindingPath = %q, want %q", got, want)
	}
}

// A killed process takes its whole process group with it: nothing it started
// survives.
func TestProcessGroupKill(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	p, err := startProcess("sh", "/bin/sh", []string{"-c", "sleep 300 & echo $! > " + pidFile + "; wait"}, os.Environ(), filepath.Join(dir, "sh.log"))
	if err != nil {
		t.Fatal(err)
	}
	var child int
	for i := 0; i < 100 && child == 0; i++ {
		b, _ := os.ReadFile(pidFile)
		child, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		time.Sleep(20 * time.Millisecond)
	}
	if child == 0 {
		t.Fatal("child never started")
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if p.State() != "signal: killed" {
		t.Errorf("state = %q", p.State())
	}
	// The orphaned sleep is reparented and reaped by init; wait until it is gone.
	deadline := time.Now().Add(5 * time.Second)
	for alive(child) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("child %d of the killed process group survived", child)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(LogTail(p.LogPath, 5), "exited: signal: killed") {
		t.Errorf("log does not record the exit:\n%s", LogTail(p.LogPath, 5))
	}
}

func TestStopGracefulThenKill(t *testing.T) {
	dir := t.TempDir()
	// Exits 0 on SIGTERM.
	p, err := startProcess("trap", "/bin/sh", []string{"-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"}, os.Environ(), filepath.Join(dir, "a.log"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if code, err := p.Stop(5 * time.Second); err != nil || code != 0 {
		t.Errorf("graceful stop: code %d, err %v", code, err)
	}
	// Ignores SIGTERM: killed after the grace period.
	q, err := startProcess("stubborn", "/bin/sh", []string{"-c", "trap '' TERM; while :; do sleep 0.05; done"}, os.Environ(), filepath.Join(dir, "b.log"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if code, err := q.Stop(300 * time.Millisecond); err == nil || code != -1 {
		t.Errorf("stubborn stop: code %d, err %v; want -1 and an error", code, err)
	}
	if !q.Exited() {
		t.Error("stubborn process still runs")
	}
}

func TestDropStaleDatabases(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the database server")
	}
	ctx := t.Context()
	dsn := os.Getenv("BATCHERD_TEST_DSN")
	if dsn == "" {
		dsn = DefaultServerDSN
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the cleanups below have dropped the databases (cleanups run last
	// registered first; a deferred Close ran before them, so every drop failed unseen).
	t.Cleanup(func() { db.Close() })
	// A prefix unique to this run: concurrent test runs on one server must not see
	// each other's databases.
	prefix := fmt.Sprintf("bt_stale%d", time.Now().UnixNano()%1e9)
	old := prefix + "_20000101000000_aa"
	young := prefix + "_" + time.Now().UTC().Format(dbTimeLayout) + "_bb"
	other := prefix + "x_20000101000000_cc" // another prefix: untouched
	for _, n := range []string{old, young, other} {
		if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+n+"`"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := db.Exec("DROP DATABASE IF EXISTS `" + n + "`"); err != nil {
				t.Errorf("drop %s: %v", n, err)
			}
		})
	}
	dropped, err := DropStaleDatabases(ctx, dsn, prefix, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if len(dropped) != 1 || dropped[0] != old {
		t.Errorf("dropped %v, want [%s]", dropped, old)
	}
}

// alive reports whether pid runs (a zombie waiting for a reaper does not count).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no procfs: trust kill(0)
	}
	// pid (comm) S ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}
