package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// The first migrate writes the installation id; later migrates (and other processes)
// keep it; another database gets its own.
func TestInstallationWrittenOnceByMigrate(t *testing.T) {
	ctx := context.Background()
	st, dsn := storetest.New(t)
	id, err := st.Installation(ctx)
	if err != nil || !domain.ValidInstallationID(id) {
		t.Fatalf("Installation() = %q, %v", id, err)
	}
	for range 3 {
		if err := st.Migrate(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	other := storetest.Open(t, dsn, 2) // a fresh process: nothing cached
	if again, err := other.Installation(ctx); err != nil || again != id {
		t.Fatalf("after more migrates the id is %q (%v), want %q", again, err, id)
	}
	var rows int
	if err := st.DB().Get(&rows, "SELECT COUNT(*) FROM installation"); err != nil || rows != 1 {
		t.Fatalf("installation rows = %d (%v)", rows, err)
	}
	// The table holds one row: a second one is refused by the database itself.
	if _, err := st.DB().Exec("INSERT INTO installation (singleton, installation_id) VALUES (2, 'zzzzzzzzzz')"); err == nil {
		t.Fatal("a second installation row was accepted")
	}
	st2, _ := storetest.New(t)
	if id2, err := st2.Installation(ctx); err != nil || id2 == id {
		t.Fatalf("a second database has id %q (%v); the first has %q", id2, err, id)
	}
}

// A database without the installation row is schema drift: it cannot name branches.
func TestCheckSchemaRequiresInstallation(t *testing.T) {
	ctx := context.Background()
	_, dsn := storetest.New(t)
	st := storetest.Open(t, dsn, 2)
	if _, err := st.DB().Exec("DELETE FROM installation"); err != nil {
		t.Fatal(err)
	}
	_, err := st.CheckSchema(ctx)
	if !errors.Is(err, store.ErrSchemaDrift) || !strings.Contains(err.Error(), "installation") {
		t.Fatalf("CheckSchema without an installation row: %v", err)
	}
	if _, err := st.BatchClaim(ctx, "g/p", 10); !errors.Is(err, store.ErrNoInstallation) {
		t.Fatalf("claim without an installation: %v", err)
	}
}
