// Package store is batcherd's only door to MySQL/MariaDB. It owns the schema
// (migrations, start-up verification) and every state transition.
//
// Rules every exported method follows (docs/ARCHITECTURE.md, invariants I1–I8):
//
//   - One exported method is one short transaction, run through withTx. No method calls
//     anything over the network (I7): callers do store, then GitLab, then store.
//   - Every state write is guarded: WHERE … AND status=? AND version=?, with version
//     bumped on every write (monotonic, so no ABA, and go-sql-driver's changed-rows count
//     is never ambiguous), and the affected-row count is checked (I6).
//   - A duplicate key is an answer, not an error (I4, idempotency, audit).
//   - MySQL errors are translated in one place, translate: 1062 → ErrDuplicate,
//     1213/1020/1205 → ErrLostRace (on Galera also a certification failure, at COMMIT
//     or at any later statement), no rows → ErrNotFound, 1047/1180 → ErrNotPrimary (a
//     Galera node outside the primary component), a connection lost during COMMIT or
//     an autocommit write → ErrCommitUnknown (the caller re-reads by key and version
//     before deciding), a connection lost before COMMIT → ErrUnavailable (the server
//     rolled the transaction back).
//   - All times come from the database clock (CURRENT_TIMESTAMP(6)), never the replica's.
package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
)

// Domain errors. Callers test them with errors.Is.
var (
	// ErrNotFound: the row asked for does not exist.
	ErrNotFound = errors.New("not found")
	// ErrLostRace: a guarded write matched nothing (the row moved on since it was read),
	// or the server chose this transaction as a deadlock/lock-wait/snapshot victim.
	// Losing a race is normal between replicas: log it at debug and move on.
	ErrLostRace = errors.New("lost race: the row changed since it was read")
	// ErrDuplicate: a unique key already holds this value. Methods turn it into the
	// answer it means; it escapes only where the caller must decide.
	ErrDuplicate = errors.New("duplicate key")
	// ErrCommitUnknown: the connection broke during COMMIT (or during a write that was
	// its own transaction); it may or may not have committed — measured on Galera: a
	// writer killed under load had committed INSERTs whose clients got "invalid
	// connection". Re-read by key and version before retrying.
	ErrCommitUnknown = errors.New("commit outcome unknown: connection lost during COMMIT")
	// ErrNotPrimary: the database node is not in the primary component of its Galera
	// cluster (1047, or 1180 at COMMIT): it refuses reads and writes until it rejoins;
	// or the server is read-only (1290: not the primary). Retry: behind a primary-aware
	// proxy the next connection reaches a node that is.
	ErrNotPrimary = errors.New("database node not in the primary component")
	// ErrUnavailable: the connection to the database broke before COMMIT (a server or
	// node killed, a failover, a proxy that cut it); the server rolled the transaction
	// back, so nothing of it was written. Retry.
	ErrUnavailable = errors.New("database unavailable: connection lost, nothing committed")
	// ErrBindingBusy: the relation has an application in flight, or is failed and
	// awaiting recovery; a new application is refused (HTTP 409).
	ErrBindingBusy = errors.New("binding busy")
	// ErrBindingActive: a grant for a relation that is already active (HTTP 409).
	ErrBindingActive = errors.New("binding already active")
	// ErrBindingNotActive: a revoke for a relation that is not active (HTTP 409).
	ErrBindingNotActive = errors.New("binding not active")
	// ErrStale: an approval/rejection/retry for an operation that no longer owns its
	// binding or whose state moved on (HTTP 409 stale).
	ErrStale = errors.New("stale")
	// ErrSelfApproval: four eyes — the principal that requested an operation tried to
	// approve it (HTTP 403 self_approval). Nothing was changed.
	ErrSelfApproval = errors.New("self-approval refused")
	// ErrIdempotencyKeyReused: the key was first used with a different request (HTTP 422).
	ErrIdempotencyKeyReused = errors.New("idempotency key reused with a different request")
	// ErrBatchPublishing: a batch without a recorded MR is under a live publish
	// reservation — its publisher may be opening the MR right now (HTTP 409).
	ErrBatchPublishing = errors.New("the batch is being published")
)

// errRollback is returned by a withTx callback that decided to roll back as a normal
// outcome (for example a claim that found nothing to claim). The method that returned
// it turns it into its answer; it is never a failure and is not counted as one.
var errRollback = errors.New("store: rolled back by choice")

// ErrTxAborted marks the ErrLostRace of a transaction the server aborted (1213): a
// deadlock victim, or on Galera a transaction a replicated write set or a view change
// (the node leaving or rejoining the primary component) aborted — not a guard that
// lost to a change it can see. Nothing of it was written; the API answers it 503
// (retry), not 409: measured on Galera, retries with an Idempotency-Key aborted at a
// view change were answered 409 conflict although their key had answered before.
var ErrTxAborted = errors.New("aborted by the server")

// MySQL server error numbers the store interprets.
const (
	errDupEntry         = 1062
	errLockDeadlock     = 1213
	errLockWaitTimeout  = 1205
	errLockNoWait       = 3572 // MySQL 8: NOWAIT met a lock (MariaDB answers 1205)
	errRecordChangedRR  = 1020 // innodb_snapshot_isolation (MariaDB 11.6.2+) under REPEATABLE READ
	errAccessDeniedUser = 1698
	// Galera: a node outside the primary component answers 1047 (ER_UNKNOWN_COM_ERROR,
	// "WSREP has not yet prepared node for application use") to reads and writes, and
	// 1180 (ER_ERROR_DURING_COMMIT) to a commit in flight when it lost the component.
	errNotPrimaryCom     = 1047
	errErrorDuringCommit = 1180
	// A server that refuses writes because it is read-only (1290,
	// ER_OPTION_PREVENTS_STATEMENT): a former primary fenced after a failover, or a
	// replica a stale DNS name or proxy still points at. Not measured here (no MySQL
	// or semi-sync setup on these machines); read like 1047: not the writer, retry.
	errReadOnly = 1290
	// ER_CANT_CHANGE_TX_CHARACTERISTICS: SET TRANSACTION (a BEGIN with an isolation
	// level) on a connection still inside a transaction.
	errTxInProgress = 1568
)

// storeErrors counts MySQL errors by number; registered by Collectors.
var storeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "batcherd_store_errors_total",
	Help: "MySQL errors seen by the store, by server error number (0 = not a server error).",
}, []string{"code"})

// Collectors returns the store's Prometheus collectors for the app's registry.
func Collectors() []prometheus.Collector { return []prometheus.Collector{storeErrors} }

// Options tunes Open. Zero values take the defaults.
type Options struct {
	MaxOpenConns int           // default 20
	MaxIdleConns int           // default MaxOpenConns
	ConnMaxLife  time.Duration // default 5m
	DialTimeout  time.Duration // default 5s
	IOTimeout    time.Duration // default 30s
	// EventReceivers: the identities of the event receivers each event is written
	// for (none: no outbox rows). See SetEventReceivers.
	EventReceivers []int64
}

// Store is the handle every component shares. It is safe for concurrent use.
type Store struct {
	db *sqlx.DB

	// noWait: whether the claim's slot INSERT may refuse to wait for locks (0 not
	// probed yet, 1 yes, 2 no; batches.go, takeSlot).
	noWait atomic.Int32

	// admit is this Store's admission queue (admit_group.go), made once by admitter.
	admitOnce sync.Once
	admit     *admitter

	// inst caches the installation id (installation.go).
	inst installationCache

	// receivers are the event receivers each event is written for (outbox.go); none =
	// BATCHERD_EVENTS_URL empty, no event rows.
	receivers atomic.Pointer[[]int64]

	// Hooks lets tests stop a transaction at a chosen point (I2, I3 proofs). Nil in production.
	Hooks *Hooks
}

// Hooks are called inside transactions at fixed points, only by tests.
type Hooks struct {
	// ClaimAfterRead runs inside the claim transaction after the waiting rows are read and
	// before the guarded UPDATE.
	ClaimAfterRead func(ctx context.Context, batchID int64, requestIDs []int64)
	// ClaimAfterUpdate runs after the guarded UPDATE and member insert, before COMMIT.
	ClaimAfterUpdate func(ctx context.Context, batchID int64)
}

// DB exposes the pool for read-only tooling (verify, metrics, tests).
func (s *Store) DB() *sqlx.DB { return s.db }

// Close closes the pool.
func (s *Store) Close() error { return s.db.Close() }

// ParseDSN parses a plain go-sql-driver DSN and forces the options batcherd relies on,
// whatever the user wrote: parseTime, UTC on both sides, timeouts, changed-rows
// semantics (we bump version on every guarded write; docs/ARCHITECTURE.md, "Database facts"), and interpolated
// parameters (one round trip per statement instead of prepare+execute+close).
func ParseDSN(dsn string, o Options) (*mysql.Config, error) {
	cfg, err := parseDSN(dsn) // dsn.go: errors that quote no part of the DSN
	if err != nil {
		return nil, err
	}
	o = o.withDefaults()
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	cfg.ClientFoundRows = false
	cfg.InterpolateParams = true
	cfg.Timeout = o.DialTimeout
	cfg.ReadTimeout = o.IOTimeout
	cfg.WriteTimeout = o.IOTimeout
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	// The session time zone must match Loc so DATETIME values written with
	// CURRENT_TIMESTAMP(6) read back as the same instant.
	cfg.Params["time_zone"] = "'+00:00'"
	cfg.Collation = "utf8mb4_general_ci"
	return cfg, nil
}

func (o Options) withDefaults() Options {
	if o.MaxOpenConns <= 0 {
		o.MaxOpenConns = 20
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = o.MaxOpenConns
	}
	if o.ConnMaxLife <= 0 {
		o.ConnMaxLife = 5 * time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.IOTimeout <= 0 {
		o.IOTimeout = 30 * time.Second
	}
	return o
}

// Open connects and pings. It does not migrate or verify the schema: see Migrate and
// CheckSchema.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	cfg, err := ParseDSN(dsn, o)
	if err != nil {
		return nil, err
	}
	o = o.withDefaults()
	pctx, cancel := context.WithTimeout(ctx, o.DialTimeout+time.Second)
	defer cancel()
	db, err := openPool(pctx, cfg, o)
	if err != nil {
		return nil, err
	}
	if _, set := cfg.Params["wsrep_sync_wait"]; !set {
		// A Galera node applies the write sets other nodes committed asynchronously: a
		// read right after a commit elsewhere (another replica's node, or the node a
		// failover moved to) can miss it — measured 19 commits behind under load, and in
		// a multi-writer run clients were answered 404 for operations they had just
		// created. wsrep_sync_wait's READ bit makes each read wait until the node has
		// applied everything committed before it. A DSN that sets it is left alone.
		on, wait, err := wsrepSession(pctx, db)
		if err != nil {
			db.Close()
			return nil, translate(err)
		}
		if on && wait&1 == 0 {
			db.Close()
			cfg.Params["wsrep_sync_wait"] = strconv.Itoa(wait | 1)
			if db, err = openPool(pctx, cfg, o); err != nil {
				return nil, err
			}
		}
	}
	st := &Store{db: db}
	st.SetEventReceivers(o.EventReceivers)
	return st, nil
}

// openPool opens and pings a connection pool.
func openPool(ctx context.Context, cfg *mysql.Config, o Options) (*sqlx.DB, error) {
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql connector: %w", err)
	}
	db := sqlx.NewDb(sql.OpenDB(conn), "mysql")
	db.SetMaxOpenConns(o.MaxOpenConns)
	db.SetMaxIdleConns(o.MaxIdleConns)
	db.SetConnMaxLifetime(o.ConnMaxLife)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("cannot reach MySQL at %s (check BATCHERD_MYSQL_DSN, that the server runs and the user may log in over TCP): %w", cfg.Addr, err)
	}
	return db, nil
}

// wsrepSession reads whether the server runs Galera replication (wsrep_on) and the
// session's wsrep_sync_wait. Servers without wsrep show neither: false, 0.
func wsrepSession(ctx context.Context, db *sqlx.DB) (on bool, syncWait int, err error) {
	rows, err := db.QueryContext(ctx, "SHOW SESSION VARIABLES WHERE Variable_name IN ('wsrep_on', 'wsrep_sync_wait')")
	if err != nil {
		return false, 0, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return false, 0, err
		}
		switch strings.ToLower(k) {
		case "wsrep_on":
			on = v == "ON"
		case "wsrep_sync_wait":
			syncWait, _ = strconv.Atoi(v)
		}
	}
	return on, syncWait, rows.Err()
}

// Ping checks the database is reachable and, on a Galera node, that the node is in the
// primary component, synced and ready (readiness): such a node still answers a ping
// and SELECT 1, but 1047 to every table. ErrNotPrimary names what it said. Servers
// without wsrep show none of these variables.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return translate(err)
	}
	st := map[string]string{}
	// A MariaDB built with wsrep shows the status variables with wsrep off too
	// (Disconnected, OFF): wsrep_on says whether they mean anything.
	for _, q := range []string{"SHOW GLOBAL VARIABLES WHERE Variable_name = 'wsrep_on'",
		"SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_cluster_status', 'wsrep_local_state_comment')"} {
		rows, err := s.db.QueryContext(ctx, q)
		if err != nil {
			return translate(err)
		}
		for rows.Next() {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				rows.Close()
				return translate(err)
			}
			st[strings.ToLower(k)] = v
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return translate(err)
		}
		if st["wsrep_on"] != "ON" {
			return nil // no Galera: nothing more to ask
		}
	}
	return wsrepReady(st)
}

// wsrepReady judges a Galera node's wsrep status variables: nil when it may serve.
func wsrepReady(st map[string]string) error {
	ready, hasReady := st["wsrep_ready"]
	cluster, hasCluster := st["wsrep_cluster_status"]
	if (!hasReady || ready == "ON") && (!hasCluster || cluster == "Primary" || cluster == "") {
		return nil
	}
	return fmt.Errorf("%w (wsrep_cluster_status=%s, wsrep_ready=%s, state %s)", ErrNotPrimary, cluster, ready, st["wsrep_local_state_comment"])
}

// withTx runs fn in one transaction at the given isolation level and translates the
// result. It is the only place transactions begin and end.
func (s *Store) withTx(ctx context.Context, iso sql.IsolationLevel, fn func(tx *sqlx.Tx) error) error {
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: iso})
	if err != nil {
		return translate(err)
	}
	if err := fn(tx); err != nil {
		// Always roll back ourselves: 1213 rolled the transaction back already, but 1205
		// rolled back only the statement and leaves locks held until we end it.
		_ = tx.Rollback()
		return translate(txDone(ctx, err))
	}
	if err := tx.Commit(); err != nil {
		return commitError(ctx, err)
	}
	return nil
}

// commitError translates an error of COMMIT itself. A lost connection leaves the
// outcome unknown; so does 1180 on Galera, where the node lost the primary component
// while the commit was in flight and the others may have certified the write set.
func commitError(ctx context.Context, err error) error {
	var me *mysql.MySQLError
	switch {
	case isConnLost(err):
		storeErrors.WithLabelValues("commit_unknown").Inc()
		return fmt.Errorf("%w: %v", ErrCommitUnknown, err)
	case errors.As(err, &me) && me.Number == errErrorDuringCommit:
		storeErrors.WithLabelValues(strconv.Itoa(int(me.Number))).Inc()
		storeErrors.WithLabelValues("commit_unknown").Inc()
		return fmt.Errorf("%w (%w: mysql %d: %s)", ErrCommitUnknown, ErrNotPrimary, me.Number, me.Message)
	}
	return translate(txDone(ctx, err))
}

// withTxRetry is withTx for a transaction whose fn can run again from the start (it
// keeps nothing from a run but what it assigns): one the server aborted is run again,
// up to three times, before its ErrLostRace is the answer. A decision on an operation
// locks the rows it reads, so a real concurrent change shows on the next run as the
// state it left (ErrStale, or the same decision already made); measured on Galera,
// approvals in flight when the node left the primary component were aborted with 1213
// and answered 409 stale although nothing had changed them.
func (s *Store) withTxRetry(ctx context.Context, iso sql.IsolationLevel, fn func(tx *sqlx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := s.withTx(ctx, iso, fn)
		if err == nil || !errors.Is(err, ErrTxAborted) || attempt == 3 || ctx.Err() != nil {
			return err
		}
	}
}

// txDone reports sql.ErrTxDone as the context's error once the context has ended.
// database/sql rolls a transaction back by itself when its context is cancelled, so a
// cancel that lands after the last statement makes Commit answer ErrTxDone: the
// transaction was cancelled, not failed, and callers must see context.Canceled to
// treat it as the shutdown (or abandoned step) it is rather than log it as an error.
func txDone(ctx context.Context, err error) error {
	if errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// translate maps driver errors to domain errors, keeping the original wrapped for logs.
// It is idempotent: translating an already translated error changes nothing.
// Its complexity is the table of server error numbers, kept in one place on purpose:
// it is the only place driver errors are read.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrLostRace) || errors.Is(err, ErrDuplicate) ||
		errors.Is(err, ErrCommitUnknown) || errors.Is(err, errRollback) ||
		errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrUnavailable) {
		return err
	}
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		storeErrors.WithLabelValues(strconv.Itoa(int(me.Number))).Inc()
		switch me.Number {
		case errDupEntry:
			return fmt.Errorf("%w: %s", ErrDuplicate, me.Message)
		case errLockDeadlock:
			return fmt.Errorf("%w (%w: mysql %d: %s)", ErrLostRace, ErrTxAborted, me.Number, me.Message)
		case errRecordChangedRR, errLockWaitTimeout:
			return fmt.Errorf("%w (mysql %d: %s)", ErrLostRace, me.Number, me.Message)
		case errNotPrimaryCom, errErrorDuringCommit, errReadOnly:
			return fmt.Errorf("%w (mysql %d: %s)", ErrNotPrimary, me.Number, me.Message)
		case errTxInProgress:
			// A connection back in the pool inside a transaction its ROLLBACK could not
			// end (measured on a Galera node that had left the primary component): nothing
			// ran; the failover closes such connections.
			return fmt.Errorf("%w (mysql %d: %s)", ErrUnavailable, me.Number, me.Message)
		}
		return err
	}
	if isConnLost(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		// Not at COMMIT (withTx and exec1 read those first): the server ends the
		// transaction of a lost connection with a rollback.
		storeErrors.WithLabelValues("conn_lost").Inc()
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		storeErrors.WithLabelValues("0").Inc()
	}
	return err
}

// IsDuplicate reports whether err is (or wraps) a duplicate-key error. Use it inside a
// transaction to read a 1062 as an answer; the transaction can go on (docs/ARCHITECTURE.md, "Database facts").
func isDuplicate(err error) bool { return errors.Is(translate(err), ErrDuplicate) }

func isConnLost(err error) bool {
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne)
}

// IsDBError reports whether err came from the database or the connection to it (a
// server error, a broken or invalid connection) rather than from a decision of the
// store. Callers outside store use it to label errors without seeing the driver.
func IsDBError(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn)
}

// mustAffect turns a guarded write's affected-row count into ErrLostRace when it is not
// the expected number.
func mustAffect(res sql.Result, want int64) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n != want {
		return ErrLostRace
	}
	return nil
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
