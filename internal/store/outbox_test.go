package store_test

// The transactional outbox (outbox.go): every change the contract lists writes its
// event rows in its own transaction, one per receiver with one event id; a change that
// rolls back writes none; no receiver, no rows; the dispatcher's reads keep one
// operation's events in order per receiver, reservations race safely, and the purge
// goes in bounded chunks.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

type obRow struct {
	ID       int64  `db:"id"`
	Receiver int64  `db:"receiver"`
	EventID  string `db:"event_id"`
	Type     string `db:"type"`
	OrderKey string `db:"order_key"`
}

func obRows(t *testing.T, st *store.Store) []obRow {
	t.Helper()
	var rows []obRow
	if err := st.DB().Select(&rows, "SELECT id, receiver, event_id, type, order_key FROM event_outbox ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	return rows
}

// obTypes returns, per order key, the event types of receiver r in id order, and
// checks that every event has exactly one row per receiver under one event id.
func obTypes(t *testing.T, st *store.Store, receivers int) map[string][]string {
	t.Helper()
	perEvent := map[string][]int64{}
	out := map[string][]string{}
	for _, r := range obRows(t, st) {
		perEvent[r.EventID] = append(perEvent[r.EventID], r.Receiver)
		if r.Receiver == 0 {
			out[r.OrderKey] = append(out[r.OrderKey], r.Type)
		}
	}
	for id, rs := range perEvent {
		if len(rs) != receivers {
			t.Fatalf("event %s has rows for receivers %v, want one for each of %d", id, rs, receivers)
		}
	}
	return out
}

func TestOutboxEventsWrittenWithTheirChange(t *testing.T) {
	st, dsn := storetest.New(t)
	st.SetEventReceivers([]int64{0, 1})
	ctx := context.Background()

	auto := grant("ob-auto", "db/x")
	auto.AutoApprove = true
	a := mustCreate(t, st, auto)
	b := mustCreate(t, st, grant("ob-approved", "db/x"))
	if _, err := st.OperationApproveBy(ctx, b.OperationID, "bob", true); err != nil {
		t.Fatal(err)
	}
	c := mustCreate(t, st, store.OperationCreateParams{OperationID: uuid.NewString(), Subject: "ob-rejected", Target: "db/x",
		Repo: testRepo, Action: domain.ActionGrant, RequestedBy: "alice"})
	// A refused change (four eyes) rolls back and writes no event.
	if _, err := st.OperationApproveBy(ctx, c.OperationID, "alice", true); !errors.Is(err, store.ErrSelfApproval) {
		t.Fatalf("self-approval = %v", err)
	}
	if _, err := st.OperationRejectBy(ctx, c.OperationID, "bob"); err != nil {
		t.Fatal(err)
	}
	// Withdrawn while pending, and while queued (a repeat writes nothing more).
	w1 := mustCreate(t, st, store.OperationCreateParams{OperationID: uuid.NewString(), Subject: "ob-withdrawn", Target: "db/x",
		Repo: testRepo, Action: domain.ActionGrant, RequestedBy: "alice"})
	w2p := grant("ob-withdrawn-queued", "db/x")
	w2p.AutoApprove = true
	w2 := mustCreate(t, st, w2p)
	for _, id := range []string{w1.OperationID, w2.OperationID, w2.OperationID} {
		if _, err := st.OperationWithdraw(ctx, id, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	// A replica without receivers writes none (BATCHERD_EVENTS_URL empty).
	quiet := storetest.Open(t, dsn, 4)
	none := grant("ob-none", "db/x")
	none.AutoApprove, none.Repo = true, "platform/quiet" // never claimed here
	n := mustCreate(t, quiet, none)

	res := btClaim(t, st, testRepo, 10, store.ClaimClaimed)
	bt, err := st.BatchRecordMR(ctx, res.BatchID, 1, store.MRRecord{IID: 7, URL: "https://gitlab.example/mr/7", SHA: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.BatchSettleSucceeded(ctx, bt.ID, domain.BatchRunning, bt.Version); err != nil {
		t.Fatal(err)
	}

	// A failed batch: one member fails, one is requeued for bisection (not failed: no event).
	f1, f2 := grant("ob-fail", "db/y"), grant("ob-requeue", "db/y")
	f1.AutoApprove, f2.AutoApprove = true, true
	mustCreate(t, st, f1)
	mustCreate(t, st, f2)
	res2 := btClaim(t, st, testRepo, 10, store.ClaimClaimed)
	if _, err := st.BatchSettleRequeue(ctx, res2.BatchID, domain.BatchRunning, 1, domain.FailureClass("test_failure"), "pipeline failed",
		[]store.MemberFate{{OperationID: f1.OperationID, Code: "culprit", Message: "broke the tests"},
			{OperationID: f2.OperationID, Group: "g1", Kind: "bisect", Depth: 1, Half: 1}}); err != nil {
		t.Fatal(err)
	}

	got := obTypes(t, st, 2)
	want := map[string][]string{
		a.OperationID:                      {store.EventTypeOperationQueued, store.EventTypeOperationMerged},
		b.OperationID:                      {store.EventTypeOperationQueued, store.EventTypeOperationMerged},
		c.OperationID:                      {store.EventTypeOperationRejected},
		w1.OperationID:                     {store.EventTypeOperationWithdrawn},
		w2.OperationID:                     {store.EventTypeOperationQueued, store.EventTypeOperationWithdrawn},
		f1.OperationID:                     {store.EventTypeOperationQueued, store.EventTypeOperationFailed},
		f2.OperationID:                     {store.EventTypeOperationQueued},
		fmt.Sprint("batch:", bt.ID):        {store.EventTypeBatchOpened, store.EventTypeBatchSucceeded},
		fmt.Sprint("batch:", res2.BatchID): {store.EventTypeBatchOpened, store.EventTypeBatchFailed},
	}
	if _, ok := got[n.OperationID]; ok {
		t.Fatalf("a replica without receivers wrote events: %v", got[n.OperationID])
	}
	for k, w := range want {
		if strings.Join(got[k], ",") != strings.Join(w, ",") {
			t.Errorf("events of %s = %v, want %v", k, got[k], w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("events for %d keys, want %d: %v", len(got), len(want), got)
	}

	// The bodies say what the change left: the merged operation names its batch, the
	// failed one its reason, the succeeded batch its MR.
	due, err := st.OutboxDue(ctx, []int64{0, 1}, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(due) != 2*len(got) {
		t.Fatalf("%d rows due, want the first event of each of the %d keys for both receivers", len(due), len(got))
	}
	for _, r := range due {
		if r.Type != got[r.OrderKey][0] {
			t.Fatalf("due before its predecessor was delivered: %s of %s (events %v)", r.Type, r.OrderKey, got[r.OrderKey])
		}
	}
	var bodies []string
	if err := st.DB().Select(&bodies, `SELECT CONCAT(type, ' ', COALESCE(operation_json, batch_json)) FROM event_outbox WHERE receiver = 0 ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	all := strings.Join(bodies, "\n")
	for _, s := range []string{`"mr_url":"https://gitlab.example/mr/7"`, `"error_code":"culprit","error_message":"broke the tests"`,
		`operation.merged {"id":"` + a.OperationID + `","subject":"ob-auto","target":"db/x","repo":"platform/access","action":"grant","status":"merged","batch_id":`} {
		if !strings.Contains(all, s) {
			t.Errorf("bodies lack %s:\n%s", s, all)
		}
	}
}

// Admissions in groups (admit_group.go, both statement modes) write one queued event
// per auto-approved operation and receiver in the group's own statements.
func TestOutboxAdmissionGroups(t *testing.T) {
	st, _ := storetest.New(t)
	st.SetEventReceivers([]int64{0, 1, 2})
	ctx := context.Background()
	const n = 120
	var wg sync.WaitGroup
	ids := make([]string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := grant(fmt.Sprintf("grp-%03d", i), "db/g")
			p.AutoApprove = i%2 == 0
			ids[i] = p.OperationID
			if _, _, err := st.OperationCreate(ctx, p); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got := obTypes(t, st, 3)
	for i, id := range ids {
		want := ""
		if i%2 == 0 {
			want = store.EventTypeOperationQueued
		}
		if strings.Join(got[id], ",") != want {
			t.Fatalf("operation %d: events %v, want %q", i, got[id], want)
		}
	}
}

// The dispatcher's store side: one operation's next event is not due before the
// previous one is delivered to that receiver; a reservation is taken once; a failed
// try moves the next one; the purge deletes delivered rows in chunks only.
func TestOutboxDueOrderReserveAndPurge(t *testing.T) {
	st, _ := storetest.New(t)
	st.SetEventReceivers([]int64{0, 1})
	ctx := context.Background()
	p := grant("ord", "db/o")
	p.AutoApprove = true
	mustCreate(t, st, p)
	res := btClaim(t, st, testRepo, 10, store.ClaimClaimed)
	if _, err := st.BatchSettleFailed(ctx, res.BatchID, domain.BatchRunning, 1, "closed", "closed"); err != nil {
		t.Fatal(err)
	}
	typesDue := func(receivers ...int64) map[string]store.OutboxRow {
		t.Helper()
		due, err := st.OutboxDue(ctx, receivers, 100)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]store.OutboxRow{}
		for _, r := range due {
			m[fmt.Sprint(r.Receiver, " ", r.Type)] = r
		}
		return m
	}
	due := typesDue(0, 1)
	if len(due) != 4 || due["0 operation.queued"].ID == 0 || due["1 batch.opened"].ID == 0 {
		t.Fatalf("due = %v, want queued and opened for both receivers", due)
	}
	if len(typesDue(0)) != 2 || len(typesDue(1, 7)) != 2 {
		t.Fatal("rows of a receiver not asked for were read")
	}
	q0 := due["0 operation.queued"]
	if string(q0.Body()) != string(q0.Body()) || !strings.Contains(string(q0.Body()), `"type":"operation.queued"`) {
		t.Fatalf("body %s", q0.Body())
	}
	// Two replicas reserve the same read row: one wins.
	if err := st.OutboxReserve(ctx, q0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := st.OutboxReserve(ctx, q0, time.Minute); !errors.Is(err, store.ErrLostRace) {
		t.Fatalf("second reservation = %v, want ErrLostRace", err)
	}
	if _, ok := typesDue(0, 1)["0 operation.queued"]; ok {
		t.Fatal("a reserved row is due")
	}
	// Failed try: due again after the backoff (0 here), its error kept.
	if err := st.OutboxRetryAt(ctx, q0, 0, "503 Service Unavailable"); err != nil {
		t.Fatal(err)
	}
	q0 = typesDue(0, 1)["0 operation.queued"]
	if q0.Attempts != 1 {
		t.Fatalf("after one try: %+v", q0)
	}
	if err := st.OutboxReserve(ctx, q0, time.Minute); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.OutboxDelivered(ctx, q0.ID); err != nil || !ok {
		t.Fatalf("delivered = %v, %v", ok, err)
	}
	due = typesDue(0, 1)
	if due["0 operation.failed"].ID == 0 || due["1 operation.failed"].ID != 0 || due["1 operation.queued"].ID == 0 {
		t.Fatalf("after receiver 0 got queued: due = %v (receiver 1 must still wait for its own queued)", due)
	}

	// Purge: only delivered rows, chunk by chunk.
	if _, err := st.DB().Exec("UPDATE event_outbox SET delivered_at = CURRENT_TIMESTAMP(6) WHERE receiver = 1"); err != nil {
		t.Fatal(err)
	}
	total := btCount(t, st, "SELECT COUNT(*) FROM event_outbox")
	delivered := btCount(t, st, "SELECT COUNT(*) FROM event_outbox WHERE delivered_at IS NOT NULL")
	if n, err := st.OutboxPurge(ctx, time.Hour, 2); err != nil || n != 0 {
		t.Fatalf("purge of rows delivered within the hour = %d, %v", n, err)
	}
	if n, err := st.OutboxPurge(ctx, 0, 2); err != nil || n != 2 {
		t.Fatalf("first chunk = %d, %v; want 2", n, err)
	}
	if got := btCount(t, st, "SELECT COUNT(*) FROM event_outbox"); got != total-2 {
		t.Fatalf("after one chunk %d rows, want %d", got, total-2)
	}
	for {
		n, err := st.OutboxPurge(ctx, 0, 2)
		if err != nil {
			t.Fatal(err)
		}
		if n < 2 {
			break
		}
	}
	if got := btCount(t, st, "SELECT COUNT(*) FROM event_outbox"); got != total-delivered {
		t.Fatalf("after the purge %d rows, want the %d undelivered", got, total-delivered)
	}
	stats, err := st.OutboxStats(ctx)
	if err != nil || len(stats) != 1 || stats[0].Receiver != 0 || stats[0].Depth != int64(total-delivered) || stats[0].OldestAge < 0 {
		t.Fatalf("stats = %+v, %v", stats, err)
	}
}

// The dispatcher's read (qOutboxDue) with a large delivered history and a backlog:
// the due range through idx_due in index order (no filesort, never the delivered
// rows), the order check through idx_order.
func TestOutboxDuePlan(t *testing.T) {
	st, _ := storetest.New(t)
	// 20,000 delivered rows and 2,000 undelivered (half blocked behind an earlier one).
	if _, err := st.DB().Exec(`INSERT INTO event_outbox (receiver, event_id, type, order_key, operation_json, delivered_at)
		SELECT seq % 2, UUID(), 'operation.queued', CONCAT('op-', seq DIV 4), '{}',
		       IF(seq < 20000, CURRENT_TIMESTAMP(6), NULL)
		  FROM seq_0_to_21999`); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec("ANALYZE TABLE event_outbox"); err != nil {
		t.Fatal(err)
	}
	plan := btExplain(t, st, store.QOutboxDue(2), 0, 1, 200)
	t.Logf("plan: %+v", plan)
	if len(plan) != 2 || plan[0].Table != "o" || plan[0].Key != "idx_due" || strings.Contains(plan[0].Extra, "filesort") ||
		plan[1].Table != "p" || plan[1].Key != "idx_order" {
		t.Fatalf("qOutboxDue plan: %+v", plan)
	}
	due, err := st.OutboxDue(context.Background(), []int64{0, 1}, 5000)
	if err != nil || len(due) != 1000 {
		t.Fatalf("due = %d rows, %v; want the 1,000 heads of the undelivered 2,000", len(due), err)
	}
}
