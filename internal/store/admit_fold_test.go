package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// A grant whose binding file differs from another binding's only by letter case is
// refused by admission itself (CaseCollisionError naming the other binding) on every
// path — the optimistic compound, the group's read path, plain statements and the
// per-request transaction — and nothing of it is written. The HTTP API used to check
// this with a read of its own before admitting; the answer is the same.
func TestAdmissionCaseCollision(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		st, _ := storetest.New(t)
		ctx := context.Background()
		st.SetAdmitOptions(store.AdmitOptions{PlainStatements: plain})
		alice := mustCreate(t, st, grant("alice", "db/prod"))
		setState(t, st, alice, domain.OpMerged, domain.BindingActive)
		mustCreate(t, st, grant("carol", "db/prod")) // pending: its file may already be merged

		paths := map[string]func(context.Context, store.OperationCreateParams) (domain.Operation, bool, error){
			"grouped": st.OperationCreate, "serial": st.OperationCreateSerial,
		}
		otherRepo := map[string]string{"grouped": "Alice", "serial": "aLICE"}
		for name, create := range paths {
			for _, c := range []struct{ subject, target, other string }{
				{"Alice", "db/prod", "alice"}, {"alice", "DB/Prod", "alice"}, {"ALICE", "DB/PROD", "alice"}, {"CAROL", "db/prod", "carol"},
			} {
				p := grant(c.subject, c.target)
				p.AutoApprove = true
				_, created, err := create(ctx, p)
				var cc *store.CaseCollisionError
				if created || !errors.As(err, &cc) || !errors.Is(err, store.ErrCaseCollision) || cc.Other.Subject != c.other ||
					cc.Other.Target != "db/prod" {
					t.Fatalf("%s %s → %s: created=%v err=%v, want a case collision with %s", name, c.subject, c.target, created, err, c.other)
				}
				if _, err := st.OperationGet(ctx, p.OperationID); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("%s: the refused grant was written: %v", name, err)
				}
			}
			// Another repository, another name, the relation itself: no collision (the
			// relation itself answers as before: active).
			other := grant(otherRepo[name], "db/prod")
			other.Repo = "group/other-" + name
			mustCreate(t, st, other)
			mustCreate(t, st, grant("alicia-"+name, "db/prod"))
			if _, _, err := create(ctx, grant("alice", "db/prod")); !errors.Is(err, store.ErrBindingActive) {
				t.Fatalf("%s: grant of the active relation itself: %v", name, err)
			}
		}
		// A revoke is not checked: it writes no new file.
		r := grant("alice", "db/prod")
		r.Action = domain.ActionRevoke
		mustCreate(t, st, r)
		if n := rowCount(t, st, "binding"); n != 6 {
			t.Fatalf("%d bindings, want 6 (alice, carol, two other-repo Alices, two alicias)", n)
		}
	})
}

// Concurrent grants of one fresh relation spelled in different letter case are
// admitted once. A group keeps them apart: the first runs in the group, the others
// after it, and they then see its pending binding. Checking before admitting, as the
// API did, let every one through when they arrived together.
//
// The spellings are made to queue behind a group that holds the only in-flight slot
// (a revoke, which takes the read path, held in the read hook), so they form one group
// of their own.
func TestAdmissionCaseCollisionConcurrent(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		st, _ := storetest.New(t)
		ctx := context.Background()
		st.SetAdmitOptions(store.AdmitOptions{MaxInflight: 1, PlainStatements: plain})
		eve := mustCreate(t, st, grant("eve", "db/stage"))
		setState(t, st, eve, domain.OpMerged, domain.BindingActive)

		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		store.SetAdmitAfterRead(func(context.Context) {
			once.Do(func() {
				close(entered)
				<-release
			})
		})
		defer store.SetAdmitAfterRead(nil)
		var wg sync.WaitGroup
		wg.Go(func() {
			r := grant("eve", "db/stage")
			r.Action = domain.ActionRevoke
			if _, _, err := st.OperationCreate(ctx, r); err != nil {
				t.Error(err)
			}
		})
		<-entered
		spellings := []string{"dave", "Dave", "DAVE", "dAve", "daVe", "davE", "DAve", "dAVE"}
		errs := make([]error, len(spellings))
		created := make([]bool, len(spellings))
		for i, s := range spellings {
			wg.Go(func() {
				p := grant(s, "db/stage")
				p.AutoApprove = true
				_, created[i], errs[i] = st.OperationCreate(ctx, p)
			})
		}
		// Let them queue behind the held group (if some are late they form a later
		// group, which sees the first one's binding: the answer is the same).
		time.Sleep(100 * time.Millisecond)
		close(release)
		wg.Wait()
		n := 0
		for i := range spellings {
			switch {
			case created[i]:
				n++
			case !errors.Is(errs[i], store.ErrCaseCollision):
				t.Fatalf("%s: %v, want created or a case collision", spellings[i], errs[i])
			}
		}
		if n != 1 {
			t.Fatalf("%d of the spellings were admitted, want 1", n)
		}
		t.Logf("admission stats: %+v", st.AdmitStats())
	})
}

// Where the ids of a multi-row INSERT do not follow each other (innodb_autoinc_lock_mode
// 2, Galera), a group reads them back instead of computing them; every answer is still
// exactly the stored row (admissionRace compares each with OperationGet).
func TestAdmissionReadsIDsBackWhenNotConsecutive(t *testing.T) {
	statementModes(t, func(t *testing.T, plain bool) {
		st, _ := storetest.New(t)
		store.SetAutoincStep(st, 0)
		st.SetAdmitOptions(store.AdmitOptions{MaxInflight: 1, Linger: 2 * time.Millisecond, PlainStatements: plain})
		admissionRace(t, []*store.Store{st}, 1)
		if s := st.AdmitStats(); s.Grouped <= s.Groups {
			t.Fatalf("no group held more than one request: %+v", s)
		}
	})
}

func rowCount(t *testing.T, st *store.Store, table string) int {
	t.Helper()
	var n int
	if err := st.DB().Get(&n, "SELECT COUNT(*) FROM `"+table+"`"); err != nil {
		t.Fatal(err)
	}
	return n
}
