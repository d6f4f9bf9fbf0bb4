package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// tableRows counts the rows of every table of the test's database but goose's.
func tableRows(t *testing.T, st *store.Store) map[string]int {
	t.Helper()
	var tables []string
	if err := st.DB().Select(&tables, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name <> 'goose_db_version'`); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, tb := range tables {
		var n int
		if err := st.DB().Get(&n, "SELECT COUNT(*) FROM `"+tb+"`"); err != nil {
			t.Fatal(err)
		}
		out[tb] = n
	}
	return out
}

// TestAdmissionRows counts the rows one auto-approved admission writes, in every
// table (issue 20: at most 3 without an Idempotency-Key, 4 with one): the operation,
// its binding and its waiting row, plus the key when one is sent. The created and
// admitted events are derived from the operation row, and the event log reads as it
// did when they were audit rows.
func TestAdmissionRows(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	paths := []struct {
		name   string
		create func(context.Context, store.OperationCreateParams) (domain.Operation, bool, error)
	}{{"grouped", st.OperationCreate}, {"serial", st.OperationCreateSerial}}
	for _, path := range paths {
		for _, keyed := range []bool{false, true} {
			before := tableRows(t, st)
			p := grant("rows-"+path.name+"-"+uuid.NewString()[:8], "t")
			p.AutoApprove, p.RequestedBy = true, "alice"
			want := map[string]int{"operation": 1, "binding": 1, "merge_batch_request": 1}
			if keyed {
				p.IdempotencyKey, p.Fingerprint = uuid.NewString(), "fp"
				want["idempotency_key"] = 1
			}
			op, created, err := path.create(ctx, p)
			if err != nil || !created {
				t.Fatalf("%s keyed=%v: created=%v err=%v", path.name, keyed, created, err)
			}
			after := tableRows(t, st)
			total := 0
			for tb, n := range after {
				if d := n - before[tb]; d != want[tb] {
					t.Errorf("%s keyed=%v: %d row(s) written in %s, want %d", path.name, keyed, d, tb, want[tb])
				} else {
					total += d
				}
			}
			limit := 3
			if keyed {
				limit = 4
			}
			t.Logf("%s admission, key=%v: %d rows", path.name, keyed, total)
			if total > limit {
				t.Errorf("%s keyed=%v: %d rows, want at most %d", path.name, keyed, total, limit)
			}

			evs, err := st.OperationEvents(ctx, op.OperationID)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range evs {
				got = append(got, e.Code+"/"+e.Actor)
				if !e.CreatedAt.Equal(op.CreatedAt) {
					t.Errorf("%s: event %s at %v, want the operation's created_at %v", path.name, e.Code, e.CreatedAt, op.CreatedAt)
				}
			}
			if w := []string{store.EventCreated + "/alice", store.EventAdmitted + "/" + store.AutoApprover}; !slices.Equal(got, w) {
				t.Errorf("%s: events %v, want %v", path.name, got, w)
			}
			if evs[0].Detail != "grant "+p.Subject+" → t" || evs[1].Detail != "auto-approved" {
				t.Errorf("%s: details %q, %q", path.name, evs[0].Detail, evs[1].Detail)
			}
		}
	}

	// With one event receiver configured, the operation.queued event is one more row
	// in the same transaction (the outbox), and only then.
	st.SetEventReceivers([]int64{domain.ReceiverID("audit", "")})
	for _, path := range paths {
		before := tableRows(t, st)
		p := grant("rows-outbox-"+path.name, "t")
		p.AutoApprove, p.RequestedBy = true, "alice"
		p.IdempotencyKey, p.Fingerprint = uuid.NewString(), "fp"
		if _, created, err := path.create(ctx, p); err != nil || !created {
			t.Fatalf("%s with a receiver: created=%v err=%v", path.name, created, err)
		}
		want := map[string]int{"operation": 1, "binding": 1, "merge_batch_request": 1, "idempotency_key": 1, "event_outbox": 1}
		for tb, n := range tableRows(t, st) {
			if d := n - before[tb]; d != want[tb] {
				t.Errorf("%s with a receiver: %d row(s) written in %s, want %d", path.name, d, tb, want[tb])
			}
		}
	}
	st.SetEventReceivers(nil)

	// An operation that waits for approval: created is derived, approved and admitted
	// are written by the approval, in that order.
	p := grant("rows-pending", "t")
	p.RequestedBy = "alice"
	op := mustCreate(t, st, p)
	before := tableRows(t, st)
	if _, err := st.OperationApprove(ctx, op.OperationID); err != nil {
		t.Fatal(err)
	}
	evs, err := st.OperationEvents(ctx, op.OperationID)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, e := range evs {
		codes = append(codes, e.Code)
	}
	if w := []string{store.EventCreated, store.EventApproved, store.EventAdmitted}; !slices.Equal(codes, w) {
		t.Errorf("approved later: events %v, want %v", codes, w)
	}
	if d := tableRows(t, st)["audit_event"] - before["audit_event"]; d != 2 {
		t.Errorf("approval wrote %d audit rows, want 2 (approved, admitted)", d)
	}
}
