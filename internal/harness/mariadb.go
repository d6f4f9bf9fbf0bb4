package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MariaDB is a private mariadbd: its own data directory, port and socket, started
// and stopped by the harness and by nobody else. A chaos run restarts it without
// disturbing the tests that share the machine's own MariaDB.
//
// The root account logs in without a password over the socket (the socket lives in a
// directory only this user can reach); batcherd gets its own TCP account, User and
// Password, with every privilege, so Cluster can create its database as usual
// (Options.ServerDSN = ServerDSN()).
type MariaDB struct {
	Dir      string // removed by Close
	DataDir  string
	Socket   string
	Port     int
	User     string
	Password string
	LogPath  string // mariadbd's error log (also its stdout/stderr)

	bin  string // mariadbd
	osU  string // --user
	logf func(string, ...any)

	mu       sync.Mutex
	proc     *Process
	starts   int
	closed   bool
	stopping bool
}

// MariaDBOptions configure StartMariaDB. Zero values take the defaults noted.
type MariaDBOptions struct {
	// Parent is where the private directory is made (default os.TempDir()).
	Parent string
	// User and Password of the account made for batcherd (default batcherd/batcherd).
	User, Password string
	// ExtraArgs are appended to mariadbd's command line.
	ExtraArgs []string
	// ReadyTimeout bounds each wait for the server to accept connections (default 60s).
	ReadyTimeout time.Duration
	Logf         func(format string, args ...any)
}

// mariaDBDirPrefix starts the name of every private directory, so that
// CleanStaleMariaDBDirs finds what a killed run left behind.
const mariaDBDirPrefix = "batcherd-mariadb-"

// findProgram looks name up on PATH, then in the directories Debian installs
// MariaDB into (sbin is often not on a normal user's PATH).
func findProgram(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin", "/usr/local/mysql/bin"} {
			p := filepath.Join(dir, n)
			if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found (install mariadb-server: 'make db' does it on Debian)", strings.Join(names, " or "))
}

// StartMariaDB initialises a fresh data directory with mariadb-install-db, starts
// mariadbd on a free loopback port, and creates the batcherd account. On error
// everything is removed again. The caller must Close it.
func StartMariaDB(ctx context.Context, o MariaDBOptions) (m *MariaDB, err error) {
	if o.User == "" {
		o.User, o.Password = "batcherd", "batcherd"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 60 * time.Second
	}
	bin, err := findProgram("mariadbd", "mysqld")
	if err != nil {
		return nil, err
	}
	install, err := findProgram("mariadb-install-db", "mysql_install_db")
	if err != nil {
		return nil, err
	}
	// mariadbd refuses to run as root unless told to; as another user it cannot switch
	// users and runs as itself.
	osUser := "root"
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, err
		}
		osUser = u.Username
	}
	dir, err := os.MkdirTemp(o.Parent, mariaDBDirPrefix)
	if err != nil {
		return nil, err
	}
	m = &MariaDB{
		Dir: dir, DataDir: filepath.Join(dir, "data"), Socket: filepath.Join(dir, "mysqld.sock"),
		User: o.User, Password: o.Password, LogPath: filepath.Join(dir, "mariadbd.log"),
		bin: bin, osU: osUser, logf: o.Logf,
	}
	defer func() {
		if err != nil {
			m.Close()
			m = nil
		}
	}()
	// The owner's pid tells CleanStaleMariaDBDirs whether the directory is abandoned.
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return m, err
	}
	if len(m.Socket) > 100 {
		return m, fmt.Errorf("socket path %s is too long for a unix socket; use a shorter MariaDBOptions.Parent", m.Socket)
	}
	cmd := exec.CommandContext(ctx, install, "--no-defaults", "--datadir="+m.DataDir,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--user="+osUser)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return m, fmt.Errorf("%s: %w\n%s", install, err, out)
	}
	m.logfn("mariadb: data directory %s initialised", m.DataDir)

	if err := m.startOnFreePort(ctx, o.ReadyTimeout, o.ExtraArgs); err != nil {
		return m, err
	}
	if err := m.createAccount(ctx); err != nil {
		return m, err
	}
	return m, nil
}

// startOnFreePort starts mariadbd on a free loopback port, trying another port (up to
// five in all) when the one picked was taken meanwhile.
func (m *MariaDB) startOnFreePort(ctx context.Context, ready time.Duration, extra []string) error {
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		m.Port = port
		err = m.start(ctx, ready, extra)
		if err == nil {
			return nil
		}
		if attempt >= 4 || !strings.Contains(LogTail(m.LogPath, 30), "already in use") {
			return err
		}
	}
}

// createAccount creates batcherd's account (m.User, m.Password) over TCP and the socket.
func (m *MariaDB) createAccount(ctx context.Context) error {
	db, err := sql.Open("mysql", m.AdminDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	for _, host := range []string{"127.0.0.1", "localhost"} {
		for _, q := range []string{
			fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%s' IDENTIFIED BY '%s'", m.User, host, m.Password),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON *.* TO '%s'@'%s'", m.User, host),
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("private mariadb: %s: %w", q, err)
			}
		}
	}
	return nil
}

func (m *MariaDB) logfn(format string, args ...any) {
	if m.logf != nil {
		m.logf(format, args...)
	}
}

// args is mariadbd's command line: nothing from /etc/mysql (--no-defaults), loopback
// only, a small buffer pool (the machine runs other tests too).
func (m *MariaDB) args(extra []string) []string {
	a := []string{
		"--no-defaults",
		"--datadir=" + m.DataDir,
		"--port=" + strconv.Itoa(m.Port),
		"--socket=" + m.Socket,
		"--bind-address=127.0.0.1",
		"--user=" + m.osU,
		"--pid-file=" + filepath.Join(m.Dir, "mariadbd.pid"),
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=128M",
		"--max-connections=500",
		"--character-set-server=utf8mb4",
		"--collation-server=utf8mb4_general_ci",
	}
	return append(a, extra...)
}

func (m *MariaDB) start(ctx context.Context, timeout time.Duration, extra []string) error {
	p, err := startProcess("mariadbd", m.bin, m.args(extra), os.Environ(), m.LogPath)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
	db, err := sql.Open("mysql", m.AdminDSN())
	if err != nil {
		_ = p.Kill()
		return err
	}
	defer db.Close()
	if err := waitFor(ctx, p, timeout, func(ctx context.Context) error { return db.PingContext(ctx) }); err != nil {
		_ = p.Kill()
		return fmt.Errorf("private mariadbd on port %d did not come up: %w\n%s", m.Port, err, LogTail(m.LogPath, 20))
	}
	m.mu.Lock()
	m.starts++
	m.mu.Unlock()
	m.logfn("mariadb: mariadbd ready on 127.0.0.1:%d (pid %d)", m.Port, p.Pid())
	return nil
}

// ServerDSN is the batcherd account's DSN over TCP, without a database: what
// Options.ServerDSN takes.
func (m *MariaDB) ServerDSN() string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd = m.User, m.Password
	cfg.Net, cfg.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(m.Port)
	return cfg.FormatDSN()
}

// AdminDSN is root over the unix socket: for the harness's own connections, which
// a chaos run tells apart from batcherd's by the user name.
func (m *MariaDB) AdminDSN() string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net, cfg.Addr = "unix", m.Socket
	cfg.Timeout = 5 * time.Second
	return cfg.FormatDSN()
}

// Process is the current mariadbd process.
func (m *MariaDB) Process() *Process {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.proc
}

// Running reports whether mariadbd runs.
func (m *MariaDB) Running() bool {
	p := m.Process()
	return p != nil && !p.Exited()
}

// Starts counts the successful starts (1 + restarts).
func (m *MariaDB) Starts() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.starts
}

// Stop shuts mariadbd down with SIGTERM (a clean InnoDB shutdown) and waits up to
// grace, then kills it.
func (m *MariaDB) Stop(grace time.Duration) error {
	p := m.Process()
	if p == nil || p.Exited() {
		return nil
	}
	m.logfn("mariadb: SIGTERM (pid %d)", p.Pid())
	_, err := p.Stop(grace)
	return err
}

// Kill ends mariadbd with SIGKILL: a crash, recovered from the redo log at the next
// Start.
func (m *MariaDB) Kill() error {
	p := m.Process()
	if p == nil || p.Exited() {
		return nil
	}
	m.logfn("mariadb: kill -9 (pid %d)", p.Pid())
	return p.Kill()
}

// Start starts mariadbd again on the same data directory, port and socket, and waits
// until it accepts connections.
func (m *MariaDB) Start(ctx context.Context) error {
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return errors.New("private mariadb is closed")
	}
	if m.Running() {
		return errors.New("private mariadbd is already running")
	}
	return m.start(ctx, 60*time.Second, nil)
}

// Restart is Stop then Start: the server goes away for as long as a clean shutdown
// and a start take (a few seconds).
func (m *MariaDB) Restart(ctx context.Context) error {
	if err := m.Stop(60 * time.Second); err != nil {
		return err
	}
	return m.Start(ctx)
}

// Close stops mariadbd and removes its directory. Safe to call more than once.
func (m *MariaDB) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	err := m.Stop(30 * time.Second)
	if rerr := os.RemoveAll(m.Dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// CleanStaleMariaDBDirs removes private MariaDB directories under parent (default
// os.TempDir()) whose owner process is gone and that are older than olderThan: what a
// run killed with -9 left behind (its mariadbd died with it, PR_SET_PDEATHSIG). It
// returns the directories removed.
func CleanStaleMariaDBDirs(parent string, olderThan time.Duration) ([]string, error) {
	if parent == "" {
		parent = os.TempDir()
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), mariaDBDirPrefix) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < olderThan {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 && pidAlive(pid) {
				continue
			}
		}
		// The server of that run: a pid file left means it may still run (a run on a
		// system without PR_SET_PDEATHSIG). Leave it rather than pull its data away.
		if b, err := os.ReadFile(filepath.Join(dir, "mariadbd.pid")); err == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 && pidAlive(pid) {
				continue
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			return removed, err
		}
		removed = append(removed, dir)
	}
	return removed, nil
}

// pidAlive reports whether pid runs and is not a zombie.
func pidAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}
