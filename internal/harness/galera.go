package harness

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
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

// Galera is a MariaDB Galera cluster on this machine (default three nodes, each a
// private mariadbd with its own data directory, ports and socket under one temporary
// directory; the server on 3306 is never touched) behind HAProxy in the usual
// single-writer setup: the first node takes every connection, the others are backups,
// and a stick table keeps the writer where it is when a failed node comes back (no
// failback, so two nodes never take writes at once).
//
// HAProxy's own mysql-check keeps a node UP that lost the primary component (it still
// completes a handshake and answers SELECT 1, but 1047 to every table): the health
// check here is primary-aware instead, a clustercheck-style HTTP responder per node
// (200 only when wsrep_cluster_status = Primary, wsrep_local_state = 4 (Synced) and
// wsrep_ready = ON) that HAProxy asks with `option httpchk` on the check port.
type Galera struct {
	Dir       string // removed by Close
	Nodes     []*GaleraNode
	ProxyPort int
	// User and Password: batcherd's account (TCP, every node, every privilege).
	User, Password string

	keep       bool
	haproxyBin string
	haproxyCfg string // path
	haproxyLog string
	logf       func(string, ...any)
	osU        string
	bin        string
	checkSrv   []*http.Server

	mu      sync.Mutex
	haproxy *Process
	closed  bool
}

// GaleraNode is one mariadbd of the cluster.
type GaleraNode struct {
	Name                               string // n1, n2, ...
	Dir, DataDir, Socket, LogPath, Cnf string
	Port, GcommPort, ISTPort, SSTPort  int
	CheckPort                          int // the primary-aware health check (HTTP)

	g      *Galera
	admin  *sql.DB // root over the socket
	mu     sync.Mutex
	proc   *Process
	starts int
}

// GaleraOptions configure StartGalera.
type GaleraOptions struct {
	Nodes  int    // default 3
	Parent string // default os.TempDir()
	// User and Password of batcherd's account (default batcherd/batcherd).
	User, Password string
	// Keep leaves the directory (data, logs, configuration) at Close.
	Keep bool
	Logf func(format string, args ...any)
}

// GaleraStatus is what a node says about itself.
type GaleraStatus struct {
	ClusterStatus string // Primary, non-Primary, Disconnected
	LocalState    int    // 4 = Synced
	Ready         bool   // wsrep_ready
	ClusterSize   int
}

// Healthy is the health check's rule: a node takes traffic only when it is in the
// primary component, synced and ready.
func (s GaleraStatus) Healthy() bool {
	return s.ClusterStatus == "Primary" && s.LocalState == 4 && s.Ready
}

func (s GaleraStatus) String() string {
	return fmt.Sprintf("cluster_status=%s local_state=%d ready=%v size=%d", s.ClusterStatus, s.LocalState, s.Ready, s.ClusterSize)
}

// galeraProvider is where Debian's galera-4 installs the provider library.
var galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// StartGalera starts HAProxy's health checks, bootstraps the first node
// (--wsrep-new-cluster), creates batcherd's account and the harness's own (harness /
// harness over TCP), starts the other nodes on empty data directories (they join by
// SST), and starts HAProxy. The caller must Close it. On error everything is stopped
// and removed again.
func StartGalera(ctx context.Context, o GaleraOptions) (g *Galera, err error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	if o.User == "" {
		o.User, o.Password = "batcherd", "batcherd"
	}
	progs, err := findGaleraPrograms()
	if err != nil {
		return nil, err
	}
	osUser, uid, gid, err := galeraOSUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(o.Parent, mariaDBDirPrefix+"galera-")
	if err != nil {
		return nil, err
	}
	g = &Galera{Dir: dir, User: o.User, Password: o.Password, keep: o.Keep, haproxyBin: progs.haproxy, logf: o.Logf, osU: osUser, bin: progs.mariadbd,
		haproxyCfg: filepath.Join(dir, "haproxy.cfg"), haproxyLog: filepath.Join(dir, "haproxy.log")}
	defer func() {
		if err != nil {
			g.Close()
			g = nil
		}
	}()
	if err := os.Chmod(dir, 0o711); err != nil { // the nodes' user reaches its own folder
		return g, err
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return g, err
	}
	if err := g.layOutNodes(o.Nodes, uid, gid); err != nil {
		return g, err
	}
	for _, n := range g.Nodes {
		if err := g.startCheck(n); err != nil {
			return g, err
		}
	}
	if err := g.bootstrap(ctx, progs.installDB, osUser); err != nil {
		return g, err
	}
	for _, n := range g.Nodes[1:] {
		if err := n.start(ctx, false); err != nil {
			return g, err
		}
	}
	if err := g.startHAProxy(ctx); err != nil {
		return g, err
	}
	return g, nil
}

// galeraPrograms are the programs StartGalera runs.
type galeraPrograms struct {
	mariadbd, installDB, haproxy string
}

// findGaleraPrograms checks that the provider, the server, its install tool, HAProxy
// and rsync (for SST) are installed, saying how to get what is missing.
func findGaleraPrograms() (p galeraPrograms, err error) {
	if _, err := os.Stat(galeraProvider); err != nil {
		return p, fmt.Errorf("%s missing: install galera-4 ('make ha' does it)", galeraProvider)
	}
	if p.mariadbd, err = findProgram("mariadbd", "mysqld"); err != nil {
		return p, err
	}
	if p.installDB, err = findProgram("mariadb-install-db", "mysql_install_db"); err != nil {
		return p, err
	}
	if p.haproxy, err = findProgram("haproxy"); err != nil {
		return p, fmt.Errorf("haproxy: %w ('make ha' installs it)", err)
	}
	if _, err := exec.LookPath("rsync"); err != nil {
		return p, errors.New("rsync missing (the nodes join by rsync SST; 'make ha' installs it)")
	}
	return p, nil
}

// galeraOSUser is the OS user the nodes run as, with its uid and gid when the data
// directories must be chowned to it (-1 otherwise). As root the nodes run as mysql:
// the joiner's rsync daemon, started by root, would drop to nobody and could not
// write the data directory.
func galeraOSUser() (name string, uid, gid int, err error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return "", -1, -1, err
		}
		return u.Username, -1, -1, nil
	}
	u, err := user.Lookup("mysql")
	if err != nil {
		return "", -1, -1, fmt.Errorf("user mysql (made by the mariadb-server package): %w", err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return "mysql", uid, gid, nil
}

// layOutNodes reserves the ports, makes the nodes' directories (owned by uid/gid when
// uid >= 0), writes their configuration and opens their admin connections.
func (g *Galera) layOutNodes(nodes, uid, gid int) error {
	// Every port is asked of the kernel up front; a clash with another process (rare)
	// fails the start, and the caller may try again.
	ports := make([]int, 0, 5*nodes+1)
	var lns []net.Listener
	for range 5*nodes + 1 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	g.ProxyPort = ports[0]
	var gcomm []string
	for i := range nodes {
		n := &GaleraNode{Name: fmt.Sprintf("n%d", i+1), g: g,
			Port: ports[1+5*i], GcommPort: ports[2+5*i], ISTPort: ports[3+5*i], SSTPort: ports[4+5*i], CheckPort: ports[5+5*i]}
		n.Dir = filepath.Join(g.Dir, n.Name)
		n.DataDir = filepath.Join(n.Dir, "data")
		n.Socket = filepath.Join(n.Dir, "mysqld.sock")
		n.LogPath = filepath.Join(n.Dir, "error.log")
		n.Cnf = filepath.Join(n.Dir, "my.cnf")
		if len(n.Socket) > 100 {
			return fmt.Errorf("socket path %s is too long for a unix socket", n.Socket)
		}
		if err := os.MkdirAll(n.DataDir, 0o750); err != nil {
			return err
		}
		if uid >= 0 {
			for _, d := range []string{n.Dir, n.DataDir} {
				if err := os.Chown(d, uid, gid); err != nil {
					return err
				}
			}
		}
		gcomm = append(gcomm, fmt.Sprintf("127.0.0.1:%d", n.GcommPort))
		g.Nodes = append(g.Nodes, n)
	}
	for _, n := range g.Nodes {
		// A defaults file of its own, not --no-defaults: the SST scripts read the server's
		// settings from the file the server was started with, and without one they would
		// read /etc/mysql (the machine's own server's data directory).
		if err := os.WriteFile(n.Cnf, []byte(n.config(strings.Join(gcomm, ","))), 0o644); err != nil {
			return err
		}
		var err error
		if n.admin, err = n.OpenAdmin(); err != nil {
			return err
		}
		n.admin.SetMaxOpenConns(2)
		n.admin.SetConnMaxLifetime(30 * time.Second)
	}
	return nil
}

// bootstrap initialises the first node's data directory, starts it as a new cluster
// and creates batcherd's account and the harness's own (harness/harness over TCP).
func (g *Galera) bootstrap(ctx context.Context, install, osUser string) error {
	n1 := g.Nodes[0]
	cmd := exec.CommandContext(ctx, install, "--defaults-file="+n1.Cnf, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--user="+osUser)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", install, err, out)
	}
	g.logfn("galera: %s data directory initialised", n1.Name)
	if err := n1.start(ctx, true); err != nil {
		return err
	}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		for _, q := range []string{
			fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'%s' IDENTIFIED BY '%s'", g.User, host, g.Password),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON *.* TO '%s'@'%s'", g.User, host),
			fmt.Sprintf("CREATE USER IF NOT EXISTS 'harness'@'%s' IDENTIFIED BY 'harness'", host),
			fmt.Sprintf("GRANT ALL PRIVILEGES ON *.* TO 'harness'@'%s' WITH GRANT OPTION", host),
		} {
			if _, err := n1.admin.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("galera %s: %s: %w", n1.Name, strings.SplitN(q, " IDENTIFIED", 2)[0], err)
			}
		}
	}
	return nil
}

func (g *Galera) logfn(format string, args ...any) {
	if g.logf != nil {
		g.logf(format, args...)
	}
}

// config is the node's defaults file: the settings batcherd needs on Galera
// (binlog_format=ROW, innodb_autoinc_lock_mode=2) and small buffers for a shared
// machine.
func (n *GaleraNode) config(cluster string) string {
	return fmt.Sprintf(`[mariadbd]
user=%s
datadir=%s
socket=%s
pid-file=%s
log-error=%s
port=%d
bind-address=127.0.0.1
skip-name-resolve
max-connections=400
character-set-server=utf8mb4
collation-server=utf8mb4_general_ci
innodb_buffer_pool_size=64M
innodb_log_file_size=48M
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=%s
wsrep_cluster_name=batcherd-ha
wsrep_cluster_address=gcomm://%s
wsrep_node_name=%s
wsrep_node_address=127.0.0.1:%d
wsrep_node_incoming_address=127.0.0.1:%d
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:%d;ist.recv_addr=127.0.0.1:%d;gcache.size=64M"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:%d
`, n.g.osU, n.DataDir, n.Socket, filepath.Join(n.Dir, "mysqld.pid"), n.LogPath, n.Port,
		galeraProvider, cluster, n.Name, n.GcommPort, n.Port, n.GcommPort, n.ISTPort, n.SSTPort)
}

func (n *GaleraNode) adminConfig() *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net, cfg.Addr = "unix", n.Socket
	cfg.Timeout = 2 * time.Second
	cfg.ReadTimeout = 5 * time.Second
	cfg.WriteTimeout = 5 * time.Second
	// Connections to a node that was killed fail on purpose; the driver's log lines
	// about them are noise.
	cfg.Logger = &mysql.NopLogger{}
	return cfg
}

// OpenAdmin opens a pool as root over the node's socket (never through HAProxy).
func (n *GaleraNode) OpenAdmin() (*sql.DB, error) {
	conn, err := mysql.NewConnector(n.adminConfig())
	if err != nil {
		return nil, err
	}
	return sql.OpenDB(conn), nil
}

// start starts mariadbd (bootstrap: a new cluster) and waits until the node is synced
// in the primary component: a joiner first receives the state by IST or SST.
func (n *GaleraNode) start(ctx context.Context, bootstrap bool) error {
	args := []string{"--defaults-file=" + n.Cnf}
	if bootstrap {
		args = append(args, "--wsrep-new-cluster")
	} else if _, err := os.Stat(filepath.Join(n.DataDir, "grastate.dat")); err == nil {
		pos, err := n.recoverPosition(ctx)
		if err != nil {
			return err
		}
		if pos != "" {
			args = append(args, "--wsrep-start-position="+pos)
		}
	}
	p, err := startProcess("mariadbd-"+n.Name, n.g.bin, args, os.Environ(), filepath.Join(n.Dir, "stdout.log"))
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	start := time.Now()
	err = waitFor(ctx, p, 180*time.Second, func(ctx context.Context) error {
		st, err := n.Status(ctx)
		if err != nil {
			return err
		}
		if !st.Healthy() {
			return errors.New(st.String())
		}
		return nil
	})
	if err != nil {
		_ = p.Kill()
		return fmt.Errorf("galera node %s did not become synced: %w\n%s", n.Name, err, LogTail(n.LogPath, 25))
	}
	n.mu.Lock()
	n.starts++
	n.mu.Unlock()
	n.g.logfn("galera: %s synced on 127.0.0.1:%d after %s (pid %d, %s)", n.Name, n.Port,
		time.Since(start).Round(100*time.Millisecond), p.Pid(), n.JoinedBy())
	return nil
}

// JoinedBy reads the node's error log for how it got its state the last time it
// started: "SST" (a full copy), "IST" (the missed write sets only), or "bootstrap".
func (n *GaleraNode) JoinedBy() string {
	data, err := os.ReadFile(n.LogPath)
	if err != nil {
		return "unknown"
	}
	s := string(data)
	if i := strings.LastIndex(s, "Found saved state"); i >= 0 {
		s = s[i:] // the last start
	}
	switch {
	case strings.Contains(s, "Connecting with bootstrap option: 1"):
		return "bootstrap"
	case strings.Contains(s, "IST completed on joiner") || strings.Contains(s, "writesets, seqnos"):
		return "IST"
	case strings.Contains(s, "SST received"):
		return "SST"
	}
	return "unknown"
}

// recoverPosition is what mysqld_safe does before starting a node that crashed: a
// crashed node's grastate.dat says seqno -1, and without the position InnoDB recovered
// (mariadbd --wsrep-recover) the node would ask for a full SST instead of an IST.
func (n *GaleraNode) recoverPosition(ctx context.Context) (string, error) {
	logPath := filepath.Join(n.Dir, "recover.log")
	_ = os.Remove(logPath)
	cmd := exec.CommandContext(ctx, n.g.bin, "--defaults-file="+n.Cnf, "--wsrep-recover", "--log-error="+logPath)
	cmd.SysProcAttr = sysProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s --wsrep-recover: %w\n%s%s", n.Name, err, out, LogTail(logPath, 10))
	}
	data, _ := os.ReadFile(logPath)
	const marker = "WSREP: Recovered position: "
	i := strings.LastIndex(string(data), marker)
	if i < 0 {
		return "", nil
	}
	pos, _, _ := strings.Cut(string(data)[i+len(marker):], "\n")
	return strings.TrimSpace(pos), nil
}

// Status asks the node over its socket.
func (n *GaleraNode) Status(ctx context.Context) (GaleraStatus, error) {
	var st GaleraStatus
	rows, err := n.admin.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_cluster_status','wsrep_local_state','wsrep_ready','wsrep_cluster_size')")
	if err != nil {
		return st, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return st, err
		}
		switch strings.ToLower(k) {
		case "wsrep_cluster_status":
			st.ClusterStatus = v
		case "wsrep_local_state":
			st.LocalState, _ = strconv.Atoi(v)
		case "wsrep_ready":
			st.Ready = v == "ON"
		case "wsrep_cluster_size":
			st.ClusterSize, _ = strconv.Atoi(v)
		}
	}
	return st, rows.Err()
}

// Running reports whether the node's mariadbd runs.
func (n *GaleraNode) Running() bool {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	return p != nil && !p.Exited()
}

// Pid is the node's current mariadbd pid (0 when it does not run).
func (n *GaleraNode) Pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil || n.proc.Exited() {
		return 0
	}
	return n.proc.Pid()
}

// Kill ends the node with SIGKILL.
func (n *GaleraNode) Kill() error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.Exited() {
		return nil
	}
	n.g.logfn("galera: kill -9 %s (pid %d)", n.Name, p.Pid())
	return p.Kill()
}

// Signal sends sig to the node's mariadbd: SIGSTOP freezes it (to the others it is as
// gone as behind a network partition, without losing anything), SIGCONT lets it go on.
func (n *GaleraNode) Signal(sig syscall.Signal) error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.Signal(sig)
}

// Stop shuts the node down with SIGTERM.
func (n *GaleraNode) Stop(grace time.Duration) error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.Exited() {
		return nil
	}
	_, err := p.Stop(grace)
	return err
}

// Start starts a stopped node again on its data directory: it rejoins the cluster
// (IST when the others' gcache still holds what it missed, SST otherwise) and is
// ready when synced.
func (n *GaleraNode) Start(ctx context.Context) error {
	if n.Running() {
		return fmt.Errorf("galera node %s already runs", n.Name)
	}
	return n.start(ctx, false)
}

// DSN is batcherd's account on this node directly (not through HAProxy), without a
// database: for a multi-writer run, where each replica writes through another node.
func (n *GaleraNode) DSN() string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd = n.g.User, n.g.Password
	cfg.Net, cfg.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(n.Port)
	return cfg.FormatDSN()
}

// startCheck serves the node's primary-aware health check on CheckPort.
func (g *Galera) startCheck(n *GaleraNode) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", n.CheckPort))
	if err != nil {
		return fmt.Errorf("health check of %s: %w", n.Name, err)
	}
	srv := &http.Server{ReadHeaderTimeout: 2 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 1500*time.Millisecond)
		defer cancel()
		st, err := n.Status(ctx)
		switch {
		case err != nil:
			http.Error(w, "node unreachable", http.StatusServiceUnavailable)
		case !st.Healthy():
			http.Error(w, st.String(), http.StatusServiceUnavailable)
		default:
			fmt.Fprintln(w, st.String())
		}
	})}
	g.checkSrv = append(g.checkSrv, srv)
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// HAProxyConfig is the configuration HAProxy runs with (the README shows it).
func (g *Galera) HAProxyConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, `global
    maxconn 1000
    stats socket %s mode 600 level admin
defaults
    mode tcp
    timeout connect 1s
    # longer than batcherd's pooled connections live (5 minutes)
    timeout client 10m
    timeout server 10m
    retries 3
    option redispatch
listen galera_writer
    bind 127.0.0.1:%d
    # primary-aware check: HTTP 200 only from a node in the primary component,
    # synced and ready (mysql-check keeps a node that lost the primary UP)
    option httpchk GET /
    http-check expect status 200
    # one writer: the first node, the others only when it is down; the stick
    # table keeps the writer where it is when a failed node comes back
    stick-table type ip size 1
    stick on dst
    default-server inter 500ms fall 2 rise 3 on-marked-down shutdown-sessions
`, filepath.Join(g.Dir, "haproxy.sock"), g.ProxyPort)
	for i, n := range g.Nodes {
		backup := ""
		if i > 0 {
			backup = " backup"
		}
		fmt.Fprintf(&b, "    server %s 127.0.0.1:%d check port %d%s\n", n.Name, n.Port, n.CheckPort, backup)
	}
	return b.String()
}

func (g *Galera) startHAProxy(ctx context.Context) error {
	if err := os.WriteFile(g.haproxyCfg, []byte(g.HAProxyConfig()), 0o644); err != nil {
		return err
	}
	check := exec.CommandContext(ctx, g.haproxyBin, "-c", "-f", g.haproxyCfg)
	if out, err := check.CombinedOutput(); err != nil {
		return fmt.Errorf("haproxy -c: %w\n%s", err, out)
	}
	p, err := startProcess("haproxy", g.haproxyBin, []string{"-db", "-f", g.haproxyCfg}, os.Environ(), g.haproxyLog)
	if err != nil {
		return err
	}
	g.mu.Lock()
	g.haproxy = p
	g.mu.Unlock()
	db, err := sql.Open("mysql", g.ServerDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	if err := waitFor(ctx, p, 30*time.Second, func(ctx context.Context) error {
		_, err := db.ExecContext(ctx, "DO 1")
		return err
	}); err != nil {
		return fmt.Errorf("haproxy on 127.0.0.1:%d did not pass a query: %w\n%s", g.ProxyPort, err, LogTail(g.haproxyLog, 20))
	}
	g.logfn("galera: haproxy on 127.0.0.1:%d (writer %s, backups %d)", g.ProxyPort, g.Nodes[0].Name, len(g.Nodes)-1)
	return nil
}

// ServerDSN is batcherd's account through HAProxy, without a database: what
// Options.ServerDSN takes for a single-writer run.
func (g *Galera) ServerDSN() string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd = g.User, g.Password
	cfg.Net, cfg.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(g.ProxyPort)
	return cfg.FormatDSN()
}

// AdminDSN is the harness's own account through HAProxy (its connections are told
// apart from batcherd's by the user name, harness).
func (g *Galera) AdminDSN() string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd = "harness", "harness"
	cfg.Net, cfg.Addr = "tcp", "127.0.0.1:"+strconv.Itoa(g.ProxyPort)
	cfg.Timeout = 2 * time.Second
	return cfg.FormatDSN()
}

// Writer is the node HAProxy sends a new connection to now (asked through HAProxy).
func (g *Galera) Writer(ctx context.Context) (*GaleraNode, error) {
	cfg, _ := mysql.ParseDSN(g.AdminDSN())
	cfg.Logger = &mysql.NopLogger{}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	var name string
	if err := db.QueryRowContext(ctx, "SELECT @@wsrep_node_name").Scan(&name); err != nil {
		return nil, err
	}
	for _, n := range g.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("HAProxy reached an unknown node %q", name)
}

// Running reports whether HAProxy and at least one node run.
func (g *Galera) Running() bool {
	g.mu.Lock()
	p := g.haproxy
	g.mu.Unlock()
	if p == nil || p.Exited() {
		return false
	}
	for _, n := range g.Nodes {
		if n.Running() {
			return true
		}
	}
	return false
}

// Close stops HAProxy, the health checks and every node, and removes the directory.
// Safe to call more than once.
func (g *Galera) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	p := g.haproxy
	g.mu.Unlock()
	var errs []error
	if p != nil {
		if _, err := p.Stop(5 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range g.checkSrv {
		_ = s.Close()
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, n := range g.Nodes {
		wg.Go(func() {
			if err := n.Stop(60 * time.Second); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			if n.admin != nil {
				n.admin.Close()
			}
		})
	}
	wg.Wait()
	if !g.keep {
		if err := os.RemoveAll(g.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
