package harness

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultServerDSN is the database server used when Options.ServerDSN and
// BATCHERD_TEST_DSN are empty (scripts/mariadb-bootstrap.sh creates the user).
const DefaultServerDSN = "batcherd:batcherd@tcp(127.0.0.1:3306)/"

// Tokens the harness configures on every replica. The API token applies (principal
// harness-requester) and the approver token approves (harness-approver): four eyes
// (BATCHERD_FOUR_EYES, on by default) refuses an approval by the requester.
const (
	APIToken      = "harness-api-token"
	ApproverToken = "harness-approver-token"
	AdminToken    = "harness-admin-token"
	SimToken      = "harness-sim-token"
)

// Principal names of the harness's tokens.
const (
	RequesterPrincipal = "harness-requester"
	ApproverPrincipal  = "harness-approver"
	AdminPrincipal     = "harness-admin"
)

// Options configure a Cluster. Zero values take the defaults noted.
type Options struct {
	// Replicas is how many `batcherd serve` processes to start (default 3; 0 is
	// allowed with NoReplicas for a cluster that starts them later).
	Replicas   int
	NoReplicas bool
	// Repos are the GitLab project paths (default platform/access-bindings). The
	// simulator creates them; every replica serves all of them.
	Repos []string

	// ServerDSN names the database server, without a database (default
	// BATCHERD_TEST_DSN, else DefaultServerDSN). A fresh database is created on it.
	ServerDSN string
	// DBPrefix starts the database's name (default "bt_harness"); a random suffix
	// follows.
	DBPrefix string
	// KeepDatabase leaves the database in place at Close (for inspection).
	KeepDatabase bool
	// ReplicaServerDSNs, when set, give replica n (1-based) the server of
	// ReplicaServerDSNs[(n-1) % len] instead of ServerDSN's (same database): a
	// multi-writer Galera run has each replica write through another node.
	ReplicaServerDSNs []string

	// Binaries to run; when nil, Start builds them into a temporary directory removed
	// at Close (Race builds them with the race detector).
	Binaries *Binaries
	Race     bool

	// LogDir receives one log file per process (default: a new temporary directory,
	// removed at Close unless KeepLogs).
	LogDir   string
	KeepLogs bool

	// Simulator settings: how long pipelines run (default 1s) and the probability
	// that one fails by itself.
	PipelineDuration time.Duration
	FailureRate      float64
	SimSeed          uint64

	// Replica settings (BATCHERD_*): defaults "@every 2s", 1s, false, "auto".
	ClaimSchedule     string
	ReconcileInterval time.Duration
	AutoApprove       bool
	MergeMode         string
	// Env adds or overrides BATCHERD_* variables of every replica, e.g.
	// {"BATCHERD_BATCH_TIMEOUT": "20s"}.
	Env map[string]string

	// ReadyTimeout bounds the wait for a replica's /readyz (default 30s).
	ReadyTimeout time.Duration
	// StopGrace is how long Close and Replica.Stop wait after SIGTERM before SIGKILL
	// (default 10s).
	StopGrace time.Duration

	// Logf receives one line per harness step (t.Logf, or a printer); nil is silent.
	Logf func(format string, args ...any)
}

// Cluster is a database, a simulator process and batcherd replica processes.
//
// Concurrency: Start and AddReplica change Replicas and must not run alongside other
// calls; everything else (clients, Kill/Stop/Restart/Signal of a replica, metrics,
// Audit, Verify, LogTail, Close) may be called from several goroutines, except that
// one replica should not be killed and restarted by two goroutines at once.
type Cluster struct {
	Opts     Options
	Bin      *Binaries
	DBName   string
	DSN      string // DSN of the cluster's database
	LogDir   string
	Sim      *SimClient
	Replicas []*Replica

	serverDSN string
	simProc   *Process
	clientsMu sync.Mutex
	clients   []*Client
	ownBin    string // temporary binary directory to remove
	ownLogs   bool
	closeOnce sync.Once
	closeErr  error
}

func (o *Options) defaults() {
	if o.Replicas == 0 && !o.NoReplicas {
		o.Replicas = 3
	}
	if len(o.Repos) == 0 {
		o.Repos = []string{"platform/access-bindings"}
	}
	if o.ServerDSN == "" {
		o.ServerDSN = os.Getenv("BATCHERD_TEST_DSN")
	}
	if o.ServerDSN == "" {
		o.ServerDSN = DefaultServerDSN
	}
	if o.DBPrefix == "" {
		o.DBPrefix = "bt_harness"
	}
	if o.PipelineDuration == 0 {
		o.PipelineDuration = time.Second
	}
	if o.SimSeed == 0 {
		o.SimSeed = 1
	}
	if o.ClaimSchedule == "" {
		o.ClaimSchedule = "@every 2s"
	}
	if o.ReconcileInterval == 0 {
		o.ReconcileInterval = time.Second
	}
	if o.MergeMode == "" {
		o.MergeMode = "auto"
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 30 * time.Second
	}
	if o.StopGrace == 0 {
		o.StopGrace = 10 * time.Second
	}
}

func (c *Cluster) logf(format string, args ...any) {
	if c.Opts.Logf != nil {
		c.Opts.Logf(format, args...)
	}
}

// Start builds (unless Options.Binaries), creates and migrates a fresh database,
// starts the simulator and the replicas, and waits until every replica is ready.
// On error everything already started is stopped again. The caller must Close the
// cluster (StartT does it for a test).
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	opts.defaults()
	c = &Cluster{Opts: opts}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()

	c.LogDir = opts.LogDir
	if c.LogDir == "" {
		if c.LogDir, err = os.MkdirTemp("", "batcherd-harness-logs-"); err != nil {
			return c, err
		}
		c.ownLogs = !opts.KeepLogs
	} else if err = os.MkdirAll(c.LogDir, 0o755); err != nil {
		return c, err
	}

	c.Bin = opts.Binaries
	if c.Bin == nil {
		if c.ownBin, err = os.MkdirTemp("", "batcherd-harness-bin-"); err != nil {
			return c, err
		}
		c.logf("building batcherd and gitlab-sim (race=%v)", opts.Race)
		if c.Bin, err = Build(ctx, c.ownBin, opts.Race); err != nil {
			return c, err
		}
	}

	for _, d := range opts.ReplicaServerDSNs {
		if _, err = mysql.ParseDSN(d); err != nil {
			return c, fmt.Errorf("replica server DSN: %w", err)
		}
	}
	if err = c.createDatabase(ctx); err != nil {
		return c, err
	}
	c.logf("database %s created", c.DBName)
	if out, code, err := c.RunBatcherd(ctx, "migrate"); err != nil || code != 0 {
		return c, fmt.Errorf("batcherd migrate (exit %d): %v\n%s", code, err, out)
	}

	if err = c.startSim(ctx); err != nil {
		return c, err
	}
	c.logf("gitlab-sim at %s (projects %s)", c.Sim.URL, strings.Join(opts.Repos, ","))

	for i := 1; i <= opts.Replicas; i++ {
		if _, err = c.AddReplica(ctx); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Close stops every replica and the simulator (SIGTERM, then SIGKILL after
// StopGrace), drops the database unless KeepDatabase, and removes temporary
// directories. It is safe to call more than once and on a half-started cluster.
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		var (
			errs []error
			mu   sync.Mutex
			wg   sync.WaitGroup
		)
		c.closeIdle()
		for _, r := range c.Replicas {
			wg.Go(func() {
				if _, err := r.Stop(c.Opts.StopGrace); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if c.simProc != nil {
			if _, err := c.simProc.Stop(c.Opts.StopGrace); err != nil {
				errs = append(errs, err)
			}
		}
		if c.DBName != "" && !c.Opts.KeepDatabase {
			if err := c.dropDatabase(); err != nil {
				errs = append(errs, err)
			}
		}
		if c.ownBin != "" {
			os.RemoveAll(c.ownBin)
		}
		if c.ownLogs {
			os.RemoveAll(c.LogDir)
		}
		c.closeErr = errors.Join(errs...)
	})
	return c.closeErr
}

func (c *Cluster) createDatabase(ctx context.Context) error {
	cfg, err := mysql.ParseDSN(c.Opts.ServerDSN)
	if err != nil {
		return fmt.Errorf("server DSN: %w", err)
	}
	cfg.DBName = ""
	c.serverDSN = cfg.FormatDSN()
	var b [5]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("%s_%s_%s", c.Opts.DBPrefix, time.Now().UTC().Format(dbTimeLayout), hex.EncodeToString(b[:]))
	if len(name) > 64 {
		name = name[len(name)-64:]
	}
	db, err := sql.Open("mysql", c.serverDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"` CHARACTER SET utf8mb4"); err != nil {
		return fmt.Errorf("create database %s (is MariaDB running? run 'make db'): %w", name, err)
	}
	c.DBName = name
	cfg.DBName = name
	c.DSN = cfg.FormatDSN()
	return nil
}

// dbTimeLayout is the UTC creation time in a database's name.
const dbTimeLayout = "20060102150405"

// DropStaleDatabases drops databases on the server of serverDSN named by the harness
// with prefix (prefix_<UTC time>_<random>) and created more than olderThan ago: what
// runs killed before their Close left behind. It returns the names dropped.
func DropStaleDatabases(ctx context.Context, serverDSN, prefix string, olderThan time.Duration) ([]string, error) {
	if serverDSN == "" {
		serverDSN = os.Getenv("BATCHERD_TEST_DSN")
	}
	if serverDSN == "" {
		serverDSN = DefaultServerDSN
	}
	cfg, err := mysql.ParseDSN(serverDSN)
	if err != nil {
		return nil, fmt.Errorf("server DSN: %w", err)
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE ?",
		strings.NewReplacer("_", `\_`, "%", `\%`).Replace(prefix)+`\_%`)
	if err != nil {
		return nil, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var dropped []string
	for _, n := range names {
		ts, _, ok := strings.Cut(strings.TrimPrefix(n, prefix+"_"), "_")
		created, err := time.Parse(dbTimeLayout, ts)
		if !ok || err != nil || time.Since(created) < olderThan {
			continue // not one of ours, or too young: maybe another run's
		}
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+n+"`"); err != nil {
			return dropped, fmt.Errorf("drop %s: %w", n, err)
		}
		dropped = append(dropped, n)
	}
	return dropped, nil
}

func (c *Cluster) dropDatabase() error {
	db, err := sql.Open("mysql", c.serverDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+c.DBName+"`"); err != nil {
		return fmt.Errorf("drop database %s: %w", c.DBName, err)
	}
	return nil
}

// DB opens a connection pool to the cluster's database (the caller closes it), for
// checks the API does not expose.
func (c *Cluster) DB() (*sql.DB, error) { return sql.Open("mysql", c.DSN) }

// baseEnv is the process environment without any BATCHERD_* variable, so settings of
// the shell running the harness never leak into the replicas.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BATCHERD_") && !strings.HasPrefix(kv, "GITLAB_SIM_") {
			env = append(env, kv)
		}
	}
	return env
}

// RunBatcherd runs a one-shot batcherd subcommand (migrate, check-schema, verify)
// against the cluster's database and returns its combined output and exit code.
func (c *Cluster) RunBatcherd(ctx context.Context, args ...string) (string, int, error) {
	cmd := exec.CommandContext(ctx, c.Bin.Batcherd, args...)
	cmd.Env = append(baseEnv(), "BATCHERD_MYSQL_DSN="+c.DSN, "BATCHERD_LOG_FORMAT=text", "BATCHERD_LOG_LEVEL=warn")
	cmd.SysProcAttr = sysProcAttr()
	out, err := cmd.CombinedOutput()
	code := -1
	if cmd.ProcessState != nil {
		code = cmd.ProcessState.ExitCode()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil // the exit code says it
	}
	return string(out), code, err
}

// Verify runs `batcherd verify` (the read-only invariant audit) and returns its report
// and exit code (0 clean, 1 violations, 3 schema drift).
func (c *Cluster) Verify(ctx context.Context) (string, int, error) {
	return c.RunBatcherd(ctx, "verify")
}

// freePort asks the kernel for a free loopback port. Another process can take it
// before the child binds it; starters retry with a new port when that happens.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startSim(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		args := []string{
			"-addr", addr,
			"-projects", strings.Join(c.Opts.Repos, ","),
			"-pipeline-duration", c.Opts.PipelineDuration.String(),
			"-failure-rate", strconv.FormatFloat(c.Opts.FailureRate, 'f', -1, 64),
			"-seed", strconv.FormatUint(c.Opts.SimSeed, 10),
		}
		env := append(baseEnv(), "GITLAB_SIM_TOKEN="+SimToken)
		p, err := startProcess("gitlab-sim", c.Bin.GitLabSim, args, env, filepath.Join(c.LogDir, "gitlab-sim.log"))
		if err != nil {
			return err
		}
		sim := NewSimClient("http://" + addr)
		if err := waitFor(ctx, p, 15*time.Second, func(ctx context.Context) error {
			_, err := sim.State(ctx)
			return err
		}); err != nil {
			_ = p.Kill()
			lastErr = fmt.Errorf("gitlab-sim did not come up on %s: %w\n%s", addr, err, LogTail(p.LogPath, 20))
			continue
		}
		c.simProc, c.Sim = p, sim
		return nil
	}
	return lastErr
}

// SimProcess is the simulator's process.
func (c *Cluster) SimProcess() *Process { return c.simProc }

// waitFor polls check every 100ms until it succeeds, the process exits, or timeout.
func waitFor(ctx context.Context, p *Process, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("process exited (%s)", p.State())
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// Client is an API client with the API token over every live replica.
func (c *Cluster) Client() *Client { return c.track(newClient(APIToken, c.liveURLs)) }

// AdminClient is an API client with the admin token over every live replica.
func (c *Cluster) AdminClient() *Client { return c.track(newClient(AdminToken, c.liveURLs)) }

// track remembers a client so that closeIdle can close its idle connections.
func (c *Cluster) track(cl *Client) *Client {
	c.clientsMu.Lock()
	defer c.clientsMu.Unlock()
	c.clients = append(c.clients, cl)
	return cl
}

// closeIdle closes the idle keep-alive connections of every client the cluster handed
// out, before a replica is asked to stop. A connection a client dialed but never used
// is "new" to the server, and http.Server.Shutdown waits up to 5s for such a
// connection: without this, a graceful stop would take BATCHERD_SHUTDOWN_TIMEOUT.
func (c *Cluster) closeIdle() {
	c.clientsMu.Lock()
	defer c.clientsMu.Unlock()
	for _, cl := range c.clients {
		cl.CloseIdle()
	}
	for _, r := range c.Replicas {
		r.http.CloseIdleConnections()
	}
}

func (c *Cluster) liveURLs() []string {
	var out []string
	for _, r := range c.Replicas {
		if r.Running() {
			out = append(out, r.URL())
		}
	}
	return out
}

// Live returns the replicas whose process runs.
func (c *Cluster) Live() []*Replica {
	var out []*Replica
	for _, r := range c.Replicas {
		if r.Running() {
			out = append(out, r)
		}
	}
	return out
}

// LogTail returns the last n lines of every process's log, for a failure message.
func (c *Cluster) LogTail(n int) string {
	var b strings.Builder
	if c.simProc != nil {
		fmt.Fprintf(&b, "--- gitlab-sim (%s)\n%s", c.simProc.State(), LogTail(c.simProc.LogPath, n))
	}
	for _, r := range c.Replicas {
		fmt.Fprintf(&b, "--- %s (%s)\n%s", r.ID, r.State(), LogTail(r.LogPath, n))
	}
	return b.String()
}

// LogTail returns the last n lines of a file.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error() + "\n"
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

// httpReady reports nil when GET url answers 200.
func httpReady(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}
