package main

// The HA run (`make ha`, chaos -ha single|multi): the same load, replicas, GitLab and
// end checks as the chaos run, on a three-node MariaDB Galera cluster behind HAProxy
// (internal/harness/galera.go) instead of one mariadbd. Nothing but the database is
// disturbed: the writer node is killed with -9 three times — once at a random moment
// under load, once while a claim transaction is open on it, once while a settlement
// transaction is open on it — and started again each time (it rejoins by IST). What
// the clients saw is measured around each kill: a probe that writes through HAProxy
// every 50 ms (the unavailability window), the answers the load got, /readyz of every
// replica, and the MySQL errors each replica's store counted.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/harness"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// haRun is what an HA run measures.
type haRun struct {
	done chan struct{} // the kill sequence is over

	mu     sync.Mutex
	kills  []*haKill
	probe  []probeSample
	readyz map[string][]readySample // by replica
	errs   map[string]float64       // store errors by code, summed over the replicas
}

type probeSample struct {
	at  time.Time
	ok  bool
	err string
}

type readySample struct {
	at     time.Time
	status int // 0: no answer
	msg    string
}

// haKill is one kill -9 of the writer node.
type haKill struct {
	Kind       string // mid-run, claim, settlement
	Node       string
	At         time.Time
	InFlight   string // what was open on the node when it died
	Missed     string // why the moment was not found (the kill happened anyway)
	WritesBack time.Time
	FirstErr   time.Duration // kill → the probe's first failed write
	ProbeErr   string
	NewWriter  string
	NonPrimary time.Duration // partition: freeze → the node says non-Primary
	RejoinTook time.Duration
	RejoinedBy string
}

// galeraDB lets the run treat the cluster as its database: stopping or killing it
// means the writer node.
type galeraDB struct {
	g   *harness.Galera
	dsn string // batcherd's through HAProxy, with -ha-sync-wait
}

func (d galeraDB) Running() bool     { return d.g.Running() }
func (d galeraDB) ServerDSN() string { return d.dsn }
func (d galeraDB) AdminDSN() string  { return d.g.AdminDSN() }
func (d galeraDB) Close() error      { return d.g.Close() }

func (d galeraDB) Stop(grace time.Duration) error {
	w, err := d.g.Writer(context.Background())
	if err != nil {
		return err
	}
	return w.Stop(grace)
}

func (d galeraDB) Kill() error {
	w, err := d.g.Writer(context.Background())
	if err != nil {
		return err
	}
	return w.Kill()
}

func (d galeraDB) Start(ctx context.Context) error {
	for _, n := range d.g.Nodes {
		if !n.Running() {
			if err := n.Start(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *run) startGalera(ctx context.Context, _ func(string, ...any)) error {
	t0 := time.Now()
	g, err := harness.StartGalera(ctx, harness.GaleraOptions{Keep: r.cfg.Keep,
		Logf: func(f string, a ...any) { r.logf(f, a...) }})
	if err != nil {
		return fmt.Errorf("galera cluster: %w", err)
	}
	r.gal, r.db = g, galeraDB{g: g, dsn: r.withSyncWait(g.ServerDSN())}
	r.ha = &haRun{done: make(chan struct{}), readyz: map[string][]readySample{}, errs: map[string]float64{}}
	mode := "single writer: every replica through HAProxy on 127.0.0.1:%d"
	if r.cfg.HA == "multi" {
		mode = "MULTI-WRITER: each replica writes through another node directly (HAProxy on 127.0.0.1:%d for the probe)"
	}
	r.checkSyncWait(ctx)
	r.logf("galera: %d nodes synced and HAProxy up in %s; "+mode, len(g.Nodes), time.Since(t0).Round(100*time.Millisecond), g.ProxyPort)
	return nil
}

// checkSyncWait proves on the cluster what store.Open does on a Galera node: a DSN
// without wsrep_sync_wait gets its READ bit (reads wait for what the cluster has
// committed), one that names it keeps its value.
func (r *run) checkSyncWait(ctx context.Context) {
	cfg, _ := mysql.ParseDSN(r.gal.Nodes[0].DSN())
	cfg.DBName = "mysql" // any database: batcherd's does not exist yet
	base := cfg.FormatDSN()
	for _, c := range []struct{ dsn, want string }{
		{base, "1"},
		{base + "?wsrep_sync_wait=0", "0"},
	} {
		st, err := store.Open(ctx, c.dsn, store.Options{MaxOpenConns: 1})
		if err != nil {
			r.violation("HA: store.Open on %s: %v", r.gal.Nodes[0].Name, err)
			continue
		}
		var got string
		if err := st.DB().QueryRowContext(ctx, "SELECT @@SESSION.wsrep_sync_wait").Scan(&got); err != nil || got != c.want {
			r.violation("HA: store on a Galera node (DSN %s): wsrep_sync_wait = %q (%v), want %s", strings.TrimPrefix(c.dsn, base), got, err, c.want)
		}
		st.Close()
	}
}

// replicaServerDSNs gives each replica another node in a multi-writer run.
func (r *run) replicaServerDSNs() []string {
	if r.gal == nil || r.cfg.HA != "multi" {
		return nil
	}
	var dsns []string
	for _, n := range r.gal.Nodes {
		dsns = append(dsns, r.withSyncWait(n.DSN()))
	}
	return dsns
}

// withSyncWait adds wsrep_sync_wait (-ha-sync-wait) to a DSN. Without it batcherd sets
// 1 by itself on Galera (store.Open): every read waits until the node has applied what
// the cluster committed before it; -ha-sync-wait 0 measures what happens without.
func (r *run) withSyncWait(dsn string) string {
	if r.cfg.HASyncWait < 0 {
		return dsn
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return dsn
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wsrep_sync_wait"] = fmt.Sprint(r.cfg.HASyncWait)
	return cfg.FormatDSN()
}

// haChaosContext ends when Duration has passed and the kill sequence is over, plus
// ten seconds of load on the healed cluster.
func (r *run) haChaosContext(ctx context.Context) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		if !sleep(cctx, r.cfg.Duration) {
			return
		}
		select {
		case <-r.ha.done:
		case <-cctx.Done():
			return
		}
		sleep(cctx, 10*time.Second)
		cancel()
	}()
	return cctx, cancel
}

// haDisrupt starts the kill sequence and the measurements.
func (r *run) haDisrupt(chaosCtx context.Context, wg *sync.WaitGroup) {
	wg.Go(func() { r.haProbe(chaosCtx) })
	wg.Go(func() { r.haReadyz(chaosCtx) })
	wg.Go(func() { r.haKills(r.ctx) })
}

// haKills kills the writer three times, each followed by a rejoin.
func (r *run) haKills(ctx context.Context) {
	defer close(r.ha.done)
	if !sleep(ctx, 20*time.Second) { // the load builds a queue and batches first
		return
	}
	for _, k := range []struct {
		kind string
		arm  func(context.Context, *harness.GaleraNode) (string, func(), error)
	}{
		{"mid-run", nil},
		{"claim", r.armClaim},
		{"settlement", r.armSettlement},
	} {
		if ctx.Err() != nil {
			return
		}
		r.killWriter(ctx, k.kind, k.arm)
	}
	if ctx.Err() == nil && r.cfg.HAPartition {
		r.partition(ctx)
	}
}

// partition isolates the writer for a while: the two other nodes are frozen
// (SIGSTOP), so to the writer they are gone, and alone it is no longer a primary
// component. What a node there answers is what batcherd must read as "not in the
// primary component": the store is asked directly on it (HAProxy marks it DOWN at
// once, so through HAProxy clients see no server at all). Then the others go on
// (SIGCONT) and the three form the primary component again by themselves.
func (r *run) partition(ctx context.Context) {
	k := &haKill{Kind: "partition"}
	var w *harness.GaleraNode
	if err := retry(ctx, 60*time.Second, func() (err error) { w, err = r.gal.Writer(ctx); return err }); err != nil {
		r.violation("HA: no writer reachable through HAProxy before the partition: %v", err)
		return
	}
	k.Node = w.Name
	var frozen []string
	k.At = time.Now()
	for _, n := range r.gal.Nodes {
		if n != w {
			_ = n.Signal(syscall.SIGSTOP)
			frozen = append(frozen, n.Name)
		}
	}
	r.ha.mu.Lock()
	r.ha.kills = append(r.ha.kills, k)
	r.ha.mu.Unlock()
	r.logf("HA: SIGSTOP %s: %s is alone", strings.Join(frozen, ", "), w.Name)
	thaw := func() {
		for _, n := range r.gal.Nodes {
			if n != w {
				_ = n.Signal(syscall.SIGCONT)
			}
		}
	}
	defer thaw()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if st, err := w.Status(ctx); err == nil && st.ClusterStatus != "Primary" {
			k.NonPrimary = time.Since(k.At)
			break
		}
		sleep(ctx, 100*time.Millisecond)
	}
	if k.NonPrimary == 0 {
		r.violation("HA: %s stayed in the primary component for 30s with both other nodes frozen", w.Name)
		return
	}
	r.logf("HA: %s out of the primary component %s after the freeze", w.Name, k.NonPrimary.Round(time.Millisecond))
	k.InFlight = r.askIsolated(ctx, w)
	sleep(ctx, 3*time.Second)

	thaw()
	t0 := time.Now()
	if err := retry(ctx, 90*time.Second, func() error {
		for _, n := range r.gal.Nodes {
			st, err := n.Status(ctx)
			if err != nil {
				return err
			}
			if !st.Healthy() {
				return fmt.Errorf("%s: %s", n.Name, st)
			}
		}
		return nil
	}); err != nil {
		r.violation("HA: the cluster did not heal within 90s of SIGCONT: %v", err)
		return
	}
	r.ha.mu.Lock()
	k.RejoinTook, k.RejoinedBy = time.Since(t0), "merging back (SIGCONT)"
	r.ha.mu.Unlock()
	r.logf("HA: SIGCONT %s: the primary component is back on three nodes after %s", strings.Join(frozen, ", "), k.RejoinTook.Round(100*time.Millisecond))
	deadline = time.Now().Add(60 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if back, first, ferr, ok := r.probeAfter(k.At); ok {
			r.ha.mu.Lock()
			k.WritesBack, k.FirstErr, k.ProbeErr = back, first, ferr
			r.ha.mu.Unlock()
			break
		}
		sleep(ctx, 50*time.Millisecond)
	}
	if nw, err := r.gal.Writer(ctx); err == nil {
		k.NewWriter = nw.Name
	}
	sleep(ctx, 5*time.Second)
}

// askIsolated asks batcherd's store, directly on the isolated node, to ping (what
// /readyz runs) and to admit an application: both must answer ErrNotPrimary, and
// nothing may be written.
func (r *run) askIsolated(ctx context.Context, w *harness.GaleraNode) string {
	cfg, _ := mysql.ParseDSN(w.DSN())
	cfg.DBName = r.c.DBName
	qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	st, err := store.Open(qctx, cfg.FormatDSN(), store.Options{MaxOpenConns: 2, DialTimeout: 2 * time.Second, IOTimeout: 5 * time.Second})
	if err != nil {
		r.violation("HA: opening the store on isolated %s: %v", w.Name, err)
		return ""
	}
	defer st.Close()
	pingErr := st.Ping(qctx)
	_, _, createErr := st.OperationCreate(qctx, store.OperationCreateParams{OperationID: uuid.NewString(),
		Subject: "isolated-node-probe", Target: "ha/none", Repo: repos[0], Action: domain.ActionGrant})
	for what, err := range map[string]error{"Ping (/readyz)": pingErr, "OperationCreate": createErr} {
		if !errors.Is(err, store.ErrNotPrimary) {
			r.violation("HA: store on isolated %s: %s answered %v, want ErrNotPrimary", w.Name, what, err)
		}
	}
	return fmt.Sprintf("the store on %s: Ping → %q; OperationCreate → %q", w.Name, shortStoreErr(pingErr), shortStoreErr(createErr))
}

func shortStoreErr(err error) string {
	if err == nil {
		return "ok"
	}
	return truncateText(err.Error(), 110)
}

// killWriter kills the node HAProxy sends writes to — when arm is set, at the moment
// arm finds — waits until writes go through again, and starts the node again.
func (r *run) killWriter(ctx context.Context, kind string, arm func(context.Context, *harness.GaleraNode) (string, func(), error)) {
	k := &haKill{Kind: kind}
	var w *harness.GaleraNode
	if err := retry(ctx, 60*time.Second, func() (err error) { w, err = r.gal.Writer(ctx); return err }); err != nil {
		r.violation("HA: no writer reachable through HAProxy before the %s kill: %v", kind, err)
		return
	}
	k.Node = w.Name
	if arm != nil {
		inflight, release, err := arm(ctx, w)
		if err != nil {
			k.Missed = err.Error()
			r.logf("HA: %s moment not found (%v); killing %s anyway", kind, err, w.Name)
		} else {
			k.InFlight = inflight
			defer release()
		}
	}
	k.At = time.Now()
	if err := w.Kill(); err != nil {
		r.violation("HA: kill -9 %s: %v", w.Name, err)
		return
	}
	r.logf("HA: kill -9 writer %s (%s)%s", w.Name, kind, func() string {
		if k.InFlight != "" {
			return ": " + k.InFlight
		}
		return ""
	}())
	r.ha.mu.Lock()
	r.ha.kills = append(r.ha.kills, k)
	r.ha.mu.Unlock()

	// Writes through HAProxy again (the probe tells), then who the writer is now.
	deadline := time.Now().Add(90 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if back, first, ferr, ok := r.probeAfter(k.At); ok {
			r.ha.mu.Lock()
			k.WritesBack, k.FirstErr, k.ProbeErr = back, first, ferr
			r.ha.mu.Unlock()
			break
		}
		sleep(ctx, 50*time.Millisecond)
	}
	if k.WritesBack.IsZero() {
		r.violation("HA: no write went through HAProxy within 90s of killing %s", w.Name)
	} else if nw, err := r.gal.Writer(ctx); err == nil {
		k.NewWriter = nw.Name
		r.logf("HA: writes through HAProxy again %s after the kill (writer now %s)", k.WritesBack.Sub(k.At).Round(time.Millisecond), nw.Name)
	}

	// The cluster runs on two nodes for a while (the others' gcache keeps what the
	// killed node misses), then the node comes back.
	sleep(ctx, 5*time.Second)
	t0 := time.Now()
	if err := retry(ctx, 120*time.Second, func() error { return w.Start(ctx) }); err != nil {
		r.violation("HA: %s did not rejoin: %v", w.Name, err)
		return
	}
	r.ha.mu.Lock()
	k.RejoinTook, k.RejoinedBy = time.Since(t0), w.JoinedBy()
	r.ha.mu.Unlock()
	r.logf("HA: %s rejoined by %s in %s", w.Name, k.RejoinedBy, k.RejoinTook.Round(100*time.Millisecond))
	sleep(ctx, 5*time.Second)
}

// probeAfter reads the probe's samples after t: the first success after a failure (or
// after t when nothing failed, which is reported as no window), the time to the first
// failure and its error.
func (r *run) probeAfter(t time.Time) (back time.Time, firstErr time.Duration, errText string, ok bool) {
	r.ha.mu.Lock()
	defer r.ha.mu.Unlock()
	failed := false
	for _, s := range r.ha.probe {
		if s.at.Before(t) {
			continue
		}
		if !s.ok && !failed {
			failed, firstErr, errText = true, s.at.Sub(t), s.err
		}
		if s.ok && (failed || s.at.Sub(t) > 3*time.Second) {
			return s.at, firstErr, errText, true
		}
	}
	return time.Time{}, 0, "", false
}

// haProbe writes one row through HAProxy every 50 ms (each write timed from its
// start; a write that fails is retried at the next tick on a new connection).
func (r *run) haProbe(ctx context.Context) {
	cfg, _ := mysql.ParseDSN(r.gal.AdminDSN())
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	cfg.Logger = &mysql.NopLogger{}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		r.logf("HA probe: %v", err)
		return
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, q := range []string{"CREATE DATABASE IF NOT EXISTS ha_probe",
		"CREATE TABLE IF NOT EXISTS ha_probe.w (id BIGINT AUTO_INCREMENT PRIMARY KEY, at DATETIME(6) NOT NULL)"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			r.logf("HA probe: %s: %v", q, err)
			return
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		at := time.Now()
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := db.ExecContext(qctx, "INSERT INTO ha_probe.w (at) VALUES (CURRENT_TIMESTAMP(6))")
		cancel()
		if ctx.Err() != nil {
			return
		}
		s := probeSample{at: at, ok: err == nil}
		if err != nil {
			s.err = shortErr(err)
		}
		r.ha.mu.Lock()
		r.ha.probe = append(r.ha.probe, s)
		r.ha.mu.Unlock()
	}
}

// shortErr is an error without addresses: the first line, cut.
func shortErr(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return fmt.Sprintf("%d %s", me.Number, truncateText(me.Message, 60))
	}
	s := firstLine(err.Error())
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, mysql.ErrInvalidConn):
		return "invalid connection"
	case strings.Contains(s, "connection refused"):
		return "connection refused"
	case strings.Contains(s, "EOF"):
		return "EOF"
	case strings.Contains(s, "i/o timeout"):
		return "i/o timeout"
	}
	return truncateText(s, 60)
}

func truncateText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// haReadyz asks every replica's /readyz every 250 ms.
func (r *run) haReadyz(ctx context.Context) {
	client := &http.Client{Timeout: 4 * time.Second}
	for sleep(ctx, 250*time.Millisecond) {
		var wg sync.WaitGroup
		for _, rep := range r.c.Replicas {
			wg.Go(func() {
				s := readySample{at: time.Now()}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, rep.URL()+"/readyz", nil)
				resp, err := client.Do(req)
				if err == nil {
					body, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
					resp.Body.Close()
					s.status, s.msg = resp.StatusCode, readyMessage(body)
				}
				if ctx.Err() != nil {
					return
				}
				r.ha.mu.Lock()
				r.ha.readyz[rep.ID] = append(r.ha.readyz[rep.ID], s)
				r.ha.mu.Unlock()
			})
		}
		wg.Wait()
	}
}

// readyMessage is the message of a /readyz error body.
func readyMessage(body []byte) string {
	s := string(body)
	if i := strings.Index(s, `"message":"`); i >= 0 {
		s = s[i+len(`"message":"`):]
		s, _, _ = strings.Cut(s, `"`)
		return s
	}
	return ""
}

// armClaim finds the moment a claim transaction is open on the writer: it locks the
// oldest waiting row of each repository (READ COMMITTED, those rows only; admissions
// go on) on the writer node itself, and waits until a claim's guarded UPDATE waits for
// one —
// the claim has inserted its slot row and read its members, and has not committed.
// The node is then killed with that transaction open. release ends the lock (on a
// dead node, only the pool).
func (r *run) armClaim(ctx context.Context, w *harness.GaleraNode) (string, func(), error) {
	return r.armLock(ctx, w, "claim",
		"SELECT MIN(id) FROM `%s`.merge_batch_request WHERE batch_id IS NULL GROUP BY repo",
		"SELECT id FROM `%s`.merge_batch_request WHERE id IN (%s) AND batch_id IS NULL FOR UPDATE",
		`UPDATE merge\_batch\_request SET batch\_id%`)
}

// armSettlement is armClaim for a settlement: it locks one in_batch operation of each
// running batch whose MR is open, and waits until a settlement (success or failure)
// waits for it — the settlement has already moved the batch row and has not
// committed.
func (r *run) armSettlement(ctx context.Context, w *harness.GaleraNode) (string, func(), error) {
	return r.armLock(ctx, w, "settlement",
		"SELECT MIN(o.id) FROM `%[1]s`.operation o JOIN `%[1]s`.merge_batch b ON b.id = o.batch_id WHERE o.status = 'in_batch' AND b.status = 1 AND b.mr_iid IS NOT NULL GROUP BY b.id",
		"SELECT id FROM `%s`.operation WHERE id IN (%s) AND status = 'in_batch' FOR UPDATE",
		`SELECT operation\_id, action, subject, target FROM operation%FOR UPDATE`)
}

func (r *run) armLock(ctx context.Context, w *harness.GaleraNode, what, pickQ, lockQ, waiterLike string) (string, func(), error) {
	db, err := w.OpenAdmin()
	if err != nil {
		return "", nil, err
	}
	db.SetMaxOpenConns(2)
	release := func() { db.Close() }
	deadline := time.Now().Add(90 * time.Second)
	for attempt := 0; time.Now().Before(deadline) && ctx.Err() == nil; attempt++ {
		var ids []string
		rows, err := db.QueryContext(ctx, fmt.Sprintf(pickQ, r.c.DBName))
		if err == nil {
			for rows.Next() {
				var id int64
				if rows.Scan(&id) == nil {
					ids = append(ids, fmt.Sprint(id))
				}
			}
			rows.Close()
		}
		if len(ids) == 0 {
			sleep(ctx, 20*time.Millisecond)
			continue
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			sleep(ctx, 100*time.Millisecond)
			continue
		}
		locked, err := tx.QueryContext(ctx, fmt.Sprintf(lockQ, r.c.DBName, strings.Join(ids, ",")))
		n := 0
		if err == nil {
			for locked.Next() {
				n++
			}
			locked.Close()
		}
		if n == 0 {
			_ = tx.Rollback()
			continue
		}
		// Wait a while for a transaction of batcherd's to queue behind a lock.
		until := time.Now().Add(6 * time.Second)
		for time.Now().Before(until) && ctx.Err() == nil {
			var q string
			var modified int64
			err := db.QueryRowContext(ctx, `SELECT trx_query, trx_rows_modified FROM information_schema.innodb_trx
				WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE ? LIMIT 1`, waiterLike).Scan(&q, &modified)
			if err == nil {
				return fmt.Sprintf("a %s transaction open on it (%d row(s) written, waiting in %q)", what, modified, truncateText(strings.Join(strings.Fields(q), " "), 48)),
					func() { _ = tx.Rollback(); release() }, nil
			}
			sleep(ctx, 5*time.Millisecond)
		}
		_ = tx.Rollback()
	}
	release()
	return "", nil, fmt.Errorf("no %s transaction queued behind the lock within 90s", what)
}

// haRecover starts every node that is down and waits until all are synced.
func (r *run) haRecover(ctx context.Context) error {
	for _, n := range r.gal.Nodes {
		if !n.Running() {
			if err := n.Start(ctx); err != nil {
				return fmt.Errorf("starting %s again: %w", n.Name, err)
			}
		}
	}
	return nil
}

// haCollectErrors reads the store's MySQL error counters from every replica.
func (r *run) haCollectErrors(ctx context.Context) {
	for _, rep := range r.c.Replicas {
		m, err := rep.Metrics(ctx)
		if err != nil {
			continue
		}
		r.ha.mu.Lock()
		for _, s := range m["batcherd_store_errors_total"] {
			r.ha.errs[s.Labels["code"]] += s.Value
		}
		r.ha.mu.Unlock()
	}
}

// haSummary is the HA part of the report: per kill, the window and what clients saw.
func (r *run) haSummary(ctx context.Context) string {
	r.haCollectErrors(ctx)
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	r.ha.mu.Lock()
	defer r.ha.mu.Unlock()
	mode := "single writer (HAProxy, one writer + 2 backups, primary-aware check)"
	if r.cfg.HA == "multi" {
		mode = "MULTI-WRITER (replica i writes through node i directly)"
	}
	if r.cfg.HASyncWait >= 0 {
		mode += fmt.Sprintf(", wsrep_sync_wait=%d in batcherd's DSN", r.cfg.HASyncWait)
	} else {
		mode += ", wsrep_sync_wait=1 (batcherd's own default on Galera)"
	}
	p("")
	p("=== HA: Galera, %d nodes, %s ===", len(r.gal.Nodes), mode)
	oks, fails := 0, 0
	for _, s := range r.ha.probe {
		if s.ok {
			oks++
		} else {
			fails++
		}
	}
	p("probe             %d writes through HAProxy every 50 ms: %d ok, %d failed", oks+fails, oks, fails)
	for i, k := range r.ha.kills {
		if k.Kind == "partition" {
			p("partition         %s alone (the other two SIGSTOPped) at +%.1fs: out of the primary component after %s; %s",
				k.Node, k.At.Sub(r.start).Seconds(), k.NonPrimary.Round(time.Millisecond), k.InFlight)
		} else {
			p("kill %d (%s)  kill -9 %s at +%.1fs%s", i+1, k.Kind, k.Node, k.At.Sub(r.start).Seconds(), inflight(k))
		}
		if k.WritesBack.IsZero() {
			p("  writes          NOT BACK")
			continue
		}
		win := k.WritesBack.Sub(k.At)
		if k.ProbeErr == "" {
			p("  writes          never failed for the probe (back check at +%s)", win.Round(time.Millisecond))
		} else {
			p("  unavailability  %s (probe: first failed write %s after the kill: %s; writes through HAProxy again after %s, writer now %s)",
				win.Round(time.Millisecond), k.FirstErr.Round(time.Millisecond), k.ProbeErr, win.Round(time.Millisecond), k.NewWriter)
		}
		lo, hi := k.At.Add(-500*time.Millisecond), k.WritesBack.Add(3*time.Second)
		p("  clients         POST /v1/operations sent in the window: %s", r.answersIn(lo, hi))
		p("  /readyz         %s", r.readyIn(lo, hi))
		if k.Kind == "partition" {
			p("  healed          %s after SIGCONT", k.RejoinTook.Round(100*time.Millisecond))
			continue
		}
		p("  rejoin          %s by %s in %s", k.Node, k.RejoinedBy, k.RejoinTook.Round(100*time.Millisecond))
	}
	var codes []string
	for c, n := range r.ha.errs {
		codes = append(codes, fmt.Sprintf("%s: %.0f", c, n))
	}
	sort.Strings(codes)
	p("store errors      batcherd_store_errors_total over the replicas, by MySQL error (0 = not a server error): %s", strings.Join(codes, ", "))
	return b.String()
}

func inflight(k *haKill) string {
	switch {
	case k.InFlight != "":
		return ", " + k.InFlight
	case k.Missed != "":
		return " (moment NOT found: " + k.Missed + ")"
	}
	return ""
}

// answersIn summarises the load's answers to applications sent between lo and hi.
func (r *run) answersIn(lo, hi time.Time) string {
	l := r.load
	l.mu.Lock()
	defer l.mu.Unlock()
	by := map[string]int{}
	var worst time.Duration
	n := 0
	for _, k := range l.keys {
		for _, a := range k.answers {
			if a.sent.Before(lo) || a.sent.After(hi) {
				continue
			}
			n++
			key := fmt.Sprintf("%d", a.status)
			switch {
			case a.status == 0:
				key = "no answer (" + truncateText(a.err, 40) + ")"
			case a.code != "":
				key += " " + a.code
			}
			by[key]++
			worst = max(worst, a.recv.Sub(a.sent))
		}
	}
	if n == 0 {
		return "none"
	}
	var parts []string
	for _, k := range sortedKeys(by) {
		parts = append(parts, fmt.Sprintf("%d× %s", by[k], k))
	}
	return fmt.Sprintf("%d: %s; slowest answer %s", n, strings.Join(parts, ", "), worst.Round(time.Millisecond))
}

// readyIn summarises the /readyz answers between lo and hi: per replica, how long it
// was not ready and why.
func (r *run) readyIn(lo, hi time.Time) string {
	var parts []string
	ids := make([]string, 0, len(r.ha.readyz))
	for id := range r.ha.readyz {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		var first, last time.Time
		msgs := map[string]int{}
		for _, s := range r.ha.readyz[id] {
			if s.at.Before(lo) || s.at.After(hi) || s.status == http.StatusOK {
				continue
			}
			if first.IsZero() {
				first = s.at
			}
			last = s.at
			m := s.msg
			if s.status == 0 {
				m = "no answer"
			}
			msgs[fmt.Sprintf("%d %s", s.status, m)]++
		}
		if first.IsZero() {
			parts = append(parts, id+" ready throughout")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s not ready for ~%s (%s)", id, last.Sub(first).Round(100*time.Millisecond)+250*time.Millisecond, strings.Join(sortedKeys(msgs), "; ")))
	}
	return strings.Join(parts, "; ")
}
