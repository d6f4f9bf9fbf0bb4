package verify_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
	"github.com/batcherd/batcherd/internal/verify"
)

func exec(t *testing.T, db *sqlx.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// seedConsistent writes a small history that obeys every rule: a succeeded batch with
// a merged grant, an active batch with an in_batch grant, a queued revoke, a failed
// grant and a rejected grant.
func seedConsistent(t *testing.T, db *sqlx.DB) {
	exec(t, db, `INSERT INTO merge_batch (id, repo, status, mr_iid, size) VALUES (1, 'g/r', 2, 7, 1), (2, 'g/r', 1, NULL, 1), (3, 'g/r', 3, NULL, 1)`)
	exec(t, db, `INSERT INTO operation (operation_id, subject, target, repo, action, status, batch_id, error_code) VALUES
		('op-merged', 'alice', 'db', 'g/r', 'grant', 'merged', 1, ''),
		('op-inbatch', 'bob', 'db', 'g/r', 'grant', 'in_batch', 2, ''),
		('op-revoke', 'alice', 'db', 'g/r', 'revoke', 'queued', NULL, ''),
		('op-failed', 'carol', 'db', 'g/r', 'grant', 'failed', 3, 'pipeline_failed'),
		('op-rejected', 'dave', 'db', 'g/r', 'grant', 'rejected', NULL, '')`)
	exec(t, db, `INSERT INTO merge_batch_member (batch_id, operation_id) VALUES (1, 'op-merged'), (2, 'op-inbatch'), (3, 'op-failed')`)
	exec(t, db, `INSERT INTO merge_batch_request (operation_id, repo, batch_id) VALUES ('op-merged', 'g/r', 1), ('op-inbatch', 'g/r', 2), ('op-revoke', 'g/r', NULL)`)
	exec(t, db, `INSERT INTO binding (subject, target, repo, status, operation_id) VALUES
		('alice', 'db', 'g/r', 'revoking', 'op-revoke'),
		('bob', 'db', 'g/r', 'pending', 'op-inbatch'),
		('carol', 'db', 'g/r', 'failed', 'op-failed'),
		('dave', 'db', 'g/r', 'rejected', 'op-rejected')`)
}

func run(t *testing.T, db *sqlx.DB) *verify.Report {
	t.Helper()
	rep, err := verify.Run(context.Background(), db, verify.Options{Chunk: 2})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return rep
}

func TestCleanDatabase(t *testing.T) {
	st, _ := storetest.New(t)
	seedConsistent(t, st.DB())
	rep := run(t, st.DB())
	if !rep.Clean() {
		var b strings.Builder
		rep.Print(&b)
		t.Fatalf("consistent data reported dirty:\n%s", b.String())
	}
	if rep.Operations != 5 || rep.Batches != 3 || rep.Bindings != 4 {
		t.Fatalf("chunked scan missed rows: %+v", rep)
	}
}

func TestEachViolationIsReported(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(t *testing.T, db *sqlx.DB)
		want   string
	}{
		{"two active batches in a repository", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "ALTER TABLE merge_batch DROP INDEX uk_active_slot")
			exec(t, db, "INSERT INTO merge_batch (id, repo, status) VALUES (9, 'g/r', 4)")
		}, "[I1] merge_batch"},
		{"operation in two live batches", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "INSERT INTO merge_batch_member (batch_id, operation_id) VALUES (2, 'op-merged')")
		}, "[I2] merge_batch_member"},
		{"waiting row claimed without member history", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE merge_batch_request SET batch_id = 1 WHERE operation_id = 'op-revoke'")
		}, "[I2] merge_batch_request"},
		{"queued operation missing from waiting set", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "DELETE FROM merge_batch_request WHERE operation_id = 'op-revoke'")
		}, "queued operation missing from the waiting set"},
		{"in_batch operation of a finished batch", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE merge_batch SET status = 3 WHERE id = 2")
		}, "is not active"},
		{"merged operation of a failed batch", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE merge_batch SET status = 3 WHERE id = 1")
		}, "did not succeed"},
		{"succeeded batch without MR", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE merge_batch SET mr_iid = NULL WHERE id = 1")
		}, "SUCCEEDED batch has no MR"},
		{"binding not pointing at its latest operation", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE binding SET operation_id = 'op-merged', status = 'active' WHERE subject = 'alice'")
		}, "[I5] binding"},
		{"binding status disagrees with its operation", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE binding SET status = 'active' WHERE subject = 'carol'")
		}, "binding is active but its grant operation op-failed is failed"},
		{"failed operation without reason", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE operation SET error_code = '' WHERE operation_id = 'op-failed'")
		}, "has no reason"},
		{"batch size disagrees with its member history", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE merge_batch SET size = 5 WHERE id = 1")
		}, "batch size is 5 but its member history has 1 rows"},
		{"batch without members", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "INSERT INTO merge_batch (id, repo, status, size) VALUES (4, 'g/other', 3, 0)")
		}, "has no member history"},
		{"member of a succeeded batch that is not merged in it", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "INSERT INTO merge_batch_member (batch_id, operation_id) VALUES (1, 'op-failed')")
			exec(t, db, "UPDATE merge_batch SET size = 2 WHERE id = 1")
		}, "member of SUCCEEDED batch 1 but the operation is failed in batch 3"},
		{"withdrawn operation still in the waiting set", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE operation SET status = 'withdrawn' WHERE operation_id = 'op-rejected'")
			exec(t, db, "UPDATE binding SET status = 'closed' WHERE subject = 'dave'")
			exec(t, db, "INSERT INTO merge_batch_request (operation_id, repo) VALUES ('op-rejected', 'g/r')")
		}, "operation withdrawn but present in the waiting set (a stray the claim skips)"},
		{"withdrawn grant whose binding is not closed", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "UPDATE operation SET status = 'withdrawn' WHERE operation_id = 'op-rejected'")
		}, "binding is rejected but its grant operation op-rejected is withdrawn (want closed)"},
		{"duplicate relation rows", func(t *testing.T, db *sqlx.DB) {
			exec(t, db, "ALTER TABLE binding DROP INDEX uk_subject_target")
			exec(t, db, "INSERT INTO binding (subject, target, repo, status, operation_id) VALUES ('dave', 'db', 'g/r', 'rejected', 'op-rejected')")
		}, "has 2 rows"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := storetest.New(t)
			seedConsistent(t, st.DB())
			tc.break_(t, st.DB())
			rep := run(t, st.DB())
			var b strings.Builder
			rep.Print(&b)
			if rep.Clean() || !strings.Contains(b.String(), tc.want) {
				t.Fatalf("want a violation containing %q, got:\n%s", tc.want, b.String())
			}
		})
	}
}

// A SUCCEEDED batch without an MR is clean when its settle recorded that the repository
// already had every change (store.EventBatchUnchanged); without that event it is the
// violation TestEachViolationIsReported shows.
func TestUnchangedBatchWithoutMRIsClean(t *testing.T) {
	st, _ := storetest.New(t)
	seedConsistent(t, st.DB())
	exec(t, st.DB(), "UPDATE merge_batch SET mr_iid = NULL WHERE id = 1")
	exec(t, st.DB(), "INSERT INTO audit_event (dedupe_key, batch_id, code, detail) VALUES ('batch:1:unchanged', 1, ?, 'the repository already had every change')", store.EventBatchUnchanged)
	if rep := run(t, st.DB()); !rep.Clean() {
		var b strings.Builder
		rep.Print(&b)
		t.Fatalf("an unchanged batch without an MR is reported:\n%s", b.String())
	}
}
