package store_test

import (
	"context"
	"testing"

	"github.com/batcherd/batcherd/internal/store/storetest"
)

func TestMigrateAndPing(t *testing.T) {
	st, _ := storetest.New(t)
	if err := st.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := st.DB().Get(&n, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = 'merge_batch'"); err != nil || n != 1 {
		t.Fatalf("merge_batch missing after migrate: n=%d err=%v", n, err)
	}
}
