package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
)

// AnatomyStep is one step of the admission anatomy: the mean time of one admission's
// statement built up to that step, on one connection, one client.
type AnatomyStep struct {
	Name  string
	PerOp time.Duration
	Ops   int
}

// AdmissionAnatomy takes one admission apart, at one client where nothing can be
// coalesced: it times, on one connection, statements that add the admission's parts
// one at a time — the raw INSERT of the operation row, the same row inside a
// transaction in one compound statement, the other five rows, the read-back of what
// the database assigned, the row-count guards — and finally the store's own
// OperationCreate (AdmitSingle), which sends the last statement. The statements mirror
// the store's optimistic admission (internal/store/admit_compound.go) and are written
// here only to be measured. Every step starts from empty tables and runs n times;
// steps are interleaved over reps repetitions and the median is kept.
func AdmissionAnatomy(ctx context.Context, d *DB, st *store.Store, n, reps int) ([]AnatomyStep, error) {
	db, err := d.Raw(1)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	type step struct {
		name string
		run  func(id, subj string) error
	}
	rows := func(id, subj string) []string {
		return []string{
			"INSERT INTO idempotency_key (idem_key, fingerprint, operation_id, expires_at) VALUES ('k-" + subj +
				"', '" + strings.Repeat("0", 64) + "', '" + id + "', CURRENT_TIMESTAMP(6) + INTERVAL 86400000000 MICROSECOND)",
			"INSERT INTO operation (operation_id, subject, target, repo, action, status, expires_at, attributes) VALUES ('" +
				id + "', '" + subj + "', 'db/bench', 'bench/anatomy', 'grant', 'queued', NULL, NULL)",
			"INSERT INTO binding (subject, target, repo, status, operation_id, expires_at) VALUES ('" + subj +
				"', 'db/bench', 'bench/anatomy', 'pending', '" + id + "', NULL)",
			"INSERT INTO merge_batch_request (operation_id, repo) VALUES ('" + id + "', 'bench/anatomy') ON DUPLICATE KEY UPDATE id = id",
			// No audit rows: the created and admitted events are derived from the
			// operation row when read (store.OperationEvents).
		}
	}
	want := []int{1, 1, 1, 1}
	compound := func(only int, readBack, guards bool) func(id, subj string) error {
		return func(id, subj string) error {
			var b strings.Builder
			b.WriteString("BEGIN NOT ATOMIC\nSET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;\n")
			for i, q := range rows(id, subj) {
				if only >= 0 && i != only {
					continue
				}
				b.WriteString(q + ";\n")
				if guards {
					fmt.Fprintf(&b, "IF ROW_COUNT() <> %d THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'guard'; END IF;\n", want[i])
				}
			}
			if readBack {
				b.WriteString("SELECT id, operation_id, created_at, updated_at FROM operation WHERE operation_id IN ('" + id + "');\n")
			}
			b.WriteString("COMMIT;\nEND")
			return drain(db.QueryContext(ctx, b.String()))
		}
	}
	steps := []step{
		{"raw INSERT of the operation row (autocommit; the ceiling's statement)", func(id, subj string) error {
			_, err := db.ExecContext(ctx, rows(id, subj)[1])
			return err
		}},
		{"the operation row in a transaction, one compound statement", compound(1, false, false)},
		{"+ the other 3 rows (key, binding, waiting row)", compound(-1, false, false)},
		{"+ the read-back of what the database assigned (id, timestamps)", compound(-1, true, false)},
		{"+ the row-count guards: the store's optimistic admission statement", compound(-1, true, true)},
	}
	out := make([]AnatomyStep, len(steps)+1)
	per := make([][]float64, len(steps)+1)
	run := uuid.NewString()[:6]
	for rep := 0; rep < reps; rep++ {
		for i, s := range steps {
			if err := d.Reset(ctx); err != nil {
				return nil, err
			}
			t0 := time.Now()
			for k := 0; k < n; k++ {
				id := uuid.NewString()
				if err := s.run(id, fmt.Sprintf("an-%s-%d-%d-%d", run, rep, i, k)); err != nil {
					return nil, fmt.Errorf("%s: %w", s.name, err)
				}
			}
			per[i] = append(per[i], float64(time.Since(t0))/float64(n))
			out[i] = AnatomyStep{Name: s.name, Ops: n}
		}
		// The store itself, one request at a time through the group code.
		if err := d.Reset(ctx); err != nil {
			return nil, err
		}
		st.SetAdmitOptions(AdmitSingle.Options(1))
		t0 := time.Now()
		for k := 0; k < n; k++ {
			if _, _, err := st.OperationCreate(ctx, AdmissionParams("bench/anatomy", fmt.Sprintf("an-%s-%d-st-%d", run, rep, k))); err != nil {
				return nil, fmt.Errorf("store.OperationCreate: %w", err)
			}
		}
		per[len(steps)] = append(per[len(steps)], float64(time.Since(t0))/float64(n))
		out[len(steps)] = AnatomyStep{Name: "store.OperationCreate (AdmitSingle: that statement, built and answered by the store)", Ops: n}
	}
	st.SetAdmitOptions(store.AdmitOptions{})
	for i := range out {
		out[i].PerOp = time.Duration(Median(per[i]))
	}
	return out, nil
}

// drain reads every result set of a multi-result query to its end, so a compound's
// COMMIT answer (which follows its result set) is seen.
func drain(rows *sql.Rows, err error) error {
	if err != nil {
		return err
	}
	for {
		for rows.Next() {
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return err
	}
	return rows.Close()
}
