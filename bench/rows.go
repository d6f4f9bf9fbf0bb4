package bench

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// AdmissionRowCount is what one auto-approved admission wrote, counted in every table.
type AdmissionRowCount struct {
	Name     string
	Rows     int
	ByTable  map[string]int
	Receiver int // event receivers configured (BATCHERD_EVENTS_URL)
	Keyed    bool
}

// Tables renders ByTable as "operation 1, binding 1, …" in table-name order.
func (c AdmissionRowCount) Tables() string {
	keys := make([]string, 0, len(c.ByTable))
	for k := range c.ByTable {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, c.ByTable[k])
	}
	return strings.Join(parts, ", ")
}

// AdmissionRows counts the rows one auto-approved admission of a new relation writes
// through st (store.OperationCreate, what POST /v1/operations calls), by counting every
// table's rows before and after it, as TestAdmissionRows does: without and with an
// Idempotency-Key, and with a key and one event receiver configured (the outbox row is
// written in the same transaction, one per receiver, only when receivers are configured:
// BATCHERD_EVENTS_URL).
func AdmissionRows(ctx context.Context, d *DB, st *store.Store) ([]AdmissionRowCount, error) {
	raw, err := d.Raw(1)
	if err != nil {
		return nil, err
	}
	defer raw.Close()
	defer st.SetEventReceivers(st.EventReceivers())
	var out []AdmissionRowCount
	for _, c := range []AdmissionRowCount{
		{Name: "without an Idempotency-Key"},
		{Name: "with an Idempotency-Key", Keyed: true},
		{Name: "with an Idempotency-Key and one event receiver", Keyed: true, Receiver: 1},
	} {
		var receivers []int64
		for i := range c.Receiver {
			receivers = append(receivers, domain.ReceiverID(fmt.Sprintf("bench-%d", i), ""))
		}
		st.SetEventReceivers(receivers)
		before, err := tableRows(ctx, raw)
		if err != nil {
			return nil, err
		}
		p := AdmissionParams("bench/rows", "rows-"+uuid.NewString()[:8])
		if !c.Keyed {
			p.IdempotencyKey, p.Fingerprint, p.IdempotencyTTL = "", "", 0
		}
		if _, created, err := st.OperationCreate(ctx, p); err != nil || !created {
			return nil, fmt.Errorf("admission %s: created %v, %v", c.Name, created, err)
		}
		after, err := tableRows(ctx, raw)
		if err != nil {
			return nil, err
		}
		c.ByTable = map[string]int{}
		for t, n := range after {
			if dn := n - before[t]; dn != 0 {
				c.ByTable[t] = dn
				c.Rows += dn
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// tableRows counts the rows of every table of db's database but goose's.
func tableRows(ctx context.Context, db *sql.DB) (map[string]int, error) {
	rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' AND table_name <> 'goose_db_version'`)
	if err != nil {
		return nil, err
	}
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return nil, err
		}
		tables = append(tables, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, t := range tables {
		var n int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+t+"`").Scan(&n); err != nil {
			return nil, err
		}
		out[t] = n
	}
	return out, nil
}
