package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

const testRepo = "platform/access"

func grant(subject, target string) store.OperationCreateParams {
	return store.OperationCreateParams{
		OperationID: uuid.NewString(), Subject: subject, Target: target, Repo: testRepo, Action: store.ActionGrant,
	}
}

func mustCreate(t *testing.T, st *store.Store, p store.OperationCreateParams) store.Operation {
	t.Helper()
	op, created, err := st.OperationCreate(context.Background(), p)
	if err != nil || !created {
		t.Fatalf("OperationCreate(%s %s→%s): created=%v err=%v", p.Action, p.Subject, p.Target, created, err)
	}
	return op
}

func bindingOf(t *testing.T, st *store.Store, subject, target string) store.Binding {
	t.Helper()
	bs, err := st.BindingList(context.Background(), subject, target, 10)
	if err != nil || len(bs) != 1 {
		t.Fatalf("BindingList(%s, %s) = %v, %v; want one", subject, target, bs, err)
	}
	return bs[0]
}

func waitingRows(t *testing.T, st *store.Store, operationID string) int {
	t.Helper()
	var n int
	if err := st.DB().Get(&n, `SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ? AND batch_id IS NULL`, operationID); err != nil {
		t.Fatal(err)
	}
	return n
}

// setState forces a binding (and optionally its operation) into a state the batch
// side would produce (settlement), so this file's tests do not depend on it.
func setState(t *testing.T, st *store.Store, op store.Operation, opStatus store.OpStatus, bStatus store.BindingStatus) {
	t.Helper()
	if _, err := st.DB().Exec(`UPDATE operation SET status = ?, version = version + 1 WHERE operation_id = ?`, opStatus, op.OperationID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec(`UPDATE binding SET status = ?, version = version + 1 WHERE subject = ? AND target = ?`, bStatus, op.Subject, op.Target); err != nil {
		t.Fatal(err)
	}
}

func TestOperationGrantApproveFlow(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	p := grant("alice", "db/prod")
	p.Attributes = json.RawMessage(`{"ticket":"OPS-1"}`)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	p.ExpiresAt = &exp
	op := mustCreate(t, st, p)
	if op.Status != store.OpPendingApproval || op.Repo != testRepo || op.ExpiresAt == nil || !op.ExpiresAt.Equal(exp) {
		t.Fatalf("created op = %+v", op)
	}
	var attrs map[string]string
	if err := json.Unmarshal(op.Attributes, &attrs); err != nil || attrs["ticket"] != "OPS-1" {
		t.Fatalf("attributes = %s (%v)", op.Attributes, err)
	}
	b := bindingOf(t, st, "alice", "db/prod")
	if b.Status != store.BindingPending || b.OperationID != op.OperationID {
		t.Fatalf("binding = %+v", b)
	}
	if waitingRows(t, st, op.OperationID) != 0 {
		t.Fatal("pending_approval operation must not be waiting")
	}

	got, err := st.OperationApprove(ctx, op.OperationID)
	if err != nil || got.Status != store.OpQueued {
		t.Fatalf("approve: %+v %v", got, err)
	}
	if waitingRows(t, st, op.OperationID) != 1 {
		t.Fatal("approved operation not admitted")
	}
	// A repeat of the same decision changes nothing.
	again, err := st.OperationApprove(ctx, op.OperationID)
	if err != nil || again.Version != got.Version || again.Status != store.OpQueued {
		t.Fatalf("repeat approve: %+v %v (first %+v)", again, err, got)
	}
	if waitingRows(t, st, op.OperationID) != 1 {
		t.Fatal("repeat approve admitted twice")
	}
	// The opposite decision is stale.
	if _, err := st.OperationReject(ctx, op.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("reject after approve: %v, want ErrStale", err)
	}
	// Unknown ids.
	if _, err := st.OperationApprove(ctx, uuid.NewString()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("approve unknown: %v", err)
	}
	if _, err := st.OperationGet(ctx, uuid.NewString()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get unknown: %v", err)
	}
	evs, err := st.OperationEvents(ctx, op.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, e := range evs {
		codes = append(codes, e.Code)
	}
	want := []string{store.EventCreated, store.EventApproved, store.EventAdmitted}
	if len(codes) != len(want) || codes[0] != want[0] || codes[1] != want[1] || codes[2] != want[2] {
		t.Fatalf("events = %v, want %v", codes, want)
	}
	if _, err := st.OperationEvents(ctx, uuid.NewString()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("events of unknown op: %v", err)
	}
	v, err := st.OperationGetView(ctx, op.OperationID)
	if err != nil || v.MRURL != "" || v.OperationID != op.OperationID {
		t.Fatalf("view: %+v %v", v, err)
	}
	counts, err := st.OperationCounts(ctx)
	if err != nil || counts[store.OpQueued] != 1 || counts[store.OpMerged] != 0 {
		t.Fatalf("counts: %v %v", counts, err)
	}
}

func TestOperationAutoApproveAndReject(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	p := grant("bob", "db/prod")
	p.AutoApprove = true
	op := mustCreate(t, st, p)
	if op.Status != store.OpQueued || waitingRows(t, st, op.OperationID) != 1 {
		t.Fatalf("auto-approved op = %+v", op)
	}

	q := grant("carol", "db/prod")
	op2 := mustCreate(t, st, q)
	rej, err := st.OperationReject(ctx, op2.OperationID)
	if err != nil || rej.Status != store.OpRejected {
		t.Fatalf("reject: %+v %v", rej, err)
	}
	if b := bindingOf(t, st, "carol", "db/prod"); b.Status != store.BindingRejected {
		t.Fatalf("binding after reject = %s", b.Status)
	}
	if again, err := st.OperationReject(ctx, op2.OperationID); err != nil || again.Version != rej.Version {
		t.Fatalf("repeat reject: %+v %v", again, err)
	}
	if _, err := st.OperationApprove(ctx, op2.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("approve after reject: %v, want ErrStale", err)
	}
}

func TestOperationExpiresInPast(t *testing.T) {
	st, _ := storetest.New(t)
	p := grant("dave", "x")
	past := time.Now().Add(-time.Minute)
	p.ExpiresAt = &past
	if _, _, err := st.OperationCreate(context.Background(), p); !errors.Is(err, store.ErrExpiresInPast) {
		t.Fatalf("err = %v, want ErrExpiresInPast", err)
	}
	if bs, _ := st.BindingList(context.Background(), "dave", "", 10); len(bs) != 0 {
		t.Fatal("refused application wrote a binding")
	}
}

// I5: one row per relation; concurrent re-applications of one rejected binding →
// exactly one wins.
func TestI5ConcurrentReapplication(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	first := mustCreate(t, st, grant("erin", "db/prod"))
	if _, err := st.OperationReject(ctx, first.OperationID); err != nil {
		t.Fatal(err)
	}
	before := bindingOf(t, st, "erin", "db/prod")

	const n = 16
	var wg sync.WaitGroup
	var mu sync.Mutex
	var winners []string
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p := grant("erin", "db/prod")
			_, created, err := st.OperationCreate(ctx, p)
			switch {
			case err == nil && created:
				mu.Lock()
				winners = append(winners, p.OperationID)
				mu.Unlock()
			case errors.Is(err, store.ErrBindingBusy), errors.Is(err, store.ErrLostRace):
			default:
				t.Errorf("unexpected result: created=%v err=%v", created, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(winners) != 1 {
		t.Fatalf("%d winners, want exactly 1", len(winners))
	}
	after := bindingOf(t, st, "erin", "db/prod")
	if after.ID != before.ID || after.OperationID != winners[0] || after.Status != store.BindingPending || after.Version != before.Version+1 {
		t.Fatalf("binding before %+v after %+v winner %s", before, after, winners[0])
	}
	var ops int
	if err := st.DB().Get(&ops, `SELECT COUNT(*) FROM operation WHERE subject = 'erin'`); err != nil || ops != 2 {
		t.Fatalf("operations for the relation = %d (%v), want 2 (the rejected one and the winner)", ops, err)
	}
}

// I5: only rejected and closed bindings are re-appliable; revoke needs active.
func TestI5ApplicationsRefused(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	cases := []struct {
		binding    store.BindingStatus
		grantErr   error
		revokeErr  error
		grantOK    bool
		revokeOK   bool
		opStatusAt store.OpStatus
	}{
		{store.BindingPending, store.ErrBindingBusy, store.ErrBindingBusy, false, false, store.OpPendingApproval},
		{store.BindingActive, store.ErrBindingActive, nil, false, true, store.OpMerged},
		{store.BindingRevoking, store.ErrBindingBusy, store.ErrBindingBusy, false, false, store.OpPendingApproval},
		{store.BindingFailed, store.ErrBindingBusy, store.ErrBindingBusy, false, false, store.OpFailed},
		{store.BindingRejected, nil, store.ErrBindingNotActive, true, false, store.OpRejected},
		{store.BindingClosed, nil, store.ErrBindingNotActive, true, false, store.OpMerged},
	}
	for _, c := range cases {
		t.Run(string(c.binding), func(t *testing.T) {
			subject := "s-" + string(c.binding)
			op := mustCreate(t, st, grant(subject, "t"))
			setState(t, st, op, c.opStatusAt, c.binding)
			before := bindingOf(t, st, subject, "t")

			g := grant(subject, "t")
			_, _, err := st.OperationCreate(ctx, g)
			if c.grantOK != (err == nil) || (!c.grantOK && !errors.Is(err, c.grantErr)) {
				t.Fatalf("grant on %s: %v, want ok=%v err=%v", c.binding, err, c.grantOK, c.grantErr)
			}
			if !c.grantOK {
				if after := bindingOf(t, st, subject, "t"); after != before {
					t.Fatalf("refused grant changed the binding: %+v → %+v", before, after)
				}
				if _, err := st.OperationGet(ctx, g.OperationID); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("refused grant left an operation: %v", err)
				}
			}
			// Revoke against the original state.
			setState(t, st, op, c.opStatusAt, c.binding)
			before = bindingOf(t, st, subject, "t")
			r := grant(subject, "t")
			r.Action = store.ActionRevoke
			r.Repo = "some/other-repo" // a revoke goes where the file is
			rop, _, err := st.OperationCreate(ctx, r)
			if c.revokeOK != (err == nil) || (!c.revokeOK && !errors.Is(err, c.revokeErr)) {
				t.Fatalf("revoke on %s: %v, want ok=%v err=%v", c.binding, err, c.revokeOK, c.revokeErr)
			}
			after := bindingOf(t, st, subject, "t")
			if c.revokeOK {
				if rop.Repo != testRepo || after.Status != store.BindingRevoking || after.OperationID != rop.OperationID {
					t.Fatalf("revoke: op %+v binding %+v", rop, after)
				}
			} else if after != before {
				t.Fatalf("refused revoke changed the binding: %+v → %+v", before, after)
			}
		})
	}
	if _, _, err := st.OperationCreate(ctx, store.OperationCreateParams{
		OperationID: uuid.NewString(), Subject: "nobody", Target: "t", Repo: testRepo, Action: store.ActionRevoke,
	}); !errors.Is(err, store.ErrBindingNotActive) {
		t.Fatalf("revoke of absent binding: %v", err)
	}
}

func TestRevokeRejectRestoresActive(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	op := mustCreate(t, st, grant("frank", "t"))
	setState(t, st, op, store.OpMerged, store.BindingActive)
	r := grant("frank", "t")
	r.Action = store.ActionRevoke
	rop := mustCreate(t, st, r)
	if rop.Status != store.OpPendingApproval || bindingOf(t, st, "frank", "t").Status != store.BindingRevoking {
		t.Fatal("revoke not pending")
	}
	if _, err := st.OperationReject(ctx, rop.OperationID); err != nil {
		t.Fatal(err)
	}
	if b := bindingOf(t, st, "frank", "t"); b.Status != store.BindingActive {
		t.Fatalf("binding after rejected revoke = %s, want active", b.Status)
	}
}

// A late approval for an operation superseded by a re-application is stale.
func TestStaleApprovalAfterReapplication(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	a := mustCreate(t, st, grant("gina", "t"))
	if _, err := st.OperationReject(ctx, a.OperationID); err != nil {
		t.Fatal(err)
	}
	b := mustCreate(t, st, grant("gina", "t"))
	if _, err := st.OperationApprove(ctx, a.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("late approval of A: %v, want ErrStale", err)
	}
	if waitingRows(t, st, a.OperationID) != 0 {
		t.Fatal("stale approval admitted A")
	}
	// Force A back to pending_approval (as if the reject had been lost): the binding
	// check alone must still refuse it.
	if _, err := st.DB().Exec(`UPDATE operation SET status = 'pending_approval', version = version + 1 WHERE operation_id = ?`, a.OperationID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.OperationApprove(ctx, a.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("approval of A not owning the binding: %v, want ErrStale", err)
	}
	if _, err := st.OperationReject(ctx, a.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("rejection of A not owning the binding: %v, want ErrStale", err)
	}
	if bd := bindingOf(t, st, "gina", "t"); bd.OperationID != b.OperationID || bd.Status != store.BindingPending {
		t.Fatalf("binding = %+v, want B pending", bd)
	}
	if got, err := st.OperationApprove(ctx, b.OperationID); err != nil || got.Status != store.OpQueued {
		t.Fatalf("approve B: %+v %v", got, err)
	}
}

func TestIdempotencyConcurrentSameKey(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const n = 32
	ids := make([]string, n)
	createdN := 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			p := grant("hank", "t")
			p.IdempotencyKey, p.Fingerprint, p.IdempotencyTTL = "key-1", "fp-1", time.Hour
			op, created, err := st.OperationCreate(ctx, p)
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
				return
			}
			mu.Lock()
			ids[i] = op.OperationID
			if created {
				createdN++
			}
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	if createdN != 1 {
		t.Fatalf("%d callers created, want 1", createdN)
	}
	for i, id := range ids {
		if id != ids[0] {
			t.Fatalf("caller %d got %s, caller 0 got %s", i, id, ids[0])
		}
	}
	var ops int
	if err := st.DB().Get(&ops, `SELECT COUNT(*) FROM operation`); err != nil || ops != 1 {
		t.Fatalf("operations = %d (%v), want 1", ops, err)
	}

	// Reused with another request.
	p := grant("hank", "other")
	p.IdempotencyKey, p.Fingerprint, p.IdempotencyTTL = "key-1", "fp-2", time.Hour
	if _, _, err := st.OperationCreate(ctx, p); !errors.Is(err, store.ErrIdempotencyKeyReused) {
		t.Fatalf("reused key: %v, want ErrIdempotencyKeyReused", err)
	}
	// A refused application stores no key: the same key may be used again.
	q := grant("hank", "t") // binding pending → busy
	q.IdempotencyKey, q.Fingerprint, q.IdempotencyTTL = "key-2", "fp-3", time.Hour
	if _, _, err := st.OperationCreate(ctx, q); !errors.Is(err, store.ErrBindingBusy) {
		t.Fatalf("busy: %v", err)
	}
	var keys int
	if err := st.DB().Get(&keys, `SELECT COUNT(*) FROM idempotency_key WHERE idem_key = 'key-2'`); err != nil || keys != 0 {
		t.Fatalf("refused application stored its key: %d %v", keys, err)
	}
}

func TestIdempotencyExpiryAndCleanup(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	p := grant("ivy", "t")
	p.IdempotencyKey, p.Fingerprint, p.IdempotencyTTL = "short", "fp", time.Millisecond
	first := mustCreate(t, st, p)
	time.Sleep(20 * time.Millisecond)
	// Expired: the key is no longer an answer; a new request with it is a new one.
	q := grant("ivy", "u")
	q.IdempotencyKey, q.Fingerprint, q.IdempotencyTTL = "short", "other", time.Millisecond
	second := mustCreate(t, st, q)
	if second.OperationID == first.OperationID {
		t.Fatal("expired key answered")
	}
	time.Sleep(20 * time.Millisecond)
	n, err := st.CleanupIdempotency(ctx, 10)
	if err != nil || n != 1 {
		t.Fatalf("cleanup = %d, %v; want 1", n, err)
	}
}

func TestOperationRetry(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	p := grant("jack", "t")
	p.AutoApprove = true
	op := mustCreate(t, st, p)
	if _, err := st.OperationRetry(ctx, op.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("retry of queued: %v, want ErrStale", err)
	}
	// Simulate a failed batch: claimed row, operation failed, binding failed.
	if _, err := st.DB().Exec(`UPDATE merge_batch_request SET batch_id = 999 WHERE operation_id = ?`, op.OperationID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec(`UPDATE operation SET batch_id = 999, error_code = 'x' WHERE operation_id = ?`, op.OperationID); err != nil {
		t.Fatal(err)
	}
	setState(t, st, op, store.OpFailed, store.BindingFailed)
	got, err := st.OperationRetry(ctx, op.OperationID)
	if err != nil || got.Status != store.OpQueued || got.Attempts != 1 || got.BatchID != nil || got.ErrorCode != "" {
		t.Fatalf("retry: %+v %v", got, err)
	}
	if waitingRows(t, st, op.OperationID) != 1 {
		t.Fatal("retried operation not waiting")
	}
	if b := bindingOf(t, st, "jack", "t"); b.Status != store.BindingPending {
		t.Fatalf("binding after retry = %s", b.Status)
	}
	if _, err := st.OperationRetry(ctx, op.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("second retry: %v, want ErrStale", err)
	}

	// Failed revoke: binding stays active, retry moves it back to revoking.
	g := mustCreate(t, st, grant("kate", "t"))
	setState(t, st, g, store.OpMerged, store.BindingActive)
	r := grant("kate", "t")
	r.Action, r.AutoApprove = store.ActionRevoke, true
	rop := mustCreate(t, st, r)
	if _, err := st.DB().Exec(`DELETE FROM merge_batch_request WHERE operation_id = ?`, rop.OperationID); err != nil {
		t.Fatal(err)
	}
	setState(t, st, rop, store.OpFailed, store.BindingActive)
	if got, err := st.OperationRetry(ctx, rop.OperationID); err != nil || got.Status != store.OpQueued {
		t.Fatalf("retry revoke: %+v %v", got, err)
	}
	if b := bindingOf(t, st, "kate", "t"); b.Status != store.BindingRevoking {
		t.Fatalf("binding after revoke retry = %s", b.Status)
	}
}

func TestBindingExpiry(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	p := grant("liam", "t")
	exp := time.Now().Add(time.Second)
	p.ExpiresAt = &exp
	op := mustCreate(t, st, p)
	setState(t, st, op, store.OpMerged, store.BindingActive)
	if bs, err := st.BindingsExpired(ctx, 10); err != nil || len(bs) != 0 {
		t.Fatalf("expired before time: %v %v", bs, err)
	}
	if _, err := st.DB().Exec(`UPDATE binding SET expires_at = CURRENT_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE subject = 'liam'`); err != nil {
		t.Fatal(err)
	}
	bs, err := st.BindingsExpired(ctx, 10)
	if err != nil || len(bs) != 1 {
		t.Fatalf("expired: %v %v", bs, err)
	}
	// Two replicas expire the same binding: one revoke.
	var wg sync.WaitGroup
	results := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, results[i] = st.BindingExpire(ctx, bs[0], uuid.NewString())
		}()
	}
	wg.Wait()
	wins := 0
	for _, err := range results {
		if err == nil {
			wins++
		} else if !errors.Is(err, store.ErrLostRace) {
			t.Fatalf("expire: %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d expiries won, want 1", wins)
	}
	b := bindingOf(t, st, "liam", "t")
	rop, err := st.OperationGet(ctx, b.OperationID)
	if err != nil || b.Status != store.BindingRevoking || rop.Action != store.ActionRevoke || rop.Status != store.OpQueued {
		t.Fatalf("after expiry: binding %+v op %+v %v", b, rop, err)
	}
	if waitingRows(t, st, rop.OperationID) != 1 {
		t.Fatal("expiry revoke not admitted")
	}
}

func TestEventRecordDedupe(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	e := store.Event{DedupeKey: "batch:1:note", Code: "note", Detail: "x"}
	if ok, err := st.EventRecord(ctx, e); !ok || err != nil {
		t.Fatalf("first: %v %v", ok, err)
	}
	if ok, err := st.EventRecord(ctx, e); ok || err != nil {
		t.Fatalf("duplicate: %v %v", ok, err)
	}
}
