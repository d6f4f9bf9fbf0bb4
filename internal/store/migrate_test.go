package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/batcherd/batcherd/internal/store/storetest"
)

// A database migrated while a lower-numbered migration had not landed yet (00012
// applied, 00011 not) takes the missing one on the next migrate instead of refusing:
// numbers are reserved per change, so they can land out of order.
func TestMigrateAppliesAMigrationThatLandedLate(t *testing.T) {
	st, _ := storetest.New(t)
	ctx := context.Background()
	// The database as it was before 00011 landed.
	for _, q := range []string{
		"DELETE FROM goose_db_version WHERE version_id = 11",
		"ALTER TABLE operation ADD KEY idx_batch (batch_id)",
	} {
		if _, err := st.DB().ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := st.PendingMigrations(ctx); err != nil || !slices.Equal(p, []string{"00011_operation_batch_index.sql"}) {
		t.Fatalf("PendingMigrations = %v, %v; want 00011 only", p, err)
	}
	if err := st.Migrate(ctx, nil); err != nil {
		t.Fatalf("migrate with 00011 missing below 00012: %v", err)
	}
	if p, err := st.PendingMigrations(ctx); err != nil || len(p) != 0 {
		t.Fatalf("PendingMigrations after migrate = %v, %v", p, err)
	}
	var n int
	if err := st.DB().GetContext(ctx, &n, `SELECT COUNT(*) FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'operation' AND INDEX_NAME = 'idx_batch'`); err != nil || n != 0 {
		t.Fatalf("idx_batch still there (%d, %v)", n, err)
	}
}
