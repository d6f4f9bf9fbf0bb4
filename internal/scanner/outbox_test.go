package scanner

// The outbox loop against real HTTP receivers on 127.0.0.1 that verify the signature
// the way the README tells a receiver to, and the real database: a crash between the
// commit and the delivery still delivers; a dispatcher abandoned mid-delivery loses
// nothing and keeps its delivery id; a receiver down for a while gets everything
// after, one operation's events in order; a receiver holding the wrong secret never
// accepts an event; three racing dispatchers deliver each event once per receiver.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// testReceiver is an event receiver as the README describes one: it verifies
// X-Batcherd-Signature over the raw body with its secret (401 otherwise), checks the
// headers against the body, and keeps each accepted event once by id (counting
// repeats). down makes it answer 503 without looking.
type testReceiver struct {
	t      *testing.T
	secret []byte
	srv    *httptest.Server
	down   atomic.Bool
	flaky  atomic.Int32 // answer 503 to every n-th request (0: never)

	mu        sync.Mutex
	requests  int
	refused   int // signature did not verify
	order     []receivedEvent
	seen      map[string]int      // event id → accepted deliveries
	deliverys map[string][]string // event id → X-Batcherd-Delivery of every request (accepted or not)
	firstAt   map[string]time.Time
}

type receivedEvent struct {
	ID         string `json:"id"`
	Type       string `json:"type"`
	OccurredAt string `json:"occurred_at"`
	Operation  *struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"operation"`
	Batch *struct {
		ID     int64  `json:"id"`
		Status string `json:"status"`
	} `json:"batch"`
}

func (e receivedEvent) key() string {
	if e.Operation != nil {
		return e.Operation.ID
	}
	return fmt.Sprint("batch:", e.Batch.ID)
}

func newTestReceiver(t *testing.T, secret string) *testReceiver {
	r := &testReceiver{t: t, secret: []byte(secret), seen: map[string]int{}, deliverys: map[string][]string{}, firstAt: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *testReceiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	var ev struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &ev)
	r.deliverys[ev.ID] = append(r.deliverys[ev.ID], req.Header.Get("X-Batcherd-Delivery"))
	if r.down.Load() || (r.flaky.Load() > 0 && r.requests%int(r.flaky.Load()) == 0) {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	// What the README's receiver does: HMAC-SHA256 of the raw body, constant-time compare.
	mac := hmac.New(sha256.New, r.secret)
	mac.Write(body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(want), []byte(req.Header.Get("X-Batcherd-Signature"))) {
		r.refused++
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var full receivedEvent
	if err := json.Unmarshal(body, &full); err != nil || full.ID == "" || full.OccurredAt == "" ||
		req.Header.Get("X-Batcherd-Event") != full.Type || req.Header.Get("X-Batcherd-Delivery") != full.ID ||
		(full.Operation == nil) == (full.Batch == nil) {
		r.t.Errorf("malformed event: headers %v body %s (%v)", req.Header, body, err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	r.seen[full.ID]++
	if r.seen[full.ID] == 1 {
		r.order = append(r.order, full)
		r.firstAt[full.ID] = time.Now()
	}
	w.WriteHeader(http.StatusNoContent)
}

// accepted returns the distinct events accepted, in order of first acceptance, and
// how many accepted deliveries were repeats.
func (r *testReceiver) accepted() ([]receivedEvent, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	dups := 0
	for _, n := range r.seen {
		dups += n - 1
	}
	return slices.Clone(r.order), dups
}

// byKey groups r's accepted events' types per operation (or batch), in arrival order.
func (r *testReceiver) byKey() map[string][]string {
	evs, _ := r.accepted()
	out := map[string][]string{}
	for _, e := range evs {
		out[e.key()] = append(out[e.key()], e.Type)
	}
	return out
}

// outboxEnv is a database with event receivers configured and a helper to make events.
type outboxEnv struct {
	t   *testing.T
	st  *store.Store
	dsn string
	rs  []domain.EventReceiver // what the writing replica's BATCHERD_EVENTS_URL says
}

func newOutboxEnv(t *testing.T, urls ...string) *outboxEnv {
	st, dsn := storetest.New(t)
	e := &outboxEnv{t: t, st: st, dsn: dsn, rs: receiversOf(t, urls...)}
	st.SetEventReceivers(ids(e.rs))
	return e
}

// receiversOf parses urls as BATCHERD_EVENTS_URL entries.
func receiversOf(t *testing.T, urls ...string) []domain.EventReceiver {
	t.Helper()
	rs, errs := domain.ParseEventReceivers(urls)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	return rs
}

func ids(rs []domain.EventReceiver) []int64 {
	var out []int64
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

// lifecycle makes n auto-approved operations of repo (queued events), claims them into
// one batch (opened) and settles it succeeded (succeeded, merged): 2n+2 events per
// receiver, each operation's queued before its merged.
func (e *outboxEnv) lifecycle(repo string, n int) []string {
	e.t.Helper()
	ctx := context.Background()
	ids := make([]string, n)
	for i := range n {
		op, _, err := e.st.OperationCreate(ctx, store.OperationCreateParams{OperationID: uuid.NewString(),
			Subject: fmt.Sprintf("%s-user-%d", repo, i), Target: "db/events", Repo: repo, Action: domain.ActionGrant,
			AutoApprove: true, RequestedBy: "alice"})
		if err != nil {
			e.t.Fatal(err)
		}
		ids[i] = op.OperationID
	}
	res, err := e.st.BatchClaim(ctx, repo, n)
	if err != nil || res.Outcome != store.ClaimClaimed {
		e.t.Fatalf("claim: %+v %v", res, err)
	}
	if _, err := e.st.BatchSettleSucceeded(ctx, res.BatchID, domain.BatchRunning, 1); err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// dispatcher is one replica's outbox loop on its own store handle (pool).
func (e *outboxEnv) dispatcher(name string, urls []string, secret string, mut func(*Config)) *Scanner {
	cfg := Config{ReplicaID: name, EventReceivers: receiversOf(e.t, urls...), EventSecret: secret, OutboxInterval: 20 * time.Millisecond,
		OutboxTimeout: 2 * time.Second, OutboxLease: 3 * time.Second, OutboxBackoffBase: 20 * time.Millisecond,
		OutboxBackoffMax: 200 * time.Millisecond, StartJitter: 10 * time.Millisecond,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, ShutdownTimeout: 2 * time.Second}
	if mut != nil {
		mut(&cfg)
	}
	st := storetest.Open(e.t, e.dsn, 8)
	return New(cfg, st, nil, testLogger(), prometheus.NewRegistry())
}

// undelivered counts rows not yet delivered.
func (e *outboxEnv) undelivered() int {
	e.t.Helper()
	var n int
	if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM event_outbox WHERE delivered_at IS NULL"); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *outboxEnv) events() int {
	e.t.Helper()
	var n int
	if err := e.st.DB().Get(&n, "SELECT COUNT(DISTINCT event_id) FROM event_outbox"); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// passesUntil runs s's outbox passes until cond holds (or fails the test after within).
func passesUntil(t *testing.T, s *Scanner, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not done after %s", within)
		}
		_ = s.outbox.runOnce(context.Background())
		time.Sleep(10 * time.Millisecond)
	}
}

// inOrder checks each operation's events arrived queued → merged and each batch's
// opened → succeeded, every one exactly once.
func inOrder(t *testing.T, who string, r *testReceiver, ops []string, batches int) {
	t.Helper()
	got := r.byKey()
	for _, id := range ops {
		if strings.Join(got[id], ",") != "operation.queued,operation.merged" {
			t.Fatalf("%s: events of operation %s arrived as %v", who, id, got[id])
		}
	}
	nb := 0
	for k, v := range got {
		if strings.HasPrefix(k, "batch:") {
			nb++
			if strings.Join(v, ",") != "batch.opened,batch.succeeded" {
				t.Fatalf("%s: events of %s arrived as %v", who, k, v)
			}
		}
	}
	if nb != batches {
		t.Fatalf("%s: %d batches reported, want %d", who, nb, batches)
	}
}

// A receiver down for a while gets everything after, each operation's events in order,
// while the other receiver is not held up; a receiver with the wrong secret accepts
// nothing; a flaky receiver still gets every event in order.
func TestOutboxReceiverDownThenUp(t *testing.T) {
	const secret = "s3cret-for-events"
	up, down, wrong, flaky := newTestReceiver(t, secret), newTestReceiver(t, secret), newTestReceiver(t, "not-the-secret"), newTestReceiver(t, secret)
	down.down.Store(true)
	flaky.flaky.Store(3)
	urls := []string{up.srv.URL, down.srv.URL, wrong.srv.URL, flaky.srv.URL}
	e := newOutboxEnv(t, urls...)
	s := e.dispatcher("r1", urls, secret, nil)

	var ops []string
	for i := range 3 {
		ops = append(ops, e.lifecycle(fmt.Sprintf("grp/repo%d", i), 12)...)
	}
	total := e.events()
	if total != 3*(2*12+2) {
		t.Fatalf("%d events written, want %d", total, 3*(2*12+2))
	}
	passesUntil(t, s, 30*time.Second, func() bool {
		a, _ := up.accepted()
		f, _ := flaky.accepted()
		return len(a) == total && len(f) == total
	})
	if a, _ := down.accepted(); len(a) != 0 {
		t.Fatalf("a receiver that is down accepted %d", len(a))
	}
	// While it is down only each operation's first event is tried: nothing jumps ahead.
	down.mu.Lock()
	tried := len(down.deliverys)
	down.mu.Unlock()
	if tried > 3*12+3 {
		t.Fatalf("receiver down: %d distinct events tried, more than the %d heads of the queue", tried, 3*12+3)
	}
	if f := testutil.ToFloat64(s.m.eventFailures.WithLabelValues(e.rs[1].Label)); f == 0 {
		t.Fatal("no delivery failure counted for the receiver that is down")
	}
	s.outbox.sample(context.Background())
	if d := testutil.ToFloat64(s.m.outboxDepth.WithLabelValues(e.rs[1].Label)); d != float64(total) {
		t.Fatalf("depth of the receiver that is down = %v, want %d", d, total)
	}
	if d := testutil.ToFloat64(s.m.outboxDepth.WithLabelValues(e.rs[0].Label)); d != 0 {
		t.Fatalf("depth of the receiver that is up = %v, want 0", d)
	}

	down.down.Store(false)
	passesUntil(t, s, 30*time.Second, func() bool { a, _ := down.accepted(); return len(a) == total })
	for name, r := range map[string]*testReceiver{"up": up, "down then up": down, "flaky": flaky} {
		inOrder(t, name, r, ops, 3)
		if _, dups := r.accepted(); dups != 0 {
			t.Fatalf("%s: %d duplicate deliveries without any crash", name, dups)
		}
	}
	// The wrong secret: every try refused (401), never accepted, and the rows wait.
	wrong.mu.Lock()
	refused, acceptedWrong := wrong.refused, len(wrong.order)
	wrong.mu.Unlock()
	if refused == 0 || acceptedWrong != 0 {
		t.Fatalf("receiver with another secret: refused %d, accepted %d", refused, acceptedWrong)
	}
	var waiting int
	if err := e.st.DB().Get(&waiting, "SELECT COUNT(*) FROM event_outbox WHERE receiver = ? AND delivered_at IS NULL", e.rs[2].ID); err != nil || waiting != total {
		t.Fatalf("receiver 2 undelivered = %d, %v; want %d", waiting, err, total)
	}
	var lastErr string
	if err := e.st.DB().Get(&lastErr, "SELECT last_error FROM event_outbox WHERE receiver = ? AND attempts > 0 LIMIT 1", e.rs[2].ID); err != nil ||
		!strings.Contains(lastErr, "401") || strings.Contains(lastErr, wrong.srv.URL) {
		t.Fatalf("last_error = %q, %v: want the status, never the URL", lastErr, err)
	}
}

// A crash between the commit and the delivery: the changes committed and no
// dispatcher ran in that replica; one replica then dies after reserving (before the
// POST), another after the POST (before recording it). A replica started afterwards
// delivers every event, the re-sent ones with the same X-Batcherd-Delivery.
func TestOutboxCrashBetweenCommitAndDelivery(t *testing.T) {
	const secret = "k"
	r := newTestReceiver(t, secret)
	e := newOutboxEnv(t, r.srv.URL)
	ops := e.lifecycle("grp/crash", 30) // committed; nothing delivered yet
	total := e.events()

	for _, step := range []string{"outbox_reserved", "outbox_posted"} {
		a := e.dispatcher("crash-"+step, []string{r.srv.URL}, secret, func(c *Config) { c.OutboxLease = 2500 * time.Millisecond })
		ctx, cancel := context.WithCancel(context.Background())
		var hit atomic.Int32
		a.testHook = func(_ context.Context, s string, _ int64) {
			if s == step && hit.Add(1) >= 5 {
				cancel() // the replica dies here: everything in flight is abandoned
			}
		}
		_ = a.outbox.runOnce(ctx)
		cancel()
		if hit.Load() < 5 {
			t.Fatalf("%s: the crash point was reached %d times", step, hit.Load())
		}
	}
	if a, _ := r.accepted(); len(a) >= total {
		t.Fatalf("the crashed replicas delivered everything (%d): the crash proved nothing", len(a))
	}
	b := e.dispatcher("b", []string{r.srv.URL}, secret, nil)
	start := time.Now()
	passesUntil(t, b, 30*time.Second, func() bool { return e.undelivered() == 0 })
	t.Logf("after the crashes the second replica finished in %s (leases of 2.5 s ran out first)", time.Since(start).Round(time.Millisecond))
	inOrder(t, "receiver", r, ops, 1)
	_, dups := r.accepted()
	if dups == 0 {
		t.Fatal("no event was delivered twice although a replica died after its POST: the crash point was not exercised")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, ds := range r.deliverys {
		for _, d := range ds {
			if d != id {
				t.Fatalf("event %s was delivered as %v: X-Batcherd-Delivery must be the event id on every try", id, ds)
			}
		}
	}
}

// Three replicas' dispatchers racing over the same outbox deliver each event once per
// receiver (no crash, so no duplicate), in order, and purge the delivered rows in
// chunks. Reports throughput and commit-to-receipt latency.
func TestOutboxRacingDispatchers(t *testing.T) {
	const secret = "race"
	r0, r1 := newTestReceiver(t, secret), newTestReceiver(t, secret)
	urls := []string{r0.srv.URL, r1.srv.URL}
	e := newOutboxEnv(t, urls...)
	var ops []string
	for i := range 4 {
		ops = append(ops, e.lifecycle(fmt.Sprintf("grp/race%d", i), 30)...)
	}
	total := e.events()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var ss []*Scanner
	for i := range 3 {
		s := e.dispatcher(fmt.Sprint("d", i), urls, secret, func(c *Config) {
			c.OutboxRetention, c.OutboxPurgeInterval, c.CleanupChunk = time.Nanosecond, time.Nanosecond, 7
			c.ScanLimit = 50
		})
		ss = append(ss, s)
	}
	start := time.Now()
	for _, s := range ss {
		wg.Go(func() {
			s.runLoop(ctx, ctx, loopSpec{name: "outbox", run: s.outbox.runOnce, every: 10 * time.Millisecond, kick: s.kickOutbox})
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		a0, _ := r0.accepted()
		a1, _ := r1.accepted()
		if len(a0) == total && len(a1) == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d and %d of %d", len(a0), len(a1), total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("3 dispatchers delivered %d events to 2 receivers (%d POSTs) in %s: %.0f deliveries/s",
		total, 2*total, took.Round(time.Millisecond), float64(2*total)/took.Seconds())
	for name, r := range map[string]*testReceiver{"receiver 0": r0, "receiver 1": r1} {
		inOrder(t, name, r, ops, 4)
		if _, dups := r.accepted(); dups != 0 {
			t.Fatalf("%s: %d duplicates from racing dispatchers without a crash", name, dups)
		}
	}
	// The purge (retention ~0, chunks of 7) empties the table of delivered rows, each
	// deleted once across the three replicas.
	purged := func() int {
		n := 0.0
		for _, s := range ss {
			n += testutil.ToFloat64(s.m.outcomes.WithLabelValues("outbox", "events_purged"))
		}
		return int(n)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		var n int
		if err := e.st.DB().Get(&n, "SELECT COUNT(*) FROM event_outbox"); err != nil {
			t.Fatal(err)
		}
		if n == 0 && purged() >= 2*total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d delivered rows not purged (purged %d)", n, purged())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if p := purged(); p != 2*total {
		t.Fatalf("purged %d rows, want %d", p, 2*total)
	}

	// Latency: a fresh change, delivered by a running dispatcher.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	s := ss[0]
	go s.runLoop(ctx2, ctx2, loopSpec{name: "outbox", run: s.outbox.runOnce, every: s.cfg.OutboxInterval, kick: s.kickOutbox})
	var lat []time.Duration
	for i := range 20 {
		committed := time.Now()
		op, _, err := e.st.OperationCreate(context.Background(), store.OperationCreateParams{OperationID: uuid.NewString(),
			Subject: fmt.Sprint("lat-", i), Target: "db/lat", Repo: "grp/lat", Action: domain.ActionGrant, AutoApprove: true, RequestedBy: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		for {
			if got := r0.byKey()[op.OperationID]; len(got) == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(committed))
	}
	slices.Sort(lat)
	t.Logf("commit to receipt with a %s poll: median %s, max %s", s.cfg.OutboxInterval, lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
}

// A receiver keeps its pending events when BATCHERD_EVENTS_URL is reordered, shortened
// or extended (or differs between replicas during a rolling update): a row names its
// receiver by identity, not by position. Before schema v12 a row carried its receiver's
// position, so the list [A, B] → [C, B] sent A's pending events to C. Rows written
// before v12 (small positions) still go to the receiver at that position.
func TestOutboxReceiverIdentityKeepsEventsWithTheirReceiver(t *testing.T) {
	const secret = "ident"
	a, b, c := newTestReceiver(t, secret), newTestReceiver(t, secret), newTestReceiver(t, secret)
	e := newOutboxEnv(t, a.srv.URL, "audit="+b.srv.URL) // the writers' list: [A, audit=B]
	ops := e.lifecycle("grp/ident", 5)
	total := e.events()
	// One row from before v12, for position 0 of whoever delivers it.
	if _, err := e.st.DB().Exec(`INSERT INTO event_outbox (receiver, event_id, type, order_key, operation_json)
		VALUES (0, ?, 'operation.queued', 'legacy-op', '{"id":"legacy-op"}')`, uuid.NewString()); err != nil {
		t.Fatal(err)
	}

	// A replica whose list is reordered, shortened and extended: [C, audit=B'] where B's
	// URL changed but its name did not (a rotated token in the URL, say).
	moved := e.dispatcher("moved", []string{c.srv.URL, "audit=" + b.srv.URL + "/?token=rotated"}, secret, nil)
	passesUntil(t, moved, 30*time.Second, func() bool { got, _ := b.accepted(); return len(got) == total })
	for range 5 { // give misrouting every chance
		_ = moved.outbox.runOnce(context.Background())
	}
	inOrder(t, "the named receiver whose URL changed", b, ops, 1)
	if got, _ := c.accepted(); len(got) != 1 || got[0].ID == "" || got[0].Operation == nil || got[0].Operation.ID != "legacy-op" {
		t.Fatalf("the receiver now at position 0 got %d events (%+v), want only the row written before identities", len(got), got)
	}
	if got, _ := a.accepted(); len(got) != 0 {
		t.Fatalf("A is not in the moved replica's list but got %d events", len(got))
	}
	moved.outbox.sample(context.Background())
	if u := testutil.ToFloat64(moved.m.outboxUnrouted); u != float64(total) {
		t.Fatalf("unrouted = %v, want A's %d pending events", u, total)
	}
	if d := testutil.ToFloat64(moved.m.outboxDepth.WithLabelValues("audit")); d != 0 {
		t.Fatalf("depth of audit = %v, want 0", d)
	}

	// A replica still on the old list (a rolling update) delivers A's events to A.
	old := e.dispatcher("old", []string{a.srv.URL, "audit=" + b.srv.URL}, secret, nil)
	passesUntil(t, old, 30*time.Second, func() bool { return e.undelivered() == 0 })
	inOrder(t, "A, delivered by a replica that still lists it", a, ops, 1)
	if got, _ := b.accepted(); len(got) != total {
		t.Fatalf("audit got %d events after the second replica, want %d (each once)", len(got), total)
	}
}
