package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

const testRepo = "platform/access"

func grant(subject, target string) store.OperationCreateParams {
	return store.OperationCreateParams{
		OperationID: uuid.NewString(), Subject: subject, Target: target, Repo: testRepo, Action: domain.ActionGrant,
	}
}

func mustCreate(t *testing.T, st *store.Store, p store.OperationCreateParams) domain.Operation {
	t.Helper()
	op, created, err := st.OperationCreate(context.Background(), p)
	if err != nil || !created {
		t.Fatalf("OperationCreate(%s %s→%s): created=%v err=%v", p.Action, p.Subject, p.Target, created, err)
	}
	return op
}

func bindingOf(t *testing.T, st *store.Store, subject, target string) domain.Binding {
	t.Helper()
	bs, err := st.BindingList(context.Background(), subject, target, 0, 10)
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
func setState(t *testing.T, st *store.Store, op domain.Operation, opStatus domain.OpStatus, bStatus domain.BindingStatus) {
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
	if op.Status != domain.OpPendingApproval || op.Repo != testRepo || op.ExpiresAt == nil || !op.ExpiresAt.Equal(exp) {
		t.Fatalf("created op = %+v", op)
	}
	var attrs map[string]string
	if err := json.Unmarshal(op.Attributes, &attrs); err != nil || attrs["ticket"] != "OPS-1" {
		t.Fatalf("attributes = %s (%v)", op.Attributes, err)
	}
	b := bindingOf(t, st, "alice", "db/prod")
	if b.Status != domain.BindingPending || b.OperationID != op.OperationID {
		t.Fatalf("binding = %+v", b)
	}
	if waitingRows(t, st, op.OperationID) != 0 {
		t.Fatal("pending_approval operation must not be waiting")
	}

	got, err := st.OperationApprove(ctx, op.OperationID)
	if err != nil || got.Status != domain.OpQueued {
		t.Fatalf("approve: %+v %v", got, err)
	}
	if waitingRows(t, st, op.OperationID) != 1 {
		t.Fatal("approved operation not admitted")
	}
	// A repeat of the same decision changes nothing.
	again, err := st.OperationApprove(ctx, op.OperationID)
	if err != nil || again.Version != got.Version || again.Status != domain.OpQueued {
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
	counts, err := st.OperationCounts(ctx, domain.OpQueued, domain.OpMerged)
	if err != nil || len(counts) != 2 || counts[domain.OpQueued] != 1 || counts[domain.OpMerged] != 0 {
		t.Fatalf("counts: %v %v", counts, err)
	}
}

func TestOperationAutoApproveAndReject(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	p := grant("bob", "db/prod")
	p.AutoApprove = true
	op := mustCreate(t, st, p)
	if op.Status != domain.OpQueued || waitingRows(t, st, op.OperationID) != 1 {
		t.Fatalf("auto-approved op = %+v", op)
	}

	q := grant("carol", "db/prod")
	op2 := mustCreate(t, st, q)
	rej, err := st.OperationReject(ctx, op2.OperationID)
	if err != nil || rej.Status != domain.OpRejected {
		t.Fatalf("reject: %+v %v", rej, err)
	}
	if b := bindingOf(t, st, "carol", "db/prod"); b.Status != domain.BindingRejected {
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
	if bs, _ := st.BindingList(context.Background(), "dave", "", 0, 10); len(bs) != 0 {
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
	if after.ID != before.ID || after.OperationID != winners[0] || after.Status != domain.BindingPending || after.Version != before.Version+1 {
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
		binding    domain.BindingStatus
		grantErr   error
		revokeErr  error
		grantOK    bool
		revokeOK   bool
		opStatusAt domain.OpStatus
	}{
		{domain.BindingPending, store.ErrBindingBusy, store.ErrBindingBusy, false, false, domain.OpPendingApproval},
		{domain.BindingActive, store.ErrBindingActive, nil, false, true, domain.OpMerged},
		{domain.BindingRevoking, store.ErrBindingBusy, store.ErrBindingBusy, false, false, domain.OpPendingApproval},
		{domain.BindingFailed, store.ErrBindingBusy, store.ErrBindingBusy, false, false, domain.OpFailed},
		{domain.BindingRejected, nil, store.ErrBindingNotActive, true, false, domain.OpRejected},
		{domain.BindingClosed, nil, store.ErrBindingNotActive, true, false, domain.OpMerged},
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
			r.Action = domain.ActionRevoke
			r.Repo = "some/other-repo" // a revoke goes where the file is
			rop, _, err := st.OperationCreate(ctx, r)
			if c.revokeOK != (err == nil) || (!c.revokeOK && !errors.Is(err, c.revokeErr)) {
				t.Fatalf("revoke on %s: %v, want ok=%v err=%v", c.binding, err, c.revokeOK, c.revokeErr)
			}
			after := bindingOf(t, st, subject, "t")
			if c.revokeOK {
				if rop.Repo != testRepo || after.Status != domain.BindingRevoking || after.OperationID != rop.OperationID {
					t.Fatalf("revoke: op %+v binding %+v", rop, after)
				}
			} else if after != before {
				t.Fatalf("refused revoke changed the binding: %+v → %+v", before, after)
			}
		})
	}
	if _, _, err := st.OperationCreate(ctx, store.OperationCreateParams{
		OperationID: uuid.NewString(), Subject: "nobody", Target: "t", Repo: testRepo, Action: domain.ActionRevoke,
	}); !errors.Is(err, store.ErrBindingNotActive) {
		t.Fatalf("revoke of absent binding: %v", err)
	}
}

func TestRevokeRejectRestoresActive(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	op := mustCreate(t, st, grant("frank", "t"))
	setState(t, st, op, domain.OpMerged, domain.BindingActive)
	r := grant("frank", "t")
	r.Action = domain.ActionRevoke
	rop := mustCreate(t, st, r)
	if rop.Status != domain.OpPendingApproval || bindingOf(t, st, "frank", "t").Status != domain.BindingRevoking {
		t.Fatal("revoke not pending")
	}
	if _, err := st.OperationReject(ctx, rop.OperationID); err != nil {
		t.Fatal(err)
	}
	if b := bindingOf(t, st, "frank", "t"); b.Status != domain.BindingActive {
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
	if bd := bindingOf(t, st, "gina", "t"); bd.OperationID != b.OperationID || bd.Status != domain.BindingPending {
		t.Fatalf("binding = %+v, want B pending", bd)
	}
	if got, err := st.OperationApprove(ctx, b.OperationID); err != nil || got.Status != domain.OpQueued {
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
	setState(t, st, op, domain.OpFailed, domain.BindingFailed)
	got, err := st.OperationRetry(ctx, op.OperationID)
	if err != nil || got.Status != domain.OpQueued || got.Attempts != 1 || got.BatchID != nil || got.ErrorCode != "" {
		t.Fatalf("retry: %+v %v", got, err)
	}
	if waitingRows(t, st, op.OperationID) != 1 {
		t.Fatal("retried operation not waiting")
	}
	if b := bindingOf(t, st, "jack", "t"); b.Status != domain.BindingPending {
		t.Fatalf("binding after retry = %s", b.Status)
	}
	if _, err := st.OperationRetry(ctx, op.OperationID); !errors.Is(err, store.ErrStale) {
		t.Fatalf("second retry: %v, want ErrStale", err)
	}

	// Failed revoke: binding stays active, retry moves it back to revoking.
	g := mustCreate(t, st, grant("kate", "t"))
	setState(t, st, g, domain.OpMerged, domain.BindingActive)
	r := grant("kate", "t")
	r.Action, r.AutoApprove = domain.ActionRevoke, true
	rop := mustCreate(t, st, r)
	if _, err := st.DB().Exec(`DELETE FROM merge_batch_request WHERE operation_id = ?`, rop.OperationID); err != nil {
		t.Fatal(err)
	}
	setState(t, st, rop, domain.OpFailed, domain.BindingActive)
	if got, err := st.OperationRetry(ctx, rop.OperationID); err != nil || got.Status != domain.OpQueued {
		t.Fatalf("retry revoke: %+v %v", got, err)
	}
	if b := bindingOf(t, st, "kate", "t"); b.Status != domain.BindingRevoking {
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
	setState(t, st, op, domain.OpMerged, domain.BindingActive)
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
	if err != nil || b.Status != domain.BindingRevoking || rop.Action != domain.ActionRevoke || rop.Status != domain.OpQueued {
		t.Fatalf("after expiry: binding %+v op %+v %v", b, rop, err)
	}
	if waitingRows(t, st, rop.OperationID) != 1 {
		t.Fatal("expiry revoke not admitted")
	}

	// The revoke fails (its batch fails): the binding is back to active, still expired,
	// still owned by the failed revoke. Expiring it again would start a new revoke every
	// pass for ever, each with fresh attempts, and make the failed one stale to retry;
	// a failed revoke is the operator's to retry.
	res := btClaim(t, st, testRepo, 10, store.ClaimClaimed)
	if _, err := st.BatchSettleFailed(ctx, res.BatchID, domain.BatchRunning, 1, "closed_by_user", "closed"); err != nil {
		t.Fatal(err)
	}
	if b := bindingOf(t, st, "liam", "t"); b.Status != domain.BindingActive || b.OperationID != rop.OperationID {
		t.Fatalf("after the failed revoke: binding %+v", b)
	}
	if got, _ := st.OperationGet(ctx, rop.OperationID); got.Status != domain.OpFailed {
		t.Fatalf("revoke after its batch failed: %s", got.Status)
	}
	if bs, err := st.BindingsExpired(ctx, 10); err != nil || len(bs) != 0 {
		t.Fatalf("a binding whose revoke failed is expired again: %+v %v", bs, err)
	}
	if _, err := st.BindingExpire(ctx, bindingOf(t, st, "liam", "t"), uuid.NewString()); !errors.Is(err, store.ErrLostRace) {
		t.Fatalf("expiring a binding whose revoke failed: %v, want ErrLostRace", err)
	}
	if got, err := st.OperationRetry(ctx, rop.OperationID); err != nil || got.Status != domain.OpQueued {
		t.Fatalf("operator's retry of the failed revoke: %+v %v", got, err)
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

// --- group commit of admissions (admit_group.go) ---

// sameOperation reports whether an admission's answer is exactly the stored row.
func sameOperation(a, b domain.Operation) bool {
	if string(a.Attributes) != string(b.Attributes) {
		return false
	}
	a.Attributes, b.Attributes = nil, nil
	if (a.ExpiresAt == nil) != (b.ExpiresAt == nil) || (a.ExpiresAt != nil && !a.ExpiresAt.Equal(*b.ExpiresAt)) {
		return false
	}
	a.ExpiresAt, b.ExpiresAt = nil, nil
	return a.ID == b.ID && a.OperationID == b.OperationID && a.Subject == b.Subject && a.Target == b.Target &&
		a.Repo == b.Repo && a.Action == b.Action && a.Status == b.Status && a.Version == b.Version &&
		a.BatchID == nil && b.BatchID == nil && a.Attempts == b.Attempts && a.ErrorCode == b.ErrorCode &&
		a.ErrorMessage == b.ErrorMessage && a.CreatedAt.Equal(b.CreatedAt) && a.UpdatedAt.Equal(b.UpdatedAt)
}

type admitCall struct {
	p       store.OperationCreateParams
	group   string // what the checks group this call with
	op      domain.Operation
	created bool
	err     error
}

// admissionRace prepares relations in every state, then fires one burst of concurrent
// admissions through the given stores (replicas on one database) and checks each
// answer against what a serial execution allows, and the invariants afterwards.
func admissionRace(t *testing.T, stores []*store.Store, rounds int) {
	admissionRaceVia(t, stores, rounds, (*store.Store).OperationCreate)
}

// admissionRaceVia is admissionRace with every admission made by create.
func admissionRaceVia(t *testing.T, stores []*store.Store, rounds int,
	create func(*store.Store, context.Context, store.OperationCreateParams) (domain.Operation, bool, error)) {
	ctx := context.Background()
	st := stores[0]
	for round := 0; round < rounds; round++ {
		pre := "r" + itoa(round) + "-"
		// Relations in a state each (set serially, through the serial mode of st).
		const k = 6 // concurrent callers per contested relation
		rejected := mustCreate(t, st, grant(pre+"rejected", "t"))
		if _, err := st.OperationReject(ctx, rejected.OperationID); err != nil {
			t.Fatal(err)
		}
		closed := mustCreate(t, st, grant(pre+"closed", "t"))
		setState(t, st, closed, domain.OpMerged, domain.BindingClosed)
		active := mustCreate(t, st, grant(pre+"active", "t"))
		setState(t, st, active, domain.OpMerged, domain.BindingActive)
		mustCreate(t, st, grant(pre+"pending", "t"))
		stored := grant(pre+"stored", "t")
		stored.IdempotencyKey, stored.Fingerprint, stored.IdempotencyTTL = pre+"stored-key", "fp-stored", time.Hour
		storedOp := mustCreate(t, st, stored)

		var calls []*admitCall
		add := func(group string, p store.OperationCreateParams) {
			calls = append(calls, &admitCall{p: p, group: group})
		}
		for i := 0; i < 40; i++ { // distinct fresh relations: all created
			p := grant(pre+"fresh-"+itoa(i), "t")
			p.AutoApprove = i%2 == 0
			if i%3 == 0 {
				p.Attributes = json.RawMessage(`{"i":` + itoa(i) + `}`)
			}
			if i%4 == 0 {
				exp := time.Now().Add(time.Hour).Add(123456789 * time.Nanosecond)
				p.ExpiresAt = &exp
			}
			if i%5 == 0 {
				p.IdempotencyKey, p.Fingerprint, p.IdempotencyTTL = pre+"fresh-key-"+itoa(i), "fp", time.Hour
			}
			add("fresh", p)
		}
		for i := 0; i < k; i++ {
			add("absent", grant(pre+"absent", "t")) // one new relation, k first applications
			p := grant(pre+"rejected", "t")         // re-application of a rejected binding
			p.AutoApprove = true
			add("rejected", p)
			add("closed", grant(pre+"closed", "t"))
			r := grant(pre+"active", "t") // k revokes of an active binding …
			r.Action, r.AutoApprove = domain.ActionRevoke, i%2 == 0
			add("active", r)
			add("active", grant(pre+"active", "t")) // … and grants of it
			add("pending", grant(pre+"pending", "t"))
			// One key, the same request k times (each with its own new operation id, as
			// the API makes them) and once with another request.
			s := grant(pre+"keyed", "t")
			s.IdempotencyKey, s.Fingerprint, s.IdempotencyTTL = pre+"key", "fp-a", time.Hour
			add("key", s)
			// A stored key: repeats answer the stored operation.
			rs := grant(pre+"stored", "t")
			rs.IdempotencyKey, rs.Fingerprint, rs.IdempotencyTTL = pre+"stored-key", "fp-stored", time.Hour
			add("stored", rs)
		}
		o := grant(pre+"keyed-other", "t")
		o.IdempotencyKey, o.Fingerprint, o.IdempotencyTTL = pre+"key", "fp-b", time.Hour
		add("key", o)
		past := time.Now().Add(-time.Minute)
		e := grant(pre+"past", "t")
		e.ExpiresAt = &past
		add("past", e)
		nr := grant(pre+"nobody", "t")
		nr.Action = domain.ActionRevoke
		add("nobody", nr)
		bad := grant(pre+"bad", "t")
		bad.Action = "steal"
		add("bad", bad)
		rev := grant(pre+"bad-exp", "t")
		rev.Action, rev.ExpiresAt = domain.ActionRevoke, &past
		add("bad", rev)

		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, c := range calls {
			wg.Go(func() {
				<-start
				c.op, c.created, c.err = create(stores[i%len(stores)], ctx, c.p)
			})
		}
		close(start)
		wg.Wait()

		byGroup := map[string][]*admitCall{}
		for _, c := range calls {
			byGroup[c.group] = append(byGroup[c.group], c)
			if c.created {
				got, err := st.OperationGet(ctx, c.op.OperationID)
				if err != nil || !sameOperation(c.op, got) {
					t.Fatalf("%s: answer %+v, stored %+v (%v)", c.group, c.op, got, err)
				}
				if c.op.OperationID != c.p.OperationID {
					t.Fatalf("%s: created %s, asked for %s", c.group, c.op.OperationID, c.p.OperationID)
				}
				want := 0
				if c.p.AutoApprove {
					want = 1
				}
				if n := waitingRows(t, st, c.op.OperationID); n != want {
					t.Fatalf("%s: %d waiting rows for %s, want %d (I4)", c.group, n, c.op.OperationID, want)
				}
				evs, err := st.OperationEvents(ctx, c.op.OperationID)
				if err != nil || len(evs) != 1+want || evs[0].Code != store.EventCreated || (want == 1 && evs[1].Code != store.EventAdmitted) {
					t.Fatalf("%s: events %+v %v", c.group, evs, err)
				}
			} else if c.err == nil && c.group != "key" && c.group != "stored" {
				t.Fatalf("%s: answered %+v without creating and without error", c.group, c.op)
			}
		}
		for _, c := range byGroup["fresh"] {
			if !c.created || c.err != nil {
				t.Fatalf("fresh relation %s: created=%v err=%v", c.p.Subject, c.created, c.err)
			}
		}
		// Contested relations: exactly one winner, the others refused with a 409 answer,
		// the binding now the winner's (I5: same row, version bumped once when re-applied).
		oneWinner := func(group string, subject string, ok func(error) bool) string {
			t.Helper()
			var winner string
			for _, c := range byGroup[group] {
				if c.p.Subject != subject {
					continue
				}
				switch {
				case c.created:
					if winner != "" {
						t.Fatalf("%s: two winners %s and %s", group, winner, c.op.OperationID)
					}
					winner = c.op.OperationID
				case !ok(c.err):
					t.Fatalf("%s: unexpected answer %v", group, c.err)
				}
			}
			if winner == "" {
				t.Fatalf("%s: no winner", group)
			}
			if b := bindingOf(t, st, subject, "t"); b.OperationID != winner {
				t.Fatalf("%s: binding %+v, winner %s", group, b, winner)
			}
			return winner
		}
		busy := func(err error) bool {
			return errors.Is(err, store.ErrBindingBusy) || errors.Is(err, store.ErrLostRace)
		}
		oneWinner("absent", pre+"absent", busy)
		oneWinner("rejected", pre+"rejected", busy)
		oneWinner("closed", pre+"closed", busy)
		oneWinner("active", pre+"active", func(err error) bool { return busy(err) || errors.Is(err, store.ErrBindingActive) })
		for _, c := range byGroup["active"] {
			if c.created && c.p.Action != domain.ActionRevoke {
				t.Fatal("a grant of an active binding was created")
			}
		}
		for _, c := range byGroup["pending"] {
			if c.created || !errors.Is(c.err, store.ErrBindingBusy) {
				t.Fatalf("pending: created=%v err=%v, want busy", c.created, c.err)
			}
		}
		for _, group := range []string{"rejected", "closed"} {
			var versions []int64
			if err := st.DB().Select(&versions, `SELECT version FROM binding WHERE subject = ?`, pre+group); err != nil || len(versions) != 1 || versions[0] != 3 {
				t.Fatalf("%s binding versions %v %v: want one row re-applied once (version 3)", group, versions, err)
			}
		}
		// One key: exactly one creator; same request → its operation; other request → 422.
		var keyWinner *admitCall
		for _, c := range byGroup["key"] {
			if c.created {
				if keyWinner != nil {
					t.Fatal("two creators for one idempotency key")
				}
				keyWinner = c
			}
		}
		if keyWinner == nil {
			t.Fatal("no creator for the key")
		}
		for _, c := range byGroup["key"] {
			switch {
			case c == keyWinner:
			case c.p.Fingerprint == keyWinner.p.Fingerprint:
				if c.err != nil || c.created || c.op.OperationID != keyWinner.op.OperationID {
					t.Fatalf("key repeat: %+v created=%v err=%v, winner %s", c.op.OperationID, c.created, c.err, keyWinner.op.OperationID)
				}
			default:
				if !errors.Is(c.err, store.ErrIdempotencyKeyReused) {
					t.Fatalf("key reused with another request: %v", c.err)
				}
			}
		}
		for _, c := range byGroup["stored"] {
			if c.err != nil || c.created || c.op.OperationID != storedOp.OperationID {
				t.Fatalf("stored key: %s created=%v err=%v, want %s", c.op.OperationID, c.created, c.err, storedOp.OperationID)
			}
		}
		if c := byGroup["past"][0]; !errors.Is(c.err, store.ErrExpiresInPast) {
			t.Fatalf("past expiry: %v", c.err)
		}
		if c := byGroup["nobody"][0]; !errors.Is(c.err, store.ErrBindingNotActive) {
			t.Fatalf("revoke of nobody: %v", c.err)
		}
		for _, c := range byGroup["bad"] {
			if !errors.Is(c.err, store.ErrInvalidRequest) {
				t.Fatalf("invalid request: %v", c.err)
			}
		}
		// Nothing of a refused request was written; one key row per stored key.
		var orphans int
		if err := st.DB().Get(&orphans, `SELECT COUNT(*) FROM operation o LEFT JOIN binding b
			ON b.subject = o.subject AND b.target = o.target WHERE b.id IS NULL`); err != nil || orphans != 0 {
			t.Fatalf("operations without a binding: %d %v", orphans, err)
		}
		var keys int
		if err := st.DB().Get(&keys, `SELECT COUNT(*) FROM idempotency_key WHERE idem_key = ?`, pre+"key"); err != nil || keys != 1 {
			t.Fatalf("key rows = %d %v", keys, err)
		}
	}
	// Every operation that the database holds was answered to exactly one caller (or set
	// up serially): nothing was written for a refused or repeated request.
	var dup int
	if err := st.DB().Get(&dup, `SELECT COUNT(*) FROM (SELECT operation_id FROM merge_batch_request GROUP BY operation_id HAVING COUNT(*) > 1) d`); err != nil || dup != 0 {
		t.Fatalf("I4: %d operations waiting twice (%v)", dup, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// statementModes runs f with groups in compound statements (the default on MariaDB)
// and with one statement per write (the path every server takes).
func statementModes(t *testing.T, f func(t *testing.T, plain bool)) {
	for _, plain := range []bool{false, true} {
		name := "compound"
		if plain {
			name = "plain"
		}
		t.Run(name, func(t *testing.T) { f(t, plain) })
	}
}

func TestAdmissionGroupedRace(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		st, _ := storetest.New(t)
		// One group at a time with a short linger, so the burst certainly forms groups
		// with duplicates and conflicts inside them.
		st.SetAdmitOptions(store.AdmitOptions{MaxInflight: 1, Linger: 2 * time.Millisecond, PlainStatements: plain})
		admissionRace(t, []*store.Store{st}, 3)
		s := st.AdmitStats()
		if s.Grouped <= s.Groups {
			t.Fatalf("no group held more than one request: %+v", s)
		}
		if s.Serial == 0 {
			t.Fatalf("no request was deferred to the per-request path: %+v", s)
		}
		if plain != (s.Compound == 0) {
			t.Fatalf("plain=%v but %d compound groups", plain, s.Compound)
		}
		t.Logf("admission stats: %+v", s)
	})
}

func TestAdmissionGroupedRaceDefaults(t *testing.T) {
	st, _ := storetest.New(t)
	admissionRace(t, []*store.Store{st}, 2)
}

// Three replicas (own pools, own queues) on one database: groups of different stores
// collide on keys and bindings and fall back to per-request transactions.
func TestAdmissionGroupedRaceReplicas(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		st, dsn := storetest.New(t)
		stores := []*store.Store{st}
		for range 2 {
			o, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 16})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { o.Close() })
			stores = append(stores, o)
		}
		for _, s := range stores {
			s.SetAdmitOptions(store.AdmitOptions{MaxInflight: 2, Linger: time.Millisecond, PlainStatements: plain})
		}
		admissionRace(t, stores, 3)
		var fb int64
		for _, s := range stores {
			fb += s.AdmitStats().Fallbacks
		}
		t.Logf("group fallbacks across replicas: %d", fb)
	})
}

// The group path answers what the per-request transaction answers, also with groups
// of one (what bench measures as "single").
func TestAdmissionModesAgree(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		st, _ := storetest.New(t)
		st.SetAdmitOptions(store.AdmitOptions{MaxGroup: 1, MaxInflight: 64})
		admissionRace(t, []*store.Store{st}, 1)
	})
	t.Run("serial", func(t *testing.T) {
		st, _ := storetest.New(t)
		admissionRaceVia(t, []*store.Store{st}, 1, (*store.Store).OperationCreateSerial)
	})
}

func TestAdmissionCanceledContext(t *testing.T) {
	st, _ := storetest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := grant("nora", "t")
	if _, _, err := st.OperationCreate(ctx, p); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	if _, err := st.OperationGet(context.Background(), p.OperationID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a canceled admission was written: %v", err)
	}
}

// A group whose guarded binding write loses (the binding moved between the group's
// read and its write) rolls back whole and every caller is answered by its own
// transaction: the re-application that still can win wins, nothing is half-written.
func TestAdmissionGroupFallbackOnConcurrentWriter(t *testing.T) {
	statementModes(t, testAdmissionGroupFallbackOnConcurrentWriter)
}

func testAdmissionGroupFallbackOnConcurrentWriter(t *testing.T, plain bool) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	st.SetAdmitOptions(store.AdmitOptions{MaxInflight: 1, Linger: time.Millisecond, PlainStatements: plain})
	const n = 20
	var ops []domain.Operation
	for i := 0; i < n; i++ {
		op := mustCreate(t, st, grant("olga-"+itoa(i), "t"))
		if _, err := st.OperationReject(ctx, op.OperationID); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	// Bump every rejected binding's version over and over while re-applications race.
	stop := make(chan struct{})
	var bumps sync.WaitGroup
	bumps.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := st.DB().Exec(`UPDATE binding SET version = version + 1 WHERE subject LIKE 'olga-%' AND status = 'rejected'`); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var wg sync.WaitGroup
	results := make([]error, n)
	for i := 0; i < n; i++ {
		wg.Go(func() {
			_, _, results[i] = st.OperationCreate(ctx, grant("olga-"+itoa(i), "t"))
		})
	}
	wg.Wait()
	close(stop)
	bumps.Wait()
	for i, err := range results {
		b := bindingOf(t, st, "olga-"+itoa(i), "t")
		switch {
		case err == nil:
			if b.Status != domain.BindingPending || b.OperationID == ops[i].OperationID {
				t.Fatalf("created but binding %+v", b)
			}
		case errors.Is(err, store.ErrLostRace):
			if b.Status != domain.BindingRejected {
				t.Fatalf("lost but binding %+v", b)
			}
		default:
			t.Fatalf("re-application %d: %v", i, err)
		}
	}
	t.Logf("admission stats: %+v", st.AdmitStats())
}

// A guarded binding write that loses between the group's read and its writes (the
// binding moved on) rolls the whole group back, and every caller is answered by its
// own transaction, which then wins on the fresh state.
func TestAdmissionGroupGuardLost(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		st, _ := storetest.New(t)
		ctx := context.Background()
		st.SetAdmitOptions(store.AdmitOptions{MaxInflight: 1, Linger: 5 * time.Millisecond, PlainStatements: plain})
		const n = 12
		for i := 0; i < n; i++ {
			op := mustCreate(t, st, grant("pia-"+itoa(i), "t"))
			if _, err := st.OperationReject(ctx, op.OperationID); err != nil {
				t.Fatal(err)
			}
		}
		var once sync.Once
		store.SetAdmitAfterRead(func(ctx context.Context) {
			once.Do(func() {
				if _, err := st.DB().ExecContext(ctx, `UPDATE binding SET version = version + 1 WHERE subject LIKE 'pia-%'`); err != nil {
					t.Error(err)
				}
			})
		})
		defer store.SetAdmitAfterRead(nil)
		before := st.AdmitStats()
		var wg sync.WaitGroup
		calls := make([]*admitCall, n)
		for i := range calls {
			calls[i] = &admitCall{p: grant("pia-"+itoa(i), "t")}
			calls[i].p.AutoApprove = true
		}
		for _, c := range calls {
			wg.Go(func() { c.op, c.created, c.err = st.OperationCreate(ctx, c.p) })
		}
		wg.Wait()
		after := st.AdmitStats()
		if after.Fallbacks == before.Fallbacks {
			t.Fatalf("no group fell back: %+v", after)
		}
		for i, c := range calls {
			if c.err != nil || !c.created {
				t.Fatalf("re-application %d: created=%v err=%v", i, c.created, c.err)
			}
			got, err := st.OperationGet(ctx, c.op.OperationID)
			if err != nil || !sameOperation(c.op, got) {
				t.Fatalf("answer %+v, stored %+v (%v)", c.op, got, err)
			}
			b := bindingOf(t, st, c.p.Subject, "t")
			if b.OperationID != c.op.OperationID || b.Status != domain.BindingPending || b.Version != 4 {
				t.Fatalf("binding %+v: want pending, owned by %s, version 4 (reject, bump, re-apply)", b, c.op.OperationID)
			}
		}
		var ops int
		if err := st.DB().Get(&ops, `SELECT COUNT(*) FROM operation WHERE subject LIKE 'pia-%'`); err != nil || ops != 2*n {
			t.Fatalf("operations = %d (%v), want %d: the rolled-back group left rows", ops, err, 2*n)
		}
		if dup := waitingRows(t, st, calls[0].op.OperationID); dup != 1 {
			t.Fatalf("waiting rows = %d", dup)
		}
	})
}

// Whatever way a group ends (committed, refused, rolled back and handed back, an
// optimistic attempt refused), the connections it used go back to the pool outside
// any transaction.
func TestAdmissionLeavesNoOpenTransaction(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		_, dsn := storetest.New(t)
		ctx := context.Background()
		st, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		st.SetAdmitOptions(store.AdmitOptions{MaxInflight: 1, Linger: 2 * time.Millisecond, PlainStatements: plain})
		admissionRace(t, []*store.Store{st}, 1)
		var conns []*sql.Conn
		for range 2 {
			c, err := st.DB().Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		for _, c := range conns {
			var inTx int
			if err := c.QueryRowContext(ctx, `SELECT @@in_transaction`).Scan(&inTx); err != nil || inTx != 0 {
				t.Fatalf("a pooled connection is inside a transaction: %d %v", inTx, err)
			}
			c.Close()
		}
	})
}

// I3 for the admission path itself: while a claim transaction of the same repository is
// held open after its UPDATEs, OperationCreate (auto-approved, so it inserts waiting
// rows too) still answers, in every statement mode, whether the claim takes every
// waiting row or only some. If an admission waited for the claim's locks, it could not
// return before the claim is released.
func TestAdmissionNeverWaitsForOpenClaim(t *testing.T) {
	for _, tc := range []struct {
		name          string
		waiting, max  int
		plain, serial bool
	}{
		{"claim takes every row/compound", 3, 10, false, false},
		{"claim takes some rows/compound", 30, 10, false, false},
		{"claim takes every row/plain", 3, 10, true, false},
		{"claim takes every row/serial", 3, 10, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := storetest.New(t)
			ctx := context.Background()
			const repo = "group/i3-admission"
			storetest.InsertQueuedOps(t, st, repo, tc.waiting)
			st.SetAdmitOptions(store.AdmitOptions{PlainStatements: tc.plain})
			create := st.OperationCreate
			if tc.serial {
				create = st.OperationCreateSerial
			}
			// Re-applications too (the read path), not only new relations.
			var rejected []string
			for i := 0; i < 5; i++ {
				op := mustCreate(t, st, grant("i3-re-"+itoa(i), "t"))
				if _, err := st.OperationReject(ctx, op.OperationID); err != nil {
					t.Fatal(err)
				}
				rejected = append(rejected, "i3-re-"+itoa(i))
			}

			held, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var once sync.Once
			st.Hooks = &store.Hooks{ClaimAfterUpdate: func(context.Context, int64) {
				once.Do(func() { close(held) })
				<-release
			}}
			var res store.ClaimResult
			var claimErr error
			go func() {
				defer close(done)
				res, claimErr = st.BatchClaim(ctx, repo, tc.max)
			}()
			<-held

			subjects := append([]string{}, rejected...)
			for i := 0; i < 40; i++ {
				subjects = append(subjects, "i3-new-"+itoa(i))
			}
			errs := make([]error, len(subjects))
			var wg sync.WaitGroup
			for i, s := range subjects {
				wg.Go(func() {
					// A generous bound only so that a blocked admission fails the test
					// instead of hanging it.
					actx, cancel := context.WithTimeout(ctx, 20*time.Second)
					defer cancel()
					p := grant(s, "t")
					p.Repo, p.AutoApprove = repo, true
					_, created, err := create(actx, p)
					if err == nil && !created {
						err = errors.New("not created")
					}
					errs[i] = err
				})
			}
			wg.Wait()
			select {
			case <-done:
				t.Fatal("the claim finished before the admissions: it was not held open")
			default:
			}
			close(release)
			<-done
			st.Hooks = nil
			for i, err := range errs {
				if err != nil {
					t.Fatalf("admission %s while the claim was open: %v", subjects[i], err)
				}
			}
			if claimErr != nil || res.Outcome != store.ClaimClaimed || len(res.OperationIDs) != min(tc.waiting, tc.max) {
				t.Fatalf("held claim = %+v, %v", res, claimErr)
			}
		})
	}
}

// Admission works on a pool of one connection, the first group included: what a group
// probes once per Store (compound statements, auto-increment step) must not need a
// second connection while the group holds the only one.
func TestAdmissionOnPoolOfOne(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		_, dsn := storetest.New(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st := storetest.Open(t, dsn, 1)
		st.SetAdmitOptions(store.AdmitOptions{PlainStatements: plain})
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() {
				_, created, err := st.OperationCreate(ctx, grant(fmt.Sprintf("one-conn-%d", i), "db/x"))
				if err == nil && !created {
					err = errors.New("not created")
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("admission %d on a pool of one: %v", i, err)
			}
		}
	})
}

// An expiry DATETIME(6) cannot hold (past 9999-12-31 in UTC) is refused for the one
// request that carries it, before it can join an admission group: the driver refuses
// to send such a time, and inside a group that refusal used to read as "commit outcome
// unknown" for every request admitted with it.
func TestOperationExpiresBeyondDatetime(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	far := time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("-01:00", -3600)) // year 10000 in UTC
	for round := 0; round < 5; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 30)
		start := make(chan struct{})
		for i := range errs {
			p := grant(fmt.Sprintf("far-%d-%d", round, i), "x")
			if i == 0 {
				p.ExpiresAt = &far
			}
			wg.Go(func() {
				<-start
				_, _, errs[i] = st.OperationCreate(ctx, p)
			})
		}
		close(start)
		wg.Wait()
		if !errors.Is(errs[0], store.ErrInvalidRequest) {
			t.Fatalf("round %d: expiry in year 10000: err = %v, want ErrInvalidRequest", round, errs[0])
		}
		for i, err := range errs[1:] {
			if err != nil {
				t.Fatalf("round %d: request %d admitted alongside it: %v", round, i+1, err)
			}
		}
	}
	if bs, _ := st.BindingList(ctx, "far-0-0", "", 0, 10); len(bs) != 0 {
		t.Fatal("refused application wrote a binding")
	}
}
