package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/api"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// Result is one throughput measurement: a closed loop of Clients workers, each doing
// one request after the other for a fixed time.
type Result struct {
	Name    string
	Clients int
	Ops     int64
	Errors  int64
	Elapsed time.Duration
	Lat     Summary
	Note    string
	// CPU time per operation of this process (the clients, and the store or API when
	// in process) and of the database server, while it ran.
	SelfCPU, ServerCPU time.Duration
}

// Rate is operations per second.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// closedLoop runs fn from clients goroutines until d has passed and records each call.
// fn gets the worker number and the call number within the worker. A call that
// returns an error counts as an error, not as an operation.
func closedLoop(ctx context.Context, clients int, d time.Duration, fn func(ctx context.Context, w, i int) error) Result {
	var ops, errs atomic.Int64
	var lat Latencies
	var firstErr atomic.Value
	self0, srv0 := cpuClock().Now()
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Go(func() {
			local := make([]time.Duration, 0, 4096)
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				t0 := time.Now()
				err := fn(ctx, w, i)
				el := time.Since(t0)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ops.Add(1)
				local = append(local, el)
			}
			lat.Add(local...)
		})
	}
	wg.Wait()
	r := Result{Clients: clients, Ops: ops.Load(), Errors: errs.Load(), Elapsed: time.Since(start), Lat: lat.Summary()}
	self1, srv1 := cpuClock().Now()
	if r.Ops > 0 {
		r.SelfCPU, r.ServerCPU = (self1-self0)/time.Duration(r.Ops), (srv1-srv0)/time.Duration(r.Ops)
	}
	if e, ok := firstErr.Load().(string); ok {
		r.Note = "first error: " + e
	}
	return r
}

var (
	clockMu sync.Mutex
	clock   = &CPUClock{}
)

// MeasureServerCPU makes the throughput measurements read the CPU time of the server
// db talks to (see NewCPUClock).
func MeasureServerCPU(ctx context.Context, db *sql.DB) {
	c := NewCPUClock(ctx, db)
	clockMu.Lock()
	clock = c
	clockMu.Unlock()
}

func cpuClock() *CPUClock {
	clockMu.Lock()
	defer clockMu.Unlock()
	return clock
}

// RawInsert is the ceiling: single-row autocommit INSERTs of operation rows (the same
// columns admission writes there) from a minimal Go loop, one connection per client.
func RawInsert(ctx context.Context, d *DB, clients int, dur time.Duration) (Result, error) {
	db, err := d.Raw(clients)
	if err != nil {
		return Result{}, err
	}
	defer db.Close()
	run := uuid.NewString()[:8]
	r := closedLoop(ctx, clients, dur, func(ctx context.Context, w, i int) error {
		_, err := db.ExecContext(ctx, `INSERT INTO operation (operation_id, subject, target, repo, action, status)
			VALUES (?, ?, ?, ?, ?, ?)`, uuid.NewString(), fmt.Sprintf("raw-%s-%d-%d", run, w, i), "db/bench", "bench/raw", "grant", "queued")
		return err
	})
	r.Name = "raw INSERT (Go loop)"
	return r, nil
}

var slapSeconds = regexp.MustCompile(`Average number of seconds to run all queries: ([0-9.]+) seconds`)

// SlapAvailable reports whether mariadb-slap is installed.
func SlapAvailable() bool { _, err := exec.LookPath("mariadb-slap"); return err == nil }

// Slap runs mariadb-slap with the same single-row INSERT (UUID() for the unique
// columns), total queries spread over clients connections.
func Slap(ctx context.Context, d *DB, clients, total int) (Result, error) {
	cfg, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		return Result{}, err
	}
	host, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return Result{}, err
	}
	q := "INSERT INTO operation (operation_id, subject, target, repo, action, status) VALUES (UUID(), UUID(), 'db/bench', 'bench/slap', 'grant', 'queued')"
	cmd := exec.CommandContext(ctx, "mariadb-slap", "--protocol=tcp", "-h", host, "-P", port, "-u", cfg.User, "-p"+cfg.Passwd,
		"--create-schema="+d.Name, "--concurrency="+strconv.Itoa(clients), "--number-of-queries="+strconv.Itoa(total),
		"--iterations=1", "--query="+q)
	_, srv0 := cpuClock().Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return Result{}, fmt.Errorf("mariadb-slap: %v: %s", err, out)
	}
	_, srv1 := cpuClock().Now()
	m := slapSeconds.FindSubmatch(out)
	if m == nil {
		return Result{}, fmt.Errorf("mariadb-slap: no timing in output: %s", out)
	}
	sec, _ := strconv.ParseFloat(string(m[1]), 64)
	return Result{Name: "raw INSERT (mariadb-slap)", Clients: clients, Ops: int64(total),
		Elapsed: time.Duration(sec * float64(time.Second)), ServerCPU: (srv1 - srv0) / time.Duration(total)}, nil
}

// AdmissionParams is one admission as the API makes it: a fresh relation, auto-approved
// (so it also enters the waiting set), with an Idempotency-Key.
func AdmissionParams(repo, subject string) store.OperationCreateParams {
	return store.OperationCreateParams{
		OperationID: uuid.NewString(), Subject: subject, Target: "db/bench", Repo: repo, Action: domain.ActionGrant,
		AutoApprove: true, IdempotencyKey: "k-" + subject, Fingerprint: fmt.Sprintf("%064d", 0), IdempotencyTTL: time.Hour,
		RequestedBy: "bench-requester",
	}
}

// StoreAdmission measures OperationCreate on st in the given mode.
func StoreAdmission(ctx context.Context, st *store.Store, mode AdmitMode, clients int, dur time.Duration) Result {
	return StoreAdmissionWith(ctx, st, mode, mode.Options(clients), clients, dur)
}

// StoreAdmissionWith measures admission in the given mode on st with the given
// admission options.
func StoreAdmissionWith(ctx context.Context, st *store.Store, mode AdmitMode, o store.AdmitOptions, clients int, dur time.Duration) Result {
	st.SetAdmitOptions(o)
	run := uuid.NewString()[:8]
	before := st.AdmitStats()
	r := closedLoop(ctx, clients, dur, func(ctx context.Context, w, i int) error {
		_, created, err := mode.Create(ctx, st, AdmissionParams("bench/store", fmt.Sprintf("st-%s-%d-%d", run, w, i)))
		if err == nil && !created {
			err = errors.New("not created")
		}
		return err
	})
	r.Name = "store OperationCreate (" + mode.String() + ")"
	r.Note = joinNote(r.Note, groupNote(before, st.AdmitStats()))
	return r
}

func groupNote(before, after store.AdmitStats) string {
	g, n := after.Groups-before.Groups, after.Grouped-before.Grouped
	if g == 0 {
		return ""
	}
	return fmt.Sprintf("%.1f requests/group, %d group fallbacks", float64(n)/float64(g), after.Fallbacks-before.Fallbacks)
}

func joinNote(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// APIServer is the HTTP API over a store, on a loopback port.
type APIServer struct {
	URL   string
	srv   *httptest.Server
	Token string
}

// NewAPIServer serves the API (auto-approve on, one repository per name in repos).
func NewAPIServer(st api.Store, repos ...string) (*APIServer, error) {
	h, err := api.New(api.Config{APITokens: []string{"bench-token"}, Repos: repos, AutoApprove: true},
		api.Deps{Store: st, Registry: prometheus.NewRegistry()})
	if err != nil {
		return nil, err
	}
	srv := httptest.NewServer(h)
	return &APIServer{URL: srv.URL, srv: srv, Token: "bench-token"}, nil
}

// Close stops the server.
func (a *APIServer) Close() { a.srv.Close() }

// APIClient posts admissions with keep-alive connections.
type APIClient struct {
	base, token string
	http        *http.Client
}

// NewAPIClient returns a client for up to conns concurrent requests.
func NewAPIClient(base, token string, conns int) *APIClient {
	return &APIClient{base: base, token: token, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, IdleConnTimeout: time.Minute}}}
}

// Close closes idle connections.
func (c *APIClient) Close() { c.http.CloseIdleConnections() }

// Admit posts one grant with an Idempotency-Key and returns the HTTP status.
func (c *APIClient) Admit(ctx context.Context, repo, subject string) (int, error) {
	body := `{"subject":` + strconv.Quote(subject) + `,"target":"db/bench","action":"grant","repo":` + strconv.Quote(repo) + `}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/operations", bytes.NewBufferString(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k-"+url.PathEscape(subject))
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return resp.StatusCode, fmt.Errorf("POST /v1/operations: %d %s", resp.StatusCode, b)
	}
	return resp.StatusCode, nil
}

// APIAdmission measures POST /v1/operations through a loopback HTTP server whose store
// admits in the given mode.
func APIAdmission(ctx context.Context, st *store.Store, mode AdmitMode, clients int, dur time.Duration) (Result, error) {
	srv, err := NewAPIServer(mode.Use(st, clients), "bench/api")
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()
	cl := NewAPIClient(srv.URL, srv.Token, clients)
	defer cl.Close()
	run := uuid.NewString()[:8]
	before := st.AdmitStats()
	r := closedLoop(ctx, clients, dur, func(ctx context.Context, w, i int) error {
		_, err := cl.Admit(ctx, "bench/api", fmt.Sprintf("api-%s-%d-%d", run, w, i))
		return err
	})
	r.Name = "HTTP API POST /v1/operations (" + mode.String() + ")"
	r.Note = joinNote(r.Note, groupNote(before, st.AdmitStats()))
	return r, nil
}

// countRows counts a table's rows (fixtures, sanity checks).
func countRows(ctx context.Context, db *sql.DB, q string, args ...any) (int64, error) {
	var n int64
	err := db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}
