package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// waitingCreated returns the created_at of each operation's waiting row.
func waitingCreated(t *testing.T, st *store.Store, ids []string) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	for _, id := range ids {
		var ts time.Time
		if err := st.DB().Get(&ts, "SELECT created_at FROM merge_batch_request WHERE operation_id = ?", id); err != nil {
			t.Fatalf("waiting row of %s: %v", id, err)
		}
		out[id] = ts
	}
	return out
}

func eventCodes(t *testing.T, st *store.Store, id string) []string {
	t.Helper()
	evs, err := st.OperationEvents(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		out = append(out, e.Code)
	}
	return out
}

// A failed batch's members go back to the waiting set as two bisection halves (and one
// fails as the culprit) in one transaction; the halves keep their queue position, so
// the next claims take half 1, then half 2, then what was admitted meanwhile — each
// claim one group only, with the same guarded writes.
func TestRequeueBisectionHalvesKeepQueuePosition(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const repo = "g/bisect"
	grants := storetest.InsertQueuedOps(t, st, repo, 6)
	revokes := storetest.InsertOps(t, st, storetest.Ops{Repo: repo, N: 2, Action: domain.ActionRevoke, Admit: true})
	all := append(slices.Clone(grants), revokes...)
	res := btClaim(t, st, repo, 100, store.ClaimClaimed)
	if res.Kind != domain.KindFirstTry || res.Group != "" || len(res.OperationIDs) != 8 {
		t.Fatalf("first claim %+v", res)
	}
	before := waitingCreated(t, st, all)
	time.Sleep(5 * time.Millisecond)
	newer := storetest.InsertQueuedOps(t, st, repo, 3) // admitted while the batch runs

	ms, err := st.BatchWaitingMembers(ctx, res.BatchID)
	if err != nil || len(ms) != 8 {
		t.Fatalf("BatchWaitingMembers = %d, %v", len(ms), err)
	}
	for _, m := range ms {
		if m.Tries != 1 || m.Grp != "" || m.Kind != domain.KindFirstTry {
			t.Fatalf("claimed row %+v, want tries 1 in the ordinary queue", m)
		}
	}
	b, _ := st.BatchGet(ctx, res.BatchID)
	g1, g2 := fmt.Sprintf("b%d.1", b.ID), fmt.Sprintf("b%d.2", b.ID)
	var plan []store.MemberFate
	culprit := ms[7].OperationID // a revoke: its binding goes back to active
	for i, m := range ms[:7] {
		g, half := g1, 1
		if i >= 4 {
			g, half = g2, 2
		}
		plan = append(plan, store.MemberFate{OperationID: m.OperationID, Group: g, Kind: domain.KindBisect, Depth: 1, Half: half, Event: "bisected", Detail: "half"})
	}
	plan = append(plan, store.MemberFate{OperationID: culprit, Code: "culprit", Message: "alone and failing", Event: "culprit"})
	fb, err := st.BatchSettleRequeue(ctx, b.ID, domain.BatchRunning, b.Version, "test", "pipeline failed", plan)
	if err != nil {
		t.Fatal(err)
	}
	if fb.Status != domain.BatchFailed || fb.ErrorCode != "test" || fb.FailClass != "test" || len(fb.OperationIDs) != 8 {
		t.Fatalf("settled batch %+v", fb)
	}
	// A second settle of the same version changes nothing.
	if _, err := st.BatchSettleRequeue(ctx, b.ID, domain.BatchRunning, b.Version, "test", "again", plan); !errors.Is(err, store.ErrLostRace) {
		t.Fatalf("second settle = %v, want ErrLostRace", err)
	}

	requeued := make([]string, 0, 7)
	for _, f := range plan[:7] {
		requeued = append(requeued, f.OperationID)
	}
	btAll(t, "operation", btOpStatus(t, st, requeued), domain.OpQueued)
	if n := btCount(t, st, "SELECT COUNT(*) FROM operation WHERE batch_id IS NULL AND status = 'queued' AND attempts = 1 AND operation_id IN (?,?,?,?,?,?,?)",
		requeued[0], requeued[1], requeued[2], requeued[3], requeued[4], requeued[5], requeued[6]); n != 7 {
		t.Fatalf("%d requeued operations with batch_id NULL and attempts 1, want 7", n)
	}
	if got := btOpStatus(t, st, []string{culprit})[culprit]; got != domain.OpFailed {
		t.Fatalf("culprit %s", got)
	}
	var code string
	_ = st.DB().Get(&code, "SELECT error_code FROM operation WHERE operation_id = ?", culprit)
	if code != "culprit" {
		t.Fatalf("culprit error_code %q", code)
	}
	// Bindings: requeued grants still pending, the requeued revoke still revoking, the
	// failed revoke back to active.
	for id, s := range btBindingStatus(t, st, requeued) {
		if want := map[bool]domain.BindingStatus{true: domain.BindingPending, false: domain.BindingRevoking}[slices.Contains(grants, id)]; s != want {
			t.Fatalf("binding of requeued %s = %s, want %s", id, s, want)
		}
	}
	if s := btBindingStatus(t, st, []string{culprit})[culprit]; s != domain.BindingActive {
		t.Fatalf("binding of the failed revoke = %s, want active", s)
	}
	// Waiting rows: requeued in their groups with created_at unchanged; the culprit's gone.
	after := waitingCreated(t, st, requeued)
	for id, ts := range after {
		if !ts.Equal(before[id]) {
			t.Fatalf("requeued %s moved in the queue: %s → %s", id, before[id], ts)
		}
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ?", culprit); n != 0 {
		t.Fatalf("culprit still has a waiting row")
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id IS NULL AND grp = ? AND parent_id = ? AND depth = 1 AND half = 1 AND kind = 'bisect'", g1, b.ID); n != 4 {
		t.Fatalf("%d rows in %s, want 4", n, g1)
	}
	// Events: batch_failed and the outcome for each member.
	if c := eventCodes(t, st, requeued[0]); !slices.Equal(c, []string{"claimed", "batch_failed", "bisected"}) {
		t.Fatalf("requeued member's events %v", c)
	}
	if c := eventCodes(t, st, culprit); !slices.Equal(c, []string{"claimed", "batch_failed", "culprit"}) {
		t.Fatalf("culprit's events %v", c)
	}

	// The follow-up claim takes half 1 only: 4 rows, bisect at depth 1, not charged.
	h1, err := st.BatchClaimFollowUp(ctx, repo, 100)
	if err != nil || h1.Outcome != store.ClaimClaimed || h1.Group != g1 || h1.Kind != domain.KindBisect || h1.Depth != 1 ||
		h1.ParentID == nil || *h1.ParentID != b.ID || !slices.Equal(h1.OperationIDs, requeued[:4]) {
		t.Fatalf("half 1 claim = %+v, %v", h1, err)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id = ? AND tries = 1", h1.BatchID); n != 4 {
		t.Fatalf("bisection claim charged an attempt (%d of 4 rows at tries 1)", n)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM operation WHERE batch_id = ? AND attempts = 2", h1.BatchID); n != 4 {
		t.Fatalf("operation attempts not counted at claim")
	}
	var why string
	_ = st.DB().Get(&why, "SELECT why FROM merge_batch_member WHERE batch_id = ? LIMIT 1", h1.BatchID)
	if why != fmt.Sprintf("part 1 of failed batch %d, bisection depth 1", b.ID) {
		t.Fatalf("member why %q", why)
	}
	reasons, err := st.BatchMemberReasons(ctx, h1.BatchID)
	if err != nil || len(reasons) != 4 || reasons[requeued[0]] != why {
		t.Fatalf("BatchMemberReasons = %v, %v", reasons, err)
	}
	hb, _ := st.BatchGet(ctx, h1.BatchID)
	if _, err := st.BatchRecordMR(ctx, hb.ID, hb.Version, store.MRRecord{IID: 7, URL: "u", SHA: "s"}); err != nil {
		t.Fatal(err)
	}
	hb, _ = st.BatchGet(ctx, h1.BatchID)
	if _, err := st.BatchSettleSucceeded(ctx, hb.ID, domain.BatchRunning, hb.Version); err != nil {
		t.Fatal(err)
	}
	if c := eventCodes(t, st, requeued[0]); !slices.Equal(c, []string{"claimed", "batch_failed", "bisected", "claimed", "published", "merged", "bystander"}) {
		t.Fatalf("bystander's events %v", c)
	}
	lat, err := st.BatchMergeLatencies(ctx, h1.BatchID)
	if err != nil || len(lat) != 4 || lat[0] <= 0 {
		t.Fatalf("BatchMergeLatencies = %v, %v", lat, err)
	}

	// Then half 2, then the newer ordinary rows; follow-up claims only take groups.
	h2 := btClaim(t, st, repo, 100, store.ClaimClaimed)
	if h2.Group != g2 || !slices.Equal(h2.OperationIDs, requeued[4:]) {
		t.Fatalf("half 2 claim = %+v", h2)
	}
	h2b, _ := st.BatchGet(ctx, h2.BatchID)
	if _, err := st.BatchSettleSucceeded(ctx, h2b.ID, domain.BatchRunning, h2b.Version); err != nil {
		t.Fatal(err)
	}
	if r, err := st.BatchClaimFollowUp(ctx, repo, 100); err != nil || r.Outcome != store.ClaimNothingToClaim {
		t.Fatalf("follow-up with only the ordinary queue waiting = %+v, %v", r, err)
	}
	if n := btActive(t, st, repo); n != 0 {
		t.Fatalf("a rolled-back follow-up left %d active batches", n)
	}
	rest := btClaim(t, st, repo, 100, store.ClaimClaimed)
	if rest.Group != "" || rest.Kind != domain.KindFirstTry || !slices.Equal(rest.OperationIDs, newer) {
		t.Fatalf("ordinary claim = %+v", rest)
	}
}

// A retry group is charged an attempt at its claim; two settlers of the same version
// race and exactly one requeues, once.
func TestRequeueRetryRaceAndCharge(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const repo = "g/retry"
	ids := storetest.InsertQueuedOps(t, st, repo, 20)
	res := btClaim(t, st, repo, 100, store.ClaimClaimed)
	b, _ := st.BatchGet(ctx, res.BatchID)
	g := fmt.Sprintf("b%d.r", b.ID)
	var plan []store.MemberFate
	for _, id := range ids {
		plan = append(plan, store.MemberFate{OperationID: id, Group: g, Kind: domain.KindRetryPrefix + "infra", Retries: 1, Event: "retry_infra"})
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = st.BatchSettleRequeue(ctx, b.ID, domain.BatchRunning, b.Version, "infra", "runner", plan)
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrLostRace):
			t.Fatalf("settle: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d settlers won, want 1", won)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM audit_event WHERE code = 'retry_infra'"); n != 20 {
		t.Fatalf("%d retry events, want 20", n)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id IS NULL AND grp = ? AND retries = 1 AND tries = 1", g); n != 20 {
		t.Fatalf("%d rows requeued for retry, want 20", n)
	}
	r := btClaim(t, st, repo, 100, store.ClaimClaimed)
	if r.Group != g || r.Kind != "retry_infra" || len(r.OperationIDs) != 20 {
		t.Fatalf("retry claim %+v", r)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id = ? AND tries = 2", r.BatchID); n != 20 {
		t.Fatalf("retry claim did not charge an attempt")
	}
	// A plan that names a member not in the batch, or omits one, fails the omitted one
	// with the batch's code: nobody is stranded.
	rb, _ := st.BatchGet(ctx, r.BatchID)
	if _, err := st.BatchSettleRequeue(ctx, rb.ID, domain.BatchRunning, rb.Version, "infra", "again",
		[]store.MemberFate{{OperationID: ids[0], Group: "x", Kind: domain.KindBisect}, {OperationID: "not-a-member", Group: "x"}}); err != nil {
		t.Fatal(err)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM operation WHERE status = 'failed' AND error_code = 'infra'"); n != 19 {
		t.Fatalf("%d members failed with the batch's code, want 19", n)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request"); n != 1 {
		t.Fatalf("%d waiting rows left, want the one requeued", n)
	}
}

// BatchMarkFailing is a guarded write on an active batch: it records the class and
// bumps version, and loses to a stale version.
func TestBatchMarkFailing(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	storetest.InsertQueuedOps(t, st, "g/mark", 1)
	res := btClaim(t, st, "g/mark", 10, store.ClaimClaimed)
	b, _ := st.BatchGet(ctx, res.BatchID)
	nb, err := st.BatchMarkFailing(ctx, b.ID, b.Version, "timeout")
	if err != nil || nb.FailClass != "timeout" || nb.Version != b.Version+1 || nb.Status != domain.BatchRunning {
		t.Fatalf("BatchMarkFailing = %+v, %v", nb, err)
	}
	if _, err := st.BatchMarkFailing(ctx, b.ID, b.Version, "infra"); !errors.Is(err, store.ErrLostRace) {
		t.Fatalf("stale mark = %v, want ErrLostRace", err)
	}
}

// A failing part of a search defers its later siblings to the search's remainder in
// its own settlement: they leave their part groups for the remainder group, queue
// position kept, and the claims then take the failing part's parts first, the
// remainder once they are done, and what was admitted meanwhile last. A settlement that
// lost its race defers nothing; another repository's rows are never touched.
func TestDeferSiblingsToRemainder(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const repo, other = "g/defer", "g/defer-other"
	ids := storetest.InsertQueuedOps(t, st, repo, 8)
	p := btClaim(t, st, repo, 100, store.ClaimClaimed)
	before := waitingCreated(t, st, ids)
	time.Sleep(5 * time.Millisecond)
	newer := storetest.InsertQueuedOps(t, st, repo, 2)
	// The batch of 8 failed: parts of 4, 2, 1, 1.
	ms := failIntoParts(t, st, p.BatchID)
	// Another repository's waiting row in a group of the same name stays where it is.
	stranger := storetest.InsertQueuedOps(t, st, other, 1)
	if _, err := st.DB().Exec("UPDATE merge_batch_request SET grp = ?, kind = 'bisect' WHERE operation_id = ?",
		domain.PartGroup(p.BatchID, p.BatchID, 2), stranger[0]); err != nil {
		t.Fatal(err)
	}
	a, err := st.BatchClaimFollowUp(ctx, repo, 100)
	if err != nil || a.Group != domain.PartGroup(p.BatchID, p.BatchID, 1) || len(a.OperationIDs) != 4 {
		t.Fatalf("part 1 claim = %+v, %v", a, err)
	}
	// Part 1 fails too: its own parts of 2, 1, 1, and parts 2-4 of the batch of 8 are
	// deferred. First a settlement that lost its race: nothing moves.
	var aplan []store.MemberFate
	for i, part := range []int{1, 1, 2, 3} {
		aplan = append(aplan, store.MemberFate{OperationID: a.OperationIDs[i], Group: domain.PartGroup(p.BatchID, a.BatchID, part),
			Kind: domain.KindBisect, Depth: 2, Half: part, Event: "bisected"})
	}
	d := store.Deferral{Repo: repo, Prefix: domain.SiblingPrefix(p.BatchID, p.BatchID), Into: domain.RestGroup(p.BatchID)}
	if _, err := st.BatchSettleIsolate(ctx, a.BatchID, domain.BatchRunning, 99, "test", "failed", aplan, d); !errors.Is(err, store.ErrLostRace) {
		t.Fatalf("stale settle = %v, want ErrLostRace", err)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE grp = ?", d.Into); n != 0 {
		t.Fatalf("a lost settlement deferred %d rows", n)
	}
	if _, err := st.BatchSettleIsolate(ctx, a.BatchID, domain.BatchRunning, 1, "test", "failed", aplan, d); err != nil {
		t.Fatal(err)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE repo = ? AND batch_id IS NULL AND grp = ? AND half = 0 AND kind = 'bisect' AND depth = 1 AND parent_id = ?",
		repo, d.Into, p.BatchID); n != 4 {
		t.Fatalf("%d rows deferred to %s, want 4", n, d.Into)
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE operation_id = ? AND grp = ?", stranger[0], domain.PartGroup(p.BatchID, p.BatchID, 2)); n != 1 {
		t.Fatal("the deferral moved another repository's row")
	}
	var detail string
	if err := st.DB().Get(&detail, "SELECT detail FROM audit_event WHERE batch_id = ? AND code = 'batch_failed' AND operation_id IS NULL", a.BatchID); err != nil ||
		!strings.Contains(detail, "4 waiting member(s) of groups "+d.Prefix+"* deferred to "+d.Into) {
		t.Fatalf("batch event %q, %v", detail, err)
	}
	for id, ts := range waitingCreated(t, st, ids[4:]) {
		if !ts.Equal(before[id]) {
			t.Fatalf("deferred %s moved in the queue: %s → %s", id, before[id], ts)
		}
	}
	// Claims: part 1 of part 1 (2), its parts 2 and 3 (1 each), then the remainder (4),
	// then the newer ordinary rows. Each passes.
	pass := func(want string, n int, follow bool) store.ClaimResult {
		t.Helper()
		var r store.ClaimResult
		if follow {
			r, err = st.BatchClaimFollowUp(ctx, repo, 100)
		} else {
			r, err = st.BatchClaim(ctx, repo, 100)
		}
		if err != nil || r.Outcome != store.ClaimClaimed || r.Group != want || len(r.OperationIDs) != n {
			t.Fatalf("claim = %+v, %v; want group %q of %d", r, err, want, n)
		}
		if _, err := st.BatchSettleSucceeded(ctx, r.BatchID, domain.BatchRunning, 1); err != nil {
			t.Fatal(err)
		}
		return r
	}
	pass(domain.PartGroup(p.BatchID, a.BatchID, 1), 2, true)
	pass(domain.PartGroup(p.BatchID, a.BatchID, 2), 1, true)
	pass(domain.PartGroup(p.BatchID, a.BatchID, 3), 1, true)
	rest := pass(d.Into, 4, true)
	if !slices.Equal(rest.OperationIDs, ms2ids(ms[4:])) {
		t.Fatalf("remainder %v, want %v", rest.OperationIDs, ms2ids(ms[4:]))
	}
	var why string
	_ = st.DB().Get(&why, "SELECT why FROM merge_batch_member WHERE batch_id = ? LIMIT 1", rest.BatchID)
	if !strings.HasPrefix(why, "remainder of a bisection") {
		t.Fatalf("remainder member why %q", why)
	}
	if r, err := st.BatchClaimFollowUp(ctx, repo, 100); err != nil || r.Outcome != store.ClaimNothingToClaim {
		t.Fatalf("follow-up with only the ordinary queue waiting = %+v, %v", r, err)
	}
	last := pass("", 2, false)
	if !slices.Equal(last.OperationIDs, newer) {
		t.Fatalf("ordinary claim %v, want %v", last.OperationIDs, newer)
	}
}

func ms2ids(ms []store.WaitingMember) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.OperationID
	}
	return out
}

// The deferral's UPDATE is a range of idx_repo_group_waiting: it reads (and, under READ
// COMMITTED, locks) only the rows it moves, never the ordinary queue admissions write;
// the resume's reads use the same index.
func TestExplainDeferSiblings(t *testing.T) {
	st, _ := storetest.New(t)
	for r := range 5 {
		storetest.InsertQueuedOps(t, st, fmt.Sprintf("g/explain-%d", r), 200)
	}
	if _, err := st.DB().Exec("UPDATE merge_batch_request SET grp = CONCAT('s1.1.', id % 7), kind = 'bisect' WHERE id % 3 = 0"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().Exec("ANALYZE TABLE merge_batch_request"); err != nil {
		t.Fatal(err)
	}
	rows := btExplain(t, st, store.QDeferSiblings, "s1.rest", "g/explain-2", "s1.1.", "s1.1/")
	if len(rows) != 1 || rows[0].Key != "idx_repo_group_waiting" || rows[0].Type != "range" {
		t.Fatalf("deferral plan %+v, want a range of idx_repo_group_waiting", rows)
	}
	// The resume's reads: the same range (any part still waiting?), and the remainder's
	// rows of one parent, in index order.
	rows = btExplain(t, st, store.QPartsWaiting, "g/explain-2", "s1.1.", "s1.1/")
	if len(rows) != 2 || rows[1].Key != "idx_repo_group_waiting" || rows[1].Type != "range" {
		t.Fatalf("parts-waiting plan %+v, want a range of idx_repo_group_waiting", rows)
	}
	rows = btExplain(t, st, store.QDeferredOf, "g/explain-2", "s1.rest", 7)
	if len(rows) != 1 || rows[0].Key != "idx_repo_group_waiting" || strings.Contains(rows[0].Extra, "filesort") {
		t.Fatalf("deferred-of plan %+v, want idx_repo_group_waiting in index order", rows)
	}
}

// When every part of a failed part merged (its failure was a flake), the siblings its
// failure deferred go back from the remainder to their parent's chain, split again, in
// queue order; other remainder rows stay; nothing happens while a part still waits, or
// twice.
func TestSearchResumeAfterCleanPart(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const repo = "g/resume"
	storetest.InsertQueuedOps(t, st, repo, 8)
	p := btClaim(t, st, repo, 100, store.ClaimClaimed)
	ms := failIntoParts(t, st, p.BatchID)
	// A remainder row of another level (another parent) must stay where it is.
	other := storetest.InsertQueuedOps(t, st, repo, 1)
	if _, err := st.DB().Exec("UPDATE merge_batch_request SET grp = ?, kind = 'bisect', parent_id = 999999 WHERE operation_id = ?",
		domain.RestGroup(p.BatchID), other[0]); err != nil {
		t.Fatal(err)
	}
	a, err := st.BatchClaimFollowUp(ctx, repo, 100)
	if err != nil || len(a.OperationIDs) != 4 {
		t.Fatalf("part 1 claim = %+v, %v", a, err)
	}
	var aplan []store.MemberFate
	for i, part := range []int{1, 1, 2, 3} {
		aplan = append(aplan, store.MemberFate{OperationID: a.OperationIDs[i], Group: domain.PartGroup(p.BatchID, a.BatchID, part),
			Kind: domain.KindBisect, Depth: 2, Half: part, Event: "bisected"})
	}
	d := store.Deferral{Repo: repo, Prefix: domain.SiblingPrefix(p.BatchID, p.BatchID), Into: domain.RestGroup(p.BatchID)}
	if _, err := st.BatchSettleIsolate(ctx, a.BatchID, domain.BatchRunning, 1, "test", "flaky", aplan, d); err != nil {
		t.Fatal(err)
	}
	// Every part of part 1 merges; only the last one's merge resumes.
	for part, n := range []int{2, 1, 1} {
		r, err := st.BatchClaimFollowUp(ctx, repo, 100)
		if err != nil || r.Group != domain.PartGroup(p.BatchID, a.BatchID, part+1) || len(r.OperationIDs) != n {
			t.Fatalf("claim of part %d = %+v, %v", part+1, r, err)
		}
		if _, err := st.BatchSettleSucceeded(ctx, r.BatchID, domain.BatchRunning, 1); err != nil {
			t.Fatal(err)
		}
		g, _ := domain.ParseSearchGroup(r.Group)
		moved, err := st.SearchResume(ctx, repo, g)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int64{true: 4, false: 0}[part == 2]; moved != want {
			t.Fatalf("SearchResume after part %d = %d, want %d", part+1, moved, want)
		}
	}
	// The batch of 8's parts 2-4 are back as its parts 2, 3, 4 (2, 1, 1 members).
	for part, want := range map[int][]string{2: ids(ms[4:6]), 3: ids(ms[6:7]), 4: ids(ms[7:8])} {
		var got []string
		if err := st.DB().Select(&got, "SELECT operation_id FROM merge_batch_request WHERE batch_id IS NULL AND grp = ? AND half = ? ORDER BY created_at, id",
			domain.PartGroup(p.BatchID, p.BatchID, part), part); err != nil || !slices.Equal(got, want) {
			t.Fatalf("part %d after the resume: %v (%v), want %v", part, got, err, want)
		}
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE grp = ? AND operation_id = ?", domain.RestGroup(p.BatchID), other[0]); n != 1 {
		t.Fatal("the resume moved a remainder row of another parent")
	}
	if n := btCount(t, st, "SELECT COUNT(*) FROM audit_event WHERE batch_id = ? AND code = ?", a.BatchID, store.EventSearchResumed); n != 1 {
		t.Fatalf("%d resume events, want 1", n)
	}
	// Nothing more to resume; the next claim is part 2 of the batch of 8.
	if moved, err := st.SearchResume(ctx, repo, domain.SearchGroup{Root: p.BatchID, Parent: a.BatchID, Part: 3}); err != nil || moved != 0 {
		t.Fatalf("second resume = %d, %v", moved, err)
	}
	if r, err := st.BatchClaimFollowUp(ctx, repo, 100); err != nil || r.Group != domain.PartGroup(p.BatchID, p.BatchID, 2) || !slices.Equal(r.OperationIDs, ids(ms[4:6])) {
		t.Fatalf("claim after the resume = %+v, %v", r, err)
	}
}

func ids(ms []store.WaitingMember) []string { return ms2ids(ms) }

// resumeDue builds, in repo, a search whose resume is due: a batch of 8 failed (parts
// of 4, 2, 1, 1), its part 1 failed too (parts of 2, 1, 1; parts 2-4 of the 8 deferred
// to the remainder), and every part of part 1 merged. It returns the last merged
// part's group, and the ids of the 4 deferred rows' operations.
func resumeDue(t *testing.T, st *store.Store, repo string) (domain.SearchGroup, []string) {
	t.Helper()
	ctx := context.Background()
	storetest.InsertQueuedOps(t, st, repo, 8)
	p := btClaim(t, st, repo, 100, store.ClaimClaimed)
	ms, err := st.BatchWaitingMembers(ctx, p.BatchID)
	if err != nil || len(ms) != 8 {
		t.Fatalf("BatchWaitingMembers = %d, %v", len(ms), err)
	}
	settle := func(id int64, ops []string, parts []int, parent int64, d store.Deferral) {
		t.Helper()
		var plan []store.MemberFate
		for i, part := range parts {
			plan = append(plan, store.MemberFate{OperationID: ops[i], Group: domain.PartGroup(p.BatchID, parent, part), Kind: domain.KindBisect, Depth: 1, Half: part})
		}
		if _, err := st.BatchSettleIsolate(ctx, id, domain.BatchRunning, 1, "test", "failed", plan, d); err != nil {
			t.Fatal(err)
		}
	}
	settle(p.BatchID, ids(ms), []int{1, 1, 1, 1, 2, 2, 3, 4}, p.BatchID, store.Deferral{})
	a := btClaim(t, st, repo, 100, store.ClaimClaimed)
	settle(a.BatchID, a.OperationIDs, []int{1, 1, 2, 3}, a.BatchID,
		store.Deferral{Repo: repo, Prefix: domain.SiblingPrefix(p.BatchID, p.BatchID), Into: domain.RestGroup(p.BatchID)})
	var last domain.SearchGroup
	for range 3 {
		r := btClaim(t, st, repo, 100, store.ClaimClaimed)
		if _, err := st.BatchSettleSucceeded(ctx, r.BatchID, domain.BatchRunning, 1); err != nil {
			t.Fatal(err)
		}
		last, _ = domain.ParseSearchGroup(r.Group)
	}
	return last, ids(ms[4:])
}

// A resume races a claim of the repository (another replica's round, right after the
// merge freed the slot): whichever order the server picks, every deferred row is
// either claimed, in exactly one batch with its operation, or still waiting in a part
// of the batch of 8 — the claim took the remainder whole, the resumed part 2, the
// regrouped rows as it had read them, or nothing.
func TestSearchResumeRacesClaim(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	outcomes := map[string]int{}
	for i := range 12 {
		repo := fmt.Sprintf("g/resume-race-%02d", i)
		last, deferred := resumeDue(t, st, repo)
		var wg sync.WaitGroup
		var moved int64
		var rerr, cerr error
		var claim store.ClaimResult
		start := make(chan struct{})
		wg.Go(func() { <-start; moved, rerr = st.SearchResume(ctx, repo, last) })
		wg.Go(func() { <-start; claim, cerr = st.BatchClaim(ctx, repo, 100) })
		close(start)
		wg.Wait()
		if rerr != nil && !errors.Is(rerr, store.ErrLostRace) {
			t.Fatalf("%s: resume: %v", repo, rerr)
		}
		// nothing_to_claim: the claim read the remainder as the first group, and its rows
		// were regrouped before it read them; the settling replica's follow-up claim
		// (after its resume) takes the resumed part.
		if cerr != nil || (claim.Outcome != store.ClaimClaimed && claim.Outcome != store.ClaimPreempted && claim.Outcome != store.ClaimNothingToClaim) {
			t.Fatalf("%s: claim = %+v, %v", repo, claim, cerr)
		}
		claimed := 0
		if claim.Outcome == store.ClaimClaimed {
			claimed = len(claim.OperationIDs)
			if n := btCount(t, st, "SELECT COUNT(*) FROM merge_batch_request WHERE batch_id = ?", claim.BatchID); n != claimed {
				t.Fatalf("%s: claim answered %d members, %d waiting rows claimed", repo, claimed, n)
			}
			if n := btCount(t, st, "SELECT COUNT(*) FROM operation WHERE batch_id = ? AND status = 'in_batch'", claim.BatchID); n != claimed {
				t.Fatalf("%s: %d operations in the claimed batch, want %d", repo, n, claimed)
			}
		}
		waiting := 0
		for _, id := range deferred {
			var grp []string
			if err := st.DB().Select(&grp, "SELECT grp FROM merge_batch_request WHERE operation_id = ? AND batch_id IS NULL", id); err != nil {
				t.Fatal(err)
			}
			if len(grp) == 1 {
				waiting++
				if g, ok := domain.ParseSearchGroup(grp[0]); !ok || g.Rest() == (moved > 0) {
					t.Fatalf("%s: %s waits in %q after a resume that moved %d", repo, id, grp[0], moved)
				}
			}
		}
		if claimed+waiting != len(deferred) {
			t.Fatalf("%s: %d claimed + %d waiting of %d deferred rows", repo, claimed, waiting, len(deferred))
		}
		outcomes[fmt.Sprintf("resumed %d, claim %s of %d", moved, claim.Outcome, claimed)]++
	}
	t.Logf("outcomes: %v", outcomes)
}

// failIntoParts fails batch id, a claimed batch of 8, as the policy splits it: parts of
// 4, 2, 1 and 1 in queue order (PartGroup 1..4), and returns its members as claimed.
func failIntoParts(t *testing.T, st *store.Store, id int64) []store.WaitingMember {
	t.Helper()
	ctx := context.Background()
	ms, err := st.BatchWaitingMembers(ctx, id)
	if err != nil || len(ms) != 8 {
		t.Fatalf("BatchWaitingMembers = %d, %v", len(ms), err)
	}
	var plan []store.MemberFate
	for i, part := range []int{1, 1, 1, 1, 2, 2, 3, 4} {
		plan = append(plan, store.MemberFate{OperationID: ms[i].OperationID, Group: domain.PartGroup(id, id, part),
			Kind: domain.KindBisect, Depth: 1, Half: part, Event: "bisected"})
	}
	if _, err := st.BatchSettleIsolate(ctx, id, domain.BatchRunning, 1, "test", "failed", plan, store.Deferral{}); err != nil {
		t.Fatal(err)
	}
	return ms
}
