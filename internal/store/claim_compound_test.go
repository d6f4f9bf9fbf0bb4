package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// The set-based claim writes each member's why with whySQL over the waiting row it has
// just claimed; the statement path with waitingRow.why over the row it read. Both must
// write the same text for every kind of round.
func TestClaimWhySQLMatchesWhy(t *testing.T) {
	st, _ := storetest.New(t)
	parent := int64(42)
	type row struct {
		kind                        string
		parent                      *int64
		depth, half, retries, tries int
	}
	// Every kind of round (first try, retries of two classes, bisection parts and the
	// deferred remainder), with and without a parent, over small counters.
	var cases []row
	for _, kind := range []string{domain.KindFirstTry, domain.KindRetryPrefix + "infra", domain.KindRetryPrefix + "flaky", domain.KindBisect} {
		for _, p := range []*int64{nil, &parent} {
			for half := 0; half <= 2; half++ {
				for tries := 0; tries <= 2; tries++ {
					cases = append(cases, row{kind, p, half + 1, half, tries, tries})
				}
			}
		}
	}
	for i, c := range cases {
		// The row as the claim leaves it: its tries count this round, except in a
		// bisection.
		after := c.tries
		if c.kind != domain.KindBisect {
			after++
		}
		op := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		if _, err := st.DB().Exec(`INSERT INTO merge_batch_request (operation_id, repo, batch_id, kind, parent_id, depth, half, retries, tries)
			VALUES (?, 'group/why', 7, ?, ?, ?, ?, ?, ?)`, op, c.kind, c.parent, c.depth, c.half, c.retries, after); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := st.DB().Get(&got, "SELECT "+store.WhySQL+" FROM merge_batch_request WHERE operation_id = ?", op); err != nil {
			t.Fatal(err)
		}
		if want := store.WhyOf(c.kind, c.parent, c.depth, c.half, c.retries, c.tries); got != want {
			t.Errorf("%+v: whySQL %q, why %q", c, got, want)
		}
	}
}

// sessionQuestions is the statements the server counted on st's one connection.
func sessionQuestions(t *testing.T, st *store.Store) int {
	t.Helper()
	var name string
	var n int
	if err := st.DB().QueryRow("SHOW SESSION STATUS LIKE 'Questions'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A losing claimant is answered by one statement on MariaDB: the precheck, the slot
// attempt and, when it began one, the transaction's end are one compound statement —
// whether a committed batch holds the slot, a claim in flight holds it, or nothing
// waits. (Questions counts the SHOW too: one per reading.)
func TestLosingClaimIsOneStatement(t *testing.T) {
	holder, dsn := storetest.New(t)
	ctx := context.Background()
	loser := storetest.Open(t, dsn, 1)
	if !loser.SlotNoWait() {
		t.Skip("this server does not take the no-wait slot INSERT")
	}
	const repo = "group/one-statement"
	btClaim(t, loser, repo, 10, store.ClaimNothingToClaim) // probes and caches done

	statements := func(want store.ClaimOutcome) int {
		t.Helper()
		before := sessionQuestions(t, loser)
		btClaim(t, loser, repo, 10, want)
		return sessionQuestions(t, loser) - before - 1
	}
	if n := statements(store.ClaimNothingToClaim); n != 1 {
		t.Errorf("nothing to claim: %d statements, want 1", n)
	}
	storetest.InsertQueuedOps(t, holder, repo, 3)

	// A claim in flight holds the slot (its row inserted, uncommitted).
	read, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	holder.Hooks = &store.Hooks{ClaimAfterRead: func(context.Context, int64, []int64) {
		close(read)
		<-release
	}}
	var held store.ClaimResult
	go func() {
		defer close(done)
		held = btClaim(t, holder, repo, 10, store.ClaimClaimed)
	}()
	<-read
	n := statements(store.ClaimSlotOccupied)
	close(release)
	<-done
	holder.Hooks = nil
	if n != 1 {
		t.Errorf("slot held by a claim in flight: %d statements, want 1", n)
	}

	// A committed batch holds the slot.
	storetest.InsertQueuedOps(t, holder, repo, 2)
	if n := statements(store.ClaimSlotOccupied); n != 1 {
		t.Errorf("slot held by batch %d: %d statements, want 1", held.BatchID, n)
	}
	// The slot is free again: the winner's claim is two statements.
	if _, err := holder.BatchSettleSucceeded(ctx, held.BatchID, domain.BatchRunning, 1); err != nil {
		t.Fatal(err)
	}
	if n := statements(store.ClaimClaimed); n != 2 {
		t.Errorf("a claim: %d statements, want 2", n)
	}
}

// A claim on the compound path whose context is cancelled before its COMMIT answers
// context.Canceled and leaves nothing behind: the pinned connection's transaction is
// rolled back before the connection goes back to the pool.
func TestCompoundClaimCancelledBeforeCommit(t *testing.T) {
	st, _ := storetest.New(t)
	if !st.SlotNoWait() {
		t.Skip("this server does not take the no-wait slot INSERT")
	}
	const repo = "group/compound-cancel"
	storetest.InsertQueuedOps(t, st, repo, 2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st.Hooks = &store.Hooks{ClaimAfterUpdate: func(context.Context, int64) { cancel() }}
	_, err := st.BatchClaim(ctx, repo, 10)
	st.Hooks = nil
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("claim cancelled before COMMIT returned %v, want context.Canceled", err)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch"); n != 0 {
		t.Fatalf("%d batches after the cancelled claim, want 0", n)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id IS NULL"); n != 2 {
		t.Fatalf("%d rows wait after the cancelled claim, want 2", n)
	}
	// The connection went back clean: the next claim takes both rows.
	if res := btClaim(t, st, repo, 10, store.ClaimClaimed); len(res.OperationIDs) != 2 {
		t.Fatalf("claim after the cancelled one took %d", len(res.OperationIDs))
	}
}
