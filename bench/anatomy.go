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
// statement built up to that step, on one connection, one client. Added says the step
// adds a part to the step before it (the table shows the difference); the others stand
// alone (the ceiling, the store itself, and what the store sent before).
type AnatomyStep struct {
	Name  string
	PerOp time.Duration
	Ops   int
	Added bool
}

// AdmissionAnatomy takes one admission apart, at one client where nothing can be
// coalesced: it times, on one connection, statements that add the admission's parts
// one at a time — the raw INSERT of the operation row, the same row inside a
// transaction in one compound statement, the other three rows, the case-collision
// check, the answer (the first id and the clock, no row read back) — and finally the
// store's own OperationCreate (AdmitSingle), which sends the last statement; then, for
// comparison, the statement as the store sent it before (a read-back of the new rows
// by operation_id and a row-count guard after every INSERT). The statements mirror
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
		name  string
		added bool
		run   func(id, subj string) error
	}
	rows := func(id, subj string, clock bool) []string {
		ts, tsv := "", ""
		if clock {
			ts, tsv = ", created_at, updated_at", ", adm_now, adm_now"
		}
		return []string{
			"INSERT INTO idempotency_key (principal, idem_key, fingerprint, operation_id, expires_at) VALUES ('bench-requester', 'k-" + subj +
				"', '" + strings.Repeat("0", 64) + "', '" + id + "', CURRENT_TIMESTAMP(6) + INTERVAL 86400000000 MICROSECOND)",
			"INSERT INTO operation (operation_id, subject, target, repo, action, status, expires_at, attributes, requested_by, approved_by" + ts +
				") VALUES ('" + id + "', '" + subj + "', 'db/bench', 'bench/anatomy', 'grant', 'queued', NULL, NULL, 'bench-requester', 'auto'" + tsv + ")",
			"INSERT INTO binding (subject, target, repo, status, operation_id, expires_at) VALUES ('" + subj +
				"', 'db/bench', 'bench/anatomy', 'pending', '" + id + "', NULL)",
			"INSERT INTO merge_batch_request (operation_id, repo) VALUES ('" + id + "', 'bench/anatomy')",
			// No audit rows: the created and admitted events are derived from the
			// operation row when read (store.OperationEvents).
		}
	}
	const opRow, waitRow = 1, 3
	// The case-collision check of a grant (store caseCollisionWhere), as the optimistic
	// admission runs it.
	fold := func(subj string) string {
		return "IF EXISTS (SELECT 1 FROM binding WHERE fold_key = SHA2(CONCAT('bench/anatomy', 0x00, LOWER('db/bench'), 0x00, LOWER('" +
			subj + "')), 256) AND status IN ('active', 'pending', 'revoking') AND NOT (subject = '" + subj +
			"' AND target = 'db/bench')) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'fold'; END IF;\n"
	}
	type parts struct {
		only         int // -1: every row
		fold, answer bool
		before       bool // the statement the store sent before: read-back and guards, no clock variable
	}
	compound := func(c parts) func(id, subj string) error {
		return func(id, subj string) error {
			var b strings.Builder
			b.WriteString("BEGIN NOT ATOMIC\n")
			if !c.before {
				b.WriteString("DECLARE adm_now DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6);\nDECLARE adm_id BIGINT DEFAULT 0;\n")
			}
			b.WriteString("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;\n")
			if c.fold {
				b.WriteString(fold(subj))
			}
			for i, q := range rows(id, subj, !c.before) {
				if c.only >= 0 && i != c.only {
					continue
				}
				if c.before && i == waitRow {
					q += " ON DUPLICATE KEY UPDATE id = id"
				}
				b.WriteString(q + ";\n")
				if c.before {
					b.WriteString("IF ROW_COUNT() <> 1 THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'guard'; END IF;\n")
				}
				if i == opRow && c.answer {
					b.WriteString("SET adm_id = LAST_INSERT_ID();\n")
				}
			}
			switch {
			case c.before:
				b.WriteString("SELECT id, operation_id, created_at, updated_at FROM operation WHERE operation_id IN ('" + id + "');\nCOMMIT;\n")
			case c.answer:
				b.WriteString("COMMIT;\nSELECT adm_id, adm_now;\n")
			default:
				b.WriteString("COMMIT;\n")
			}
			b.WriteString("END")
			return drain(db.QueryContext(ctx, b.String()))
		}
	}
	steps := []step{
		{"raw INSERT of the operation row (autocommit; the ceiling's statement)", false, func(id, subj string) error {
			_, err := db.ExecContext(ctx, rows(id, subj, false)[opRow])
			return err
		}},
		{"the operation row in a transaction, one compound statement", true, compound(parts{only: opRow})},
		{"+ the other 3 rows (key, binding, waiting row)", true, compound(parts{only: -1})},
		{"+ the case-collision check (one lookup of binding.fold_key)", true, compound(parts{only: -1, fold: true})},
		{"+ the answer: the first id and the clock, no row read back (the store's optimistic admission statement)", true,
			compound(parts{only: -1, fold: true, answer: true})},
	}
	before := step{"for comparison, the statement as sent before: a read-back of the new rows by operation_id and a row-count guard after every INSERT", false,
		compound(parts{only: -1, fold: true, before: true})}
	out := make([]AnatomyStep, len(steps)+2)
	per := make([][]float64, len(steps)+2)
	run := uuid.NewString()[:6]
	timeStep := func(i int, s step, rep int) error {
		if err := d.Reset(ctx); err != nil {
			return err
		}
		t0 := time.Now()
		for k := 0; k < n; k++ {
			if err := s.run(uuid.NewString(), fmt.Sprintf("an-%s-%d-%d-%d", run, rep, i, k)); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		per[i] = append(per[i], float64(time.Since(t0))/float64(n))
		out[i] = AnatomyStep{Name: s.name, Ops: n, Added: s.added}
		return nil
	}
	for rep := 0; rep < reps; rep++ {
		for i, s := range steps {
			if err := timeStep(i, s, rep); err != nil {
				return nil, err
			}
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
		if err := timeStep(len(steps)+1, before, rep); err != nil {
			return nil, err
		}
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
