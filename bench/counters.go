package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/jmoiron/sqlx"
)

// counted are the session status counters read around a measured call.
var counted = []string{"Questions", "Com_select", "Com_insert", "Com_update", "Com_delete",
	"Com_begin", "Com_commit", "Com_rollback", "Com_set_option", "Com_insert_select", "Com_stmt_execute"}

// Counters are session status values (SHOW SESSION STATUS).
type Counters map[string]int64

// ReadCounters reads the session counters through db, which must be a pool of exactly
// one connection (MaxOpenConns 1) shared with the code being measured, so that the
// session is the one that ran the statements.
func ReadCounters(ctx context.Context, db *sqlx.DB) (Counters, error) {
	rows, err := db.QueryContext(ctx, "SHOW SESSION STATUS WHERE Variable_name IN ('"+strings.Join(counted, "','")+"')")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	c := Counters{}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		c[k] = v
	}
	return c, rows.Err()
}

// Statements is what a measured call sent: counter deltas minus the reading overhead.
type Statements struct {
	Total int64            // Questions: every statement the client sent
	By    map[string]int64 // Com_* deltas that are not zero
}

// String renders "total (select 3, insert 2, …)".
func (s Statements) String() string {
	var parts []string
	keys := make([]string, 0, len(s.By))
	for k := range s.By {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", strings.TrimPrefix(k, "Com_"), s.By[k]))
	}
	return fmt.Sprintf("%d (%s)", s.Total, strings.Join(parts, ", "))
}

// CountStatements runs fn and returns the statements it sent on db's one connection.
// The SHOW itself counts as a question; a calibration pair of reads removes it.
func CountStatements(ctx context.Context, db *sqlx.DB, fn func() error) (Statements, error) {
	c0, err := ReadCounters(ctx, db)
	if err != nil {
		return Statements{}, err
	}
	c1, err := ReadCounters(ctx, db)
	if err != nil {
		return Statements{}, err
	}
	overhead := c1["Questions"] - c0["Questions"]
	if err := fn(); err != nil {
		return Statements{}, err
	}
	c2, err := ReadCounters(ctx, db)
	if err != nil {
		return Statements{}, err
	}
	s := Statements{Total: c2["Questions"] - c1["Questions"] - overhead, By: map[string]int64{}}
	if s.Total < 0 {
		return Statements{}, fmt.Errorf("session counters went back: the pool changed its connection")
	}
	for _, k := range counted[1:] {
		if d := c2[k] - c1[k]; d != 0 {
			s.By[k] = d
		}
	}
	return s, nil
}
