package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// Ops describes operation rows to insert directly with SQL, bypassing the operation
// API, for tests that need a waiting set (claims, settlement, the scanner).
type Ops struct {
	Repo   string
	N      int
	Action domain.Action   // default grant
	Status domain.OpStatus // default queued
	// Admit also inserts each operation's waiting row (merge_batch_request), as approval
	// does. Leave it false to admit later through Store.Admit.
	Admit bool
	// Prefix makes subjects recognisable; default "s".
	Prefix string
}

// InsertOps inserts o.N operations, requested by store.SystemActor (made behind the
// API's back, as batcherd's own are: no created or admitted event is derived for them,
// see store.OperationEvents), with their bindings (pending for a grant, revoking
// for a revoke, owned by the operation) and, when o.Admit, their waiting rows, oldest
// first in the returned order. Rows go in with multi-row INSERTs so large fixtures stay
// cheap.
func InsertOps(t testing.TB, st *store.Store, o Ops) []string {
	t.Helper()
	if o.Action == "" {
		o.Action = domain.ActionGrant
	}
	if o.Status == "" {
		o.Status = domain.OpQueued
	}
	if o.Prefix == "" {
		o.Prefix = "s"
	}
	bstatus := domain.BindingPending
	if o.Action == domain.ActionRevoke {
		bstatus = domain.BindingRevoking
	}
	ids := make([]string, o.N)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	ctx := context.Background()
	const per = 200
	for lo := 0; lo < len(ids); lo += per {
		hi := min(lo+per, len(ids))
		var ops, binds, waits []string
		var opArgs, bindArgs, waitArgs []any
		for _, id := range ids[lo:hi] {
			subject := fmt.Sprintf("%s-%s", o.Prefix, id[:13])
			target := "target-" + id[14:18]
			ops = append(ops, "(?,?,?,?,?,?,?)")
			opArgs = append(opArgs, id, subject, target, o.Repo, o.Action, o.Status, store.SystemActor)
			binds = append(binds, "(?,?,?,?,?)")
			bindArgs = append(bindArgs, subject, target, o.Repo, bstatus, id)
			waits = append(waits, "(?,?)")
			waitArgs = append(waitArgs, id, o.Repo)
		}
		db := st.DB()
		if _, err := db.ExecContext(ctx, "INSERT INTO operation (operation_id, subject, target, repo, action, status, requested_by) VALUES "+
			strings.Join(ops, ","), opArgs...); err != nil {
			t.Fatalf("insert operations: %v", err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO binding (subject, target, repo, status, operation_id) VALUES "+
			strings.Join(binds, ","), bindArgs...); err != nil {
			t.Fatalf("insert bindings: %v", err)
		}
		if o.Admit {
			if _, err := db.ExecContext(ctx, "INSERT INTO merge_batch_request (operation_id, repo) VALUES "+
				strings.Join(waits, ","), waitArgs...); err != nil {
				t.Fatalf("insert waiting rows: %v", err)
			}
		}
	}
	return ids
}

// InsertQueuedOps inserts n queued grant operations of repo with pending bindings and
// admits them: a waiting set ready to be claimed.
func InsertQueuedOps(t testing.TB, st *store.Store, repo string, n int) []string {
	t.Helper()
	return InsertOps(t, st, Ops{Repo: repo, N: n, Admit: true})
}
