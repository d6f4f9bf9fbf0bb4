package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

func qcCreate(t testing.TB, st *store.Store, subject string, prio domain.Priority, auto bool) domain.Operation {
	t.Helper()
	p := grant(subject, "t")
	p.Priority, p.AutoApprove = prio, auto
	op, created, err := st.OperationCreate(context.Background(), p)
	if err != nil || !created {
		t.Fatalf("create %s: %v (created %v)", subject, err, created)
	}
	return op
}

// Urgent operations are claimed before normal ones, within the batch size, whatever
// their age; the rest keep oldest-first order.
func TestUrgentClaimedFirst(t *testing.T) {
	st, _ := storetest.New(t)
	var normal, urgent []string
	for i := range 6 {
		normal = append(normal, qcCreate(t, st, fmt.Sprintf("n%d", i), "", true).OperationID)
	}
	for i := range 3 {
		op := qcCreate(t, st, fmt.Sprintf("u%d", i), domain.PriorityUrgent, false)
		if op.Priority != domain.PriorityUrgent {
			t.Fatalf("priority = %q", op.Priority)
		}
		if _, err := st.OperationApprove(context.Background(), op.OperationID); err != nil {
			t.Fatal(err)
		}
		urgent = append(urgent, op.OperationID)
	}
	if op, err := st.OperationGet(context.Background(), normal[0]); err != nil || op.Priority != domain.PriorityNormal {
		t.Fatalf("normal op priority = %q, %v", op.Priority, err)
	}
	// Two urgent with a cap of 2: only urgent.
	res := btClaim(t, st, testRepo, 2, store.ClaimClaimed)
	if !slices.Equal(res.OperationIDs, urgent[:2]) {
		t.Fatalf("first claim %v, want the two oldest urgent %v", res.OperationIDs, urgent[:2])
	}
	if _, err := st.BatchSettleSucceeded(context.Background(), res.BatchID, domain.BatchRunning, 1); err != nil {
		t.Fatal(err)
	}
	res = btClaim(t, st, testRepo, 4, store.ClaimClaimed)
	if want := append([]string{urgent[2]}, normal[:3]...); !slices.Equal(res.OperationIDs, want) {
		t.Fatalf("second claim %v, want %v", res.OperationIDs, want)
	}
	// A follow-up claim (after a settle) goes on for urgent work only.
	if _, err := st.BatchSettleSucceeded(context.Background(), res.BatchID, domain.BatchRunning, 1); err != nil {
		t.Fatal(err)
	}
	if r, err := st.BatchClaimFollowUp(context.Background(), testRepo, 10); err != nil || r.Outcome != store.ClaimNothingToClaim {
		t.Fatalf("follow-up with only normal work = %+v, %v", r, err)
	}
	u := qcCreate(t, st, "u-late", domain.PriorityUrgent, true)
	r, err := st.BatchClaimFollowUp(context.Background(), testRepo, 2)
	if err != nil || r.Outcome != store.ClaimClaimed || !slices.Equal(r.OperationIDs, []string{u.OperationID, normal[3]}) {
		t.Fatalf("follow-up with urgent work = %+v, %v", r, err)
	}
	if _, _, err := st.OperationCreate(context.Background(), store.OperationCreateParams{
		OperationID: uuid.NewString(), Subject: "x", Target: "t", Repo: testRepo, Action: domain.ActionGrant, Priority: "high",
	}); !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("unknown priority: %v", err)
	}
}

// A paused repository is not claimed (the precheck and the claim both say paused);
// admission and approval go on; resume, or the end time passing by the DB clock,
// lets the next claim take the work. Each pause and resume is in the repository's
// history.
func TestPauseStopsClaims(t *testing.T) {
	st, dsn := storetest.New(t)
	other := storetest.Open(t, dsn, 4) // a second replica
	ctx := context.Background()
	if err := st.RepoControlEnsure(ctx, []string{testRepo, "other/repo"}); err != nil {
		t.Fatal(err)
	}
	c, err := st.RepoPause(ctx, store.RepoPauseParams{Repo: testRepo, Reason: "release 4.2 freeze", By: "admin"})
	if err != nil || !c.Paused || c.Reason != "release 4.2 freeze" || c.PausedBy != "admin" || c.PausedUntil != nil {
		t.Fatalf("pause = %+v, %v", c, err)
	}
	qcCreate(t, st, "a", "", true)
	op := qcCreate(t, st, "b", "", false)
	if _, err := st.OperationApprove(ctx, op.OperationID); err != nil {
		t.Fatalf("approval while paused: %v", err)
	}
	pre, err := other.BatchClaimPrecheck(ctx, testRepo)
	if err != nil || !pre.Paused || !pre.Waiting {
		t.Fatalf("precheck = %+v, %v", pre, err)
	}
	btClaim(t, other, testRepo, 10, store.ClaimPaused)
	// Pausing again is idempotent: still paused, the newer reason.
	if c, err = other.RepoPause(ctx, store.RepoPauseParams{Repo: testRepo, Reason: "still frozen", By: "admin"}); err != nil || !c.Paused || c.Reason != "still frozen" {
		t.Fatalf("second pause = %+v, %v", c, err)
	}
	if c, err = st.RepoResume(ctx, testRepo, "admin"); err != nil || c.Paused {
		t.Fatalf("resume = %+v, %v", c, err)
	}
	if c, err = st.RepoResume(ctx, testRepo, "admin"); err != nil || c.Paused {
		t.Fatalf("second resume = %+v, %v", c, err)
	}
	res := btClaim(t, other, testRepo, 10, store.ClaimClaimed)
	if len(res.OperationIDs) != 2 {
		t.Fatalf("claimed %d after resume, want 2", len(res.OperationIDs))
	}

	// A pause with an end time ends by itself, by the database clock.
	until := time.Now().Add(time.Hour)
	if c, err = st.RepoPause(ctx, store.RepoPauseParams{Repo: "other/repo", Reason: "window", Until: &until, By: "ops"}); err != nil || !c.Paused || c.PausedUntil == nil {
		t.Fatalf("pause until = %+v, %v", c, err)
	}
	storetest.InsertQueuedOps(t, st, "other/repo", 2)
	btClaim(t, st, "other/repo", 10, store.ClaimPaused)
	if _, err := st.DB().Exec("UPDATE repo_control SET paused_until = CURRENT_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE repo = 'other/repo'"); err != nil {
		t.Fatal(err)
	}
	cs, err := st.RepoControls(ctx, []string{"other/repo", "never/seen"})
	if err != nil || cs["other/repo"].Paused || cs["never/seen"].Paused {
		t.Fatalf("controls after the end time = %+v, %v", cs, err)
	}
	btClaim(t, st, "other/repo", 10, store.ClaimClaimed)
	past := time.Now().Add(-time.Minute)
	if _, err := st.RepoPause(ctx, store.RepoPauseParams{Repo: "other/repo", Reason: "x", Until: &past}); !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("pause until the past: %v", err)
	}

	evs, err := st.RepoEvents(ctx, testRepo, 10)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, e := range evs {
		codes = append(codes, e.Code)
	}
	if want := []string{store.EventRepoPaused, store.EventRepoPaused, store.EventRepoResumed}; !slices.Equal(codes, want) {
		t.Fatalf("repository history %v, want %v", codes, want)
	}
}

// A pause that arrives while a claim is between its read of the pause and its commit
// waits for that claim (the batch in flight); once the pause has been answered, no
// claim on any replica makes a batch.
func TestPauseOrdersAgainstClaimInFlight(t *testing.T) {
	st, dsn := storetest.New(t)
	ctx := context.Background()
	if err := st.RepoControlEnsure(ctx, []string{testRepo}); err != nil {
		t.Fatal(err)
	}
	storetest.InsertQueuedOps(t, st, testRepo, 3)
	pauser := storetest.Open(t, dsn, 4)
	paused := make(chan time.Time, 1)
	var committed atomic.Bool
	st.Hooks = &store.Hooks{ClaimAfterUpdate: func(ctx context.Context, batchID int64) {
		go func() {
			if _, err := pauser.RepoPause(context.Background(), store.RepoPauseParams{Repo: testRepo, Reason: "freeze", By: "admin"}); err != nil {
				t.Error(err)
			}
			if !committed.Load() {
				t.Error("the pause was answered before the claim in flight committed")
			}
			paused <- time.Now()
		}()
		time.Sleep(300 * time.Millisecond) // the pause is now waiting on the control row
	}}
	res := btClaim(t, st, testRepo, 10, store.ClaimClaimed)
	committed.Store(true)
	st.Hooks = nil
	<-paused
	storetest.InsertQueuedOps(t, st, testRepo, 1)
	if _, err := st.BatchSettleSucceeded(ctx, res.BatchID, domain.BatchRunning, 1); err != nil {
		t.Fatal(err)
	}
	btClaim(t, pauser, testRepo, 10, store.ClaimPaused)
}

// Withdrawal from pending_approval and from queued: withdrawn, out of the waiting set,
// the binding back to what the repository holds, a new application accepted; a
// claimed operation answers ErrInBatch; a repeat is a no-op.
func TestWithdraw(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	pending := qcCreate(t, st, "p", "", false)
	queued := qcCreate(t, st, "q", domain.PriorityUrgent, true)
	claimed := qcCreate(t, st, "c", "", true)
	for _, op := range []domain.Operation{pending, queued} {
		w, err := st.OperationWithdraw(ctx, op.OperationID, "alice")
		if err != nil || w.Status != domain.OpWithdrawn {
			t.Fatalf("withdraw %s: %+v, %v", op.Status, w, err)
		}
		if w2, err := st.OperationWithdraw(ctx, op.OperationID, "alice"); err != nil || w2.Status != domain.OpWithdrawn || w2.Version != w.Version {
			t.Fatalf("repeat withdraw: %+v, %v", w2, err)
		}
		bs, err := st.BindingList(ctx, op.Subject, op.Target, 0, 10)
		if err != nil || len(bs) != 1 || bs[0].Status != domain.BindingClosed {
			t.Fatalf("binding after withdraw = %+v, %v", bs, err)
		}
		// The relation takes a new application.
		qcCreate(t, st, op.Subject, "", false)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ?", queued.OperationID); n != 0 {
		t.Fatalf("withdrawn operation still has %d waiting rows", n)
	}
	res := btClaim(t, st, testRepo, 10, store.ClaimClaimed)
	if !slices.Equal(res.OperationIDs, []string{claimed.OperationID}) {
		t.Fatalf("claimed %v, want only %s", res.OperationIDs, claimed.OperationID)
	}
	if _, err := st.OperationWithdraw(ctx, claimed.OperationID, ""); !errors.Is(err, store.ErrInBatch) {
		t.Fatalf("withdraw in_batch: %v", err)
	}
	if _, err := st.BatchSettleSucceeded(ctx, res.BatchID, domain.BatchRunning, 1); err != nil {
		t.Fatal(err)
	}

	// A revoke withdrawn: the binding is active again (the file stays).
	p := grant(claimed.Subject, claimed.Target)
	p.Action = domain.ActionRevoke
	rv, _, err := st.OperationCreate(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.OperationWithdraw(ctx, rv.OperationID, ""); err != nil {
		t.Fatal(err)
	}
	bs, err := st.BindingList(ctx, claimed.Subject, claimed.Target, 0, 10)
	if err != nil || len(bs) != 1 || bs[0].Status != domain.BindingActive {
		t.Fatalf("binding after a withdrawn revoke = %+v, %v", bs, err)
	}
	evs, err := st.OperationEvents(ctx, rv.OperationID)
	if err != nil || evs[len(evs)-1].Code != store.EventWithdrawn {
		t.Fatalf("events = %+v, %v", evs, err)
	}
	// A rejected operation is not withdrawn.
	rj := qcCreate(t, st, "r", "", false)
	if _, err := st.OperationReject(ctx, rj.OperationID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.OperationWithdraw(ctx, rj.OperationID, ""); !errors.Is(err, store.ErrStale) {
		t.Fatalf("withdraw rejected: %v", err)
	}
	if _, err := st.OperationWithdraw(ctx, uuid.NewString(), ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("withdraw unknown: %v", err)
	}
}

// Withdrawals racing claims, for real: several "replicas" (stores with pools of their
// own) claim and settle a repository round after round while several withdrawers
// withdraw every operation, in random order and at random moments. Every operation
// ends in exactly one of two ways: withdrawn and never a member of any batch, or
// ErrInBatch and a member of exactly one batch — never both, never neither.
func TestWithdrawRacesClaim(t *testing.T) {
	st, dsn := storetest.New(t)
	ctx := context.Background()
	replicas := []*store.Store{st, storetest.Open(t, dsn, 16), storetest.Open(t, dsn, 16)}
	const rounds, perRound, claimers, withdrawers = 8, 100, 3, 4
	var nWithdrawn, nInBatch, nClaims, nPreempted atomic.Int64
	for round := range rounds {
		ids := storetest.InsertQueuedOps(t, st, testRepo, perRound)
		order := slices.Clone(ids)
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		outcome := make([]error, len(order))
		var next atomic.Int64
		var wg sync.WaitGroup
		done := make(chan struct{})
		for w := range withdrawers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rs := replicas[w%len(replicas)]
				for {
					i := int(next.Add(1)) - 1
					if i >= len(order) {
						return
					}
					if rand.IntN(4) == 0 {
						time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
					}
					_, outcome[i] = rs.OperationWithdraw(ctx, order[i], "racer")
				}
			}()
		}
		var cwg sync.WaitGroup
		for c := range claimers {
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				rs := replicas[c%len(replicas)]
				for {
					select {
					case <-done:
						return
					default:
					}
					res, err := rs.BatchClaim(ctx, testRepo, 1+rand.IntN(9))
					if err != nil && !errors.Is(err, store.ErrLostRace) {
						t.Error(err)
						return
					}
					nClaims.Add(1)
					switch res.Outcome {
					case store.ClaimPreempted:
						nPreempted.Add(1)
					case store.ClaimClaimed:
						// A settlement can lose a deadlock to the claims and withdrawals
						// around it (ErrLostRace): the scanner settles again; so does this.
						for attempt := 0; ; attempt++ {
							_, err := rs.BatchSettleSucceeded(ctx, res.BatchID, domain.BatchRunning, 1)
							if err == nil {
								break
							}
							if !errors.Is(err, store.ErrLostRace) || attempt == 20 {
								t.Error(err)
								return
							}
						}
					}
				}
			}()
		}
		wg.Wait()
		close(done)
		cwg.Wait()
		for i, id := range order {
			op, err := st.OperationGet(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			members := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_member WHERE operation_id = ?", id)
			waiting := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ? AND batch_id IS NULL", id)
			switch {
			case outcome[i] == nil:
				nWithdrawn.Add(1)
				if op.Status != domain.OpWithdrawn || members != 0 || waiting != 0 {
					t.Fatalf("round %d: %s withdrawn, but status %s, %d member rows, %d waiting rows", round, id, op.Status, members, waiting)
				}
			case errors.Is(outcome[i], store.ErrInBatch):
				nInBatch.Add(1)
				if op.Status != domain.OpMerged || members != 1 {
					t.Fatalf("round %d: %s answered in_batch, but status %s, %d member rows", round, id, op.Status, members)
				}
			default:
				t.Fatalf("round %d: withdraw %s: %v", round, id, outcome[i])
			}
		}
		// Nothing is left waiting: every operation was withdrawn or claimed.
		if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id IS NULL"); n != 0 {
			t.Fatalf("round %d: %d rows still waiting", round, n)
		}
	}
	t.Logf("%d rounds × %d operations: %d withdrawn, %d answered in_batch; %d claims, %d preempted",
		rounds, perRound, nWithdrawn.Load(), nInBatch.Load(), nClaims.Load(), nPreempted.Load())
	if nWithdrawn.Load() == 0 || nInBatch.Load() == 0 {
		t.Fatalf("the race never went both ways (%d withdrawn, %d in_batch): the test proved nothing", nWithdrawn.Load(), nInBatch.Load())
	}
}
