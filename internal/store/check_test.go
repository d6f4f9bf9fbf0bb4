package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

func TestCheckSchemaAcceptsMigratedSchema(t *testing.T) {
	st, _ := storetest.New(t)
	rep, err := st.CheckSchema(context.Background())
	if err != nil {
		t.Fatalf("CheckSchema on a freshly migrated schema: %v", err)
	}
	if len(rep.Problems) != 0 || len(rep.Checked) != 8+2+1+7+3+1+3 { // +3: the outbox's unique key and two indexes (00008)
		t.Fatalf("report = %+v", rep)
	}
	// The server has at least one of the two isolation variable names; which one
	// depends on the server, and the report carries it for the log.
	if rep.TxIsolation == "" && rep.TransactionIsolation == "" {
		t.Fatalf("no isolation variable read back: %+v", rep)
	}
	t.Logf("server %s: tx_isolation=%q transaction_isolation=%q innodb_snapshot_isolation=%q",
		rep.ServerVersion, rep.TxIsolation, rep.TransactionIsolation, rep.SnapshotIsolation)
}

// I8: each kind of drift is refused with a message naming the table, the index or
// column, and what is wrong.
func TestCheckSchemaRefusesDrift(t *testing.T) {
	for _, tc := range []struct {
		name  string
		alter []string
		want  []string
	}{
		{
			name:  "unique replaced by a plain index",
			alter: []string{"ALTER TABLE merge_batch_request DROP INDEX uk_operation_id, ADD INDEX uk_operation_id (operation_id)"},
			want:  []string{"merge_batch_request", "uk_operation_id", "not UNIQUE"},
		},
		{
			name:  "unique index missing",
			alter: []string{"ALTER TABLE audit_event DROP INDEX uk_dedupe"},
			want:  []string{"audit_event", "uk_dedupe", "missing"},
		},
		{
			name:  "idempotency keys unique per key only, not per principal",
			alter: []string{"ALTER TABLE idempotency_key DROP INDEX uk_principal_key, ADD UNIQUE KEY uk_principal_key (idem_key)"},
			want:  []string{"idempotency_key", "uk_principal_key", "columns are (idem_key)"},
		},
		{
			name:  "outbox order index missing",
			alter: []string{"ALTER TABLE event_outbox DROP INDEX idx_order"},
			want:  []string{"event_outbox", "idx_order", "missing"},
		},
		{
			name:  "operation without requested_by",
			alter: []string{"ALTER TABLE operation DROP COLUMN requested_by"},
			want:  []string{"operation", "requested_by", "migration 00006"},
		},
		{
			name: "long unique turned into HASH",
			alter: []string{"ALTER TABLE binding DROP INDEX uk_subject_target, " +
				"MODIFY subject VARCHAR(1000) NOT NULL, MODIFY target VARCHAR(1000) NOT NULL, " +
				"ADD UNIQUE KEY uk_subject_target (subject, target)"},
			want: []string{"binding", "uk_subject_target", "HASH"},
		},
		{
			name:  "unique on other columns",
			alter: []string{"ALTER TABLE binding DROP INDEX uk_subject_target, ADD UNIQUE KEY uk_subject_target (subject)"},
			want:  []string{"binding", "uk_subject_target", "columns are (subject)"},
		},
		{
			name: "slot column virtual",
			alter: []string{"ALTER TABLE merge_batch DROP INDEX uk_active_slot, DROP COLUMN active_slot",
				"ALTER TABLE merge_batch ADD COLUMN active_slot VARCHAR(255) AS (CASE WHEN status IN (1, 4) THEN repo ELSE NULL END) VIRTUAL, " +
					"ADD UNIQUE KEY uk_active_slot (active_slot)"},
			want: []string{"merge_batch", "active_slot", "not a STORED"},
		},
		{
			name: "slot expression drifted",
			alter: []string{"ALTER TABLE merge_batch DROP INDEX uk_active_slot, DROP COLUMN active_slot",
				"ALTER TABLE merge_batch ADD COLUMN active_slot VARCHAR(255) AS (CASE WHEN status IN (1) THEN repo ELSE NULL END) STORED, " +
					"ADD UNIQUE KEY uk_active_slot (active_slot)"},
			want: []string{"merge_batch", "active_slot", "generation expression"},
		},
		{
			name:  "group index missing",
			alter: []string{"ALTER TABLE merge_batch_request DROP INDEX idx_repo_group_waiting"},
			want:  []string{"merge_batch_request", "idx_repo_group_waiting", "missing"},
		},
		{
			name: "group index on other columns",
			alter: []string{"ALTER TABLE merge_batch_request DROP INDEX idx_repo_group_waiting, " +
				"ADD INDEX idx_repo_group_waiting (repo, grp)"},
			want: []string{"merge_batch_request", "idx_repo_group_waiting", "columns are (repo, grp)"},
		},
		{
			name: "waiting index without the urgent lane",
			alter: []string{"ALTER TABLE merge_batch_request DROP INDEX idx_repo_waiting, " +
				"ADD INDEX idx_repo_waiting (repo, batch_id, created_at, id)"},
			want: []string{"merge_batch_request", "idx_repo_waiting", "columns are (repo, batch_id, created_at, id)"},
		},
		{
			name:  "pause column missing",
			alter: []string{"ALTER TABLE repo_control DROP COLUMN paused_until"},
			want:  []string{"repo_control", "paused_until", "missing"},
		},
		{
			name:  "failure isolation column missing",
			alter: []string{"ALTER TABLE merge_batch_member DROP COLUMN why"},
			want:  []string{"merge_batch_member", "why", "missing"},
		},
		{
			name:  "version column missing",
			alter: []string{"ALTER TABLE binding DROP COLUMN version"},
			want:  []string{"binding", "version", "missing"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := storetest.New(t)
			for _, q := range tc.alter {
				if _, err := st.DB().Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			rep, err := st.CheckSchema(context.Background())
			if !errors.Is(err, store.ErrSchemaDrift) {
				t.Fatalf("CheckSchema after drift = %v, want ErrSchemaDrift", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not name %q", err, w)
				}
			}
			if len(rep.Problems) != 1 {
				t.Fatalf("problems = %q, want exactly the one introduced", rep.Problems)
			}
		})
	}
}
