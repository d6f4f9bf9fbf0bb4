package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// btPlanRow is the part of an EXPLAIN row the test judges.
type btPlanRow struct {
	Table, Type, Key, Extra string
}

func btExplain(t *testing.T, st *store.Store, q string, args ...any) []btPlanRow {
	t.Helper()
	rows, err := st.DB().Queryx("EXPLAIN "+q, args...)
	if err != nil {
		t.Fatalf("EXPLAIN %s: %v", q, err)
	}
	defer rows.Close()
	var out []btPlanRow
	for rows.Next() {
		m := map[string]any{}
		if err := rows.MapScan(m); err != nil {
			t.Fatal(err)
		}
		str := func(k string) string {
			switch v := m[k].(type) {
			case []byte:
				return string(v)
			case string:
				return v
			case nil:
				return ""
			default:
				return fmt.Sprint(v)
			}
		}
		out = append(out, btPlanRow{Table: str("table"), Type: str("type"), Key: str("key"), Extra: str("Extra")})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Plans seen on MariaDB 10.11 with this data (go test -v -run Explain prints them):
//
//	claim pause read           repo_control        const  PRIMARY
//	claim head (first group)   merge_batch_request ref    idx_repo_waiting (index order: lane,
//	                                                        created_at, id; no sort)
//	                           → operation eq_ref uk_operation_id (strays skipped)
//	claim read (one group)     merge_batch_request ref    idx_repo_group_waiting (index order, no sort)
//	                           → operation eq_ref uk_operation_id
//	claim guarded UPDATE       merge_batch_request range  PRIMARY (id IN …; READ COMMITTED
//	                                                        unlocks non-matching rows, so I3 holds)
//	claim operations UPDATE    operation           range  uk_operation_id
//	precheck / waiting repos   merge_batch_request ref / range idx_repo_waiting (loose scan)
//	settle batch guard         merge_batch         range  PRIMARY
//	member history             merge_batch_member  ref    PRIMARY
//	settle lock members        operation           range  uk_operation_id (idx_batch is gone, 00011)
//	settle bindings            binding             range  uk_subject_target (row-constructor IN, hinted:
//	                                                        unhinted, 2 in 15 runs chose idx_target)
//	settle delete waiting      merge_batch const PRIMARY → merge_batch_request ref idx_repo_waiting
//	batches due / timed out    merge_batch         range  idx_status_next_check
//	failed with MR             merge_batch         range  idx_status_updated
//	batch members (publish)    member ref PRIMARY → operation eq_ref uk_operation_id
//	waiting rows of a batch    merge_batch const PRIMARY → merge_batch_request ref idx_repo_waiting
//	cleanup candidates         merge_batch_request index idx_repo_waiting → merge_batch eq_ref PRIMARY
//	                           (the waiting table is the small side once cleanup runs)
//	waiting stats (metric)     merge_batch_request        idx_repo_waiting (covering)
//	batch list by repository   merge_batch         ref    idx_repo_id (idx_repo_status with a
//	                                                        status), index order, no sort
//	live operation counts      operation           range  idx_status_updated (the finished
//	                                                        statuses' history is not read)
//
// Every query the batch side runs on a hot path is served by an index: no plan row is a
// full table scan (type ALL), and the ones named here use the index they were built for.
// The data set is large and skewed enough that the optimizer would prefer a scan where
// no index served the query.
func TestExplainBatchQueries(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	const repos = 20
	for r := 0; r < repos; r++ {
		repo := fmt.Sprintf("group/repo-%02d", r)
		storetest.InsertQueuedOps(t, st, repo, 60)
		storetest.InsertOps(t, st, storetest.Ops{Repo: repo, N: 10, Action: domain.ActionRevoke, Admit: true})
		for round := 0; round < 3; round++ {
			res := btClaim(t, st, repo, 10, store.ClaimClaimed)
			var err error
			if round%2 == 0 {
				_, err = st.BatchSettleSucceeded(ctx, res.BatchID, domain.BatchRunning, 1)
			} else {
				_, err = st.BatchSettleFailed(ctx, res.BatchID, domain.BatchRunning, 1, "x", "y")
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		btClaim(t, st, repo, 10, store.ClaimClaimed) // one active batch per repository
	}
	// A repository that went quiet long ago: its batches are the oldest of all, so
	// listing it newest first must not walk back through everyone else's history.
	quiet := "INSERT INTO merge_batch (repo, status, size, finished_at) VALUES " +
		strings.TrimSuffix(strings.Repeat("('group/quiet', 2, 1, CURRENT_TIMESTAMP(6)),", 1500), ",")
	if _, err := st.DB().Exec(quiet); err != nil {
		t.Fatal(err)
	}
	// Production shape: finished batches accumulate for ever while at most one per
	// repository is active, so history dwarfs the active set. Add a year of it directly.
	for lo := 0; lo < 6000; lo += 500 {
		var vals []string
		var args []any
		for i := lo; i < lo+500; i++ {
			vals = append(vals, "(?, ?, 2, CURRENT_TIMESTAMP(6) - INTERVAL ? HOUR, CURRENT_TIMESTAMP(6) - INTERVAL ? HOUR, CURRENT_TIMESTAMP(6) - INTERVAL ? HOUR, CURRENT_TIMESTAMP(6) - INTERVAL ? HOUR)")
			status := 2 + i%2
			args = append(args, fmt.Sprintf("group/repo-%02d", i%repos), status, i+2, i+1, i+1, i+1)
		}
		q := "INSERT INTO merge_batch (repo, status, size, created_at, updated_at, finished_at, next_check_at) VALUES " + strings.Join(vals, ",")
		if _, err := st.DB().Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.DB().Exec("UPDATE merge_batch SET mr_iid = id WHERE status = 3 AND id % 3 = 0"); err != nil {
		t.Fatal(err)
	}
	// Some of the waiting work is urgent, so "urgent first, then oldest" is a real order
	// over the data and not the single-lane special case.
	if _, err := st.DB().Exec("UPDATE merge_batch_request SET lane = 0 WHERE batch_id IS NULL AND id % 5 = 0"); err != nil {
		t.Fatal(err)
	}
	if err := st.RepoControlEnsure(ctx, []string{"group/repo-07"}); err != nil {
		t.Fatal(err)
	}
	// Operations are history too: merged ones outnumber those in flight.
	storetest.InsertOps(t, st, storetest.Ops{Repo: "group/repo-19", N: 5000, Status: domain.OpMerged, Prefix: "old"})
	for _, tbl := range []string{"merge_batch", "merge_batch_request", "merge_batch_member", "operation", "binding", "audit_event"} {
		if _, err := st.DB().Exec("ANALYZE TABLE " + tbl); err != nil {
			t.Fatal(err)
		}
	}

	const repo = "group/repo-07"
	var activeID int64
	if err := st.DB().Get(&activeID, "SELECT id FROM merge_batch WHERE repo = ? AND status = 1", repo); err != nil {
		t.Fatal(err)
	}
	var waitIDs []int64
	if err := st.DB().Select(&waitIDs, "SELECT id FROM merge_batch_request WHERE repo = ? AND batch_id IS NULL ORDER BY id LIMIT 10", repo); err != nil {
		t.Fatal(err)
	}
	var members []struct {
		OperationID string `db:"operation_id"`
		Subject     string `db:"subject"`
		Target      string `db:"target"`
	}
	if err := st.DB().Select(&members, `SELECT o.operation_id, o.subject, o.target FROM merge_batch_member m
		JOIN operation o ON o.operation_id = m.operation_id WHERE m.batch_id = ? ORDER BY o.operation_id`, activeID); err != nil {
		t.Fatal(err)
	}
	in := func(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }
	var reqArgs, opArgs, triples []any
	for _, id := range waitIDs {
		reqArgs = append(reqArgs, id)
	}
	for _, m := range members {
		opArgs = append(opArgs, m.OperationID)
		triples = append(triples, m.Subject, m.Target, m.OperationID)
	}

	const listRepo = "API: batches of a quiet repository, newest first"
	listRepoQ, listRepoArgs := store.QBatchList(store.BatchFilter{Repo: "group/quiet"})
	listRepoStatusQ, listRepoStatusArgs := store.QBatchList(store.BatchFilter{Repo: "group/quiet", Status: domain.BatchSucceeded})
	const liveCounts = "metrics: operations in flight by status"
	const claimHead = "claim: group of the first waiting row of a repository (urgent first, then oldest)"
	const claimRead = "claim: waiting rows of one group of a repository, urgent first, then oldest"
	var liveArgs []any
	for _, st := range domain.LiveOpStatuses {
		liveArgs = append(liveArgs, st)
	}
	for _, c := range []struct {
		name, query, wantKey string
		args                 []any
	}{
		{claimHead,
			store.QClaimHead, "idx_repo_waiting", []any{repo}},
		{claimRead,
			store.QClaimRead, "idx_repo_group_waiting|idx_repo_waiting", []any{repo, "", 10}},
		{"settle failure: waiting rows a batch claimed, queue order",
			store.QBatchWaiting, "PRIMARY|idx_repo_waiting", []any{activeID}},
		{"claim: guarded UPDATE of the waiting rows read",
			"UPDATE merge_batch_request SET batch_id = 1 WHERE batch_id IS NULL AND id IN (" + in(len(reqArgs)) + ")",
			"", reqArgs},
		{"claim: operations queued → in_batch",
			"UPDATE operation SET status = 'in_batch' WHERE operation_id IN (" + in(len(opArgs)) + ") AND status = 'queued'",
			"uk_operation_id", opArgs},
		{"claim precheck: anything waiting, slot held, paused",
			store.QClaimPrecheck, "", []any{repo, repo, repo}},
		{"claim: is the repository paused",
			store.QClaimPaused, "PRIMARY", []any{repo}},
		{"claim loop: repositories with waiting work",
			store.QWaitingRepos, "idx_repo_waiting", []any{1000}},
		{"settle: guarded batch write",
			"UPDATE merge_batch SET status = 2 WHERE id = ? AND status = 1 AND version = 1", "PRIMARY", []any{activeID}},
		{"settle/BatchGet: member history of a batch",
			store.QMemberIDs, "PRIMARY", []any{activeID}},
		{"settle: lock the members still in the batch",
			"SELECT operation_id, action, subject, target FROM operation WHERE operation_id IN (" + in(len(opArgs)) +
				") AND batch_id = ? AND status = 'in_batch' ORDER BY operation_id FOR UPDATE", "", append(append([]any{}, opArgs...), activeID)},
		{"settle: bindings owned by the members",
			store.QMoveBindings(len(members)), "uk_subject_target",
			append(append([]any{domain.BindingActive}, triples...), domain.BindingPending)},
		{"settle failure: waiting rows of the batch",
			store.QDeleteBatchWait, "PRIMARY|idx_repo_waiting", []any{activeID}},
		{"reconcile: batches due",
			store.QBatchesDue, "idx_status_next_check", []any{100}},
		{"timeout sweep",
			store.QBatchesTimedOut, "", []any{3600000000, 3600000000, 100}},
		{"orphan sweep: failed batches with an MR",
			store.QFailedRecently, "idx_status_updated", []any{3600000000, 3600000000, "1970-01-01", "1970-01-01", 0, 100}},
		{"orphan sweep: failed batches with an MR, next page",
			store.QFailedRecently, "idx_status_updated", []any{3600000000, 3600000000, time.Now().Add(-48 * time.Hour).UTC(), time.Now().Add(-48 * time.Hour).UTC(), 10, 100}},
		{"publish: batch members",
			store.QBatchMembers, "PRIMARY", []any{activeID}},
		{"cleanup: waiting rows of old succeeded batches",
			store.QCleanupWaiting, "", []any{1, 1, 500}},
		{"metrics: waiting depth per repository",
			store.QWaitingStats, "", nil},
		{liveCounts, store.QOperationCounts(len(domain.LiveOpStatuses)), "idx_status_updated", liveArgs},
		{listRepo, listRepoQ, "idx_repo_id", listRepoArgs},
		{listRepo + " and status", listRepoStatusQ, "idx_repo_status|idx_repo_id", listRepoStatusArgs},
	} {
		plan := btExplain(t, st, c.query, c.args...)
		for _, p := range plan {
			t.Logf("%-50s %-22s type=%-7s key=%-22s %s", c.name, p.Table, p.Type, p.Key, p.Extra)
			// repo_state (rs) holds one row per configured repository: the optimizer reads
			// so small a table whole, and that is cheaper than its primary key.
			if p.Type == "ALL" && p.Table != "rs" {
				t.Errorf("%s: full scan of %s: %s", c.name, p.Table, c.query)
			}
		}
		// wantKey may name alternatives ("a|b"): with one group waiting the optimizer
		// may read a group through idx_repo_waiting in index order, filtering on grp.
		if c.wantKey != "" && (len(plan) == 0 || !slices.Contains(strings.Split(c.wantKey, "|"), plan[0].Key)) {
			t.Errorf("%s: plan %+v does not use %s", c.name, plan, c.wantKey)
		}
		// Sampled every few seconds by every replica: it must read the rows in flight,
		// not the whole history (a full index scan is type "index").
		if c.name == liveCounts && (len(plan) != 1 || plan[0].Type != "range") {
			t.Errorf("%s: plan %+v is not a range read", c.name, plan)
		}
		// The claim is one range read of the waiting index in its order (urgent first,
		// then oldest), each row's operation looked up by key to skip strays: never a
		// sort of the repository's whole waiting set, never driven from the operations.
		if c.name == claimHead || c.name == claimRead {
			if len(plan) != 2 || plan[0].Table != "r" || plan[0].Type != "ref" ||
				strings.Contains(plan[0].Extra, "filesort") || strings.Contains(plan[0].Extra, "temporary") ||
				plan[1].Table != "o" || plan[1].Type != "eq_ref" || plan[1].Key != "uk_operation_id" {
				t.Errorf("%s: plan %+v is not one index-order read of the waiting rows with a key lookup per row", c.name, plan)
			}
		}
		// A page of the list is read in index order: sorting would read all of the
		// repository's history first.
		if strings.HasPrefix(c.name, listRepo) && (len(plan) != 1 || strings.Contains(plan[0].Extra, "filesort")) {
			t.Errorf("%s: plan %+v sorts", c.name, plan)
		}
	}
}
