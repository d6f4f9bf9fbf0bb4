package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// The timeout sweep does not take a batch without an MR from a live publish
// reservation (its publisher may be opening the MR right now); it takes it once the
// reservation lapses, and always takes a batch that has an MR. Regression of a chaos
// run finding: a timeout settled a batch mid-publish, the publisher then opened the MR
// of a FAILED batch, and a human merged it.
func TestTimedOutSkipsALivePublishReservation(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	storetest.InsertQueuedOps(t, st, "group/x", 2)
	res := btClaim(t, st, "group/x", 10, store.ClaimClaimed)
	time.Sleep(20 * time.Millisecond)
	timedOut := func() []domain.Batch {
		t.Helper()
		out, err := st.BatchesTimedOut(ctx, time.Millisecond, 10)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Due (never reserved): a candidate.
	if out := timedOut(); len(out) != 1 || out[0].ID != res.BatchID {
		t.Fatalf("unreserved batch without MR: %+v, want it", out)
	}
	b, _ := st.BatchGet(ctx, res.BatchID)
	b, err := st.BatchReserve(ctx, b.ID, b.Version, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if out := timedOut(); len(out) != 0 {
		t.Fatalf("batch without MR under a live publish reservation: %+v, want none", out)
	}
	// A webhook hint (GitLab sends pipeline events for the branch before the MR exists)
	// does not lapse the publisher's reservation.
	if err := st.BatchMarkDue(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if out := timedOut(); len(out) != 0 {
		t.Fatalf("a webhook hint lapsed a live publish reservation: %+v, want none", out)
	}
	// The reservation lapses.
	b, err = st.BatchReserve(ctx, b.ID, b.Version, time.Microsecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	if out := timedOut(); len(out) != 1 {
		t.Fatalf("lapsed reservation: %+v, want the batch", out)
	}
	// With an MR recorded, a reservation (a reconcile pass) does not shield it.
	b, err = st.BatchReserve(ctx, b.ID, b.Version, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.BatchRecordMR(ctx, b.ID, b.Version, store.MRRecord{IID: 7, URL: "http://x/7", SHA: "abc"}); err != nil {
		t.Fatal(err)
	}
	if out := timedOut(); len(out) != 1 || out[0].MRIID == nil {
		t.Fatalf("reserved batch with an MR: %+v, want it", out)
	}
}
