package store

// Start-up schema verification (I8). Seed 004's duplicate write happened because a
// "unique" index was a plain index in production: every invariant that rests on a
// constraint is only as good as the live schema, so batcherd reads the schema back from
// information_schema and refuses to run when it drifted from what the code relies on.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
)

// ErrSchemaDrift: the live schema lacks a constraint an invariant relies on. The
// wrapped message names the table, the index or column, and what is wrong.
var ErrSchemaDrift = errors.New("schema drift")

// SchemaReport is what CheckSchema found. The isolation fields are read back for the
// caller to log: they are facts about the server, not requirements (every store method
// sets its own isolation per transaction).
type SchemaReport struct {
	Database      string
	ServerVersion string
	// TxIsolation is @@tx_isolation (MariaDB, MySQL 5.7); "" when the server lacks it.
	TxIsolation string
	// TransactionIsolation is @@transaction_isolation (MySQL 8, MariaDB 11.1+); "" when absent.
	TransactionIsolation string
	// SnapshotIsolation is @@innodb_snapshot_isolation (MariaDB); "" when absent. When ON,
	// a REPEATABLE READ write to a row changed after the read view fails with 1020,
	// which the store reads as a lost race.
	SnapshotIsolation string
	// WsrepOn is @@wsrep_on ("ON" on a Galera node, "" when absent) and WsrepSyncWait
	// the wsrep_sync_wait batcherd's sessions read with: Open sets its READ bit on a
	// Galera node unless the DSN names it.
	WsrepOn, WsrepSyncWait string
	// Checked lists what was verified, one line per constraint.
	Checked []string
	// Problems lists the drift found; empty when the schema is sound.
	Problems []string
}

// LogAttrs returns the report as slog key/value pairs.
func (r SchemaReport) LogAttrs() []any {
	return []any{
		slog.String("database", r.Database),
		slog.String("server_version", r.ServerVersion),
		slog.String("tx_isolation", r.TxIsolation),
		slog.String("transaction_isolation", r.TransactionIsolation),
		slog.String("innodb_snapshot_isolation", r.SnapshotIsolation),
		slog.String("wsrep_on", r.WsrepOn),
		slog.String("wsrep_sync_wait", r.WsrepSyncWait),
		slog.Int("constraints_checked", len(r.Checked)),
		slog.Int("problems", len(r.Problems)),
	}
}

// requiredUnique is a UNIQUE index an invariant rests on, with its exact columns.
type requiredUnique struct {
	table, index string
	columns      []string
	why          string
}

var requiredUniques = []requiredUnique{
	{"merge_batch", "uk_active_slot", []string{"active_slot"}, "I1: one active batch per repository"},
	{"merge_batch_request", "uk_operation_id", []string{"operation_id"}, "I4: admitting twice queues once"},
	{"merge_batch_member", "PRIMARY", []string{"batch_id", "operation_id"}, "member history: one row per batch and operation"},
	{"operation", "uk_operation_id", []string{"operation_id"}, "one row per operation id"},
	{"binding", "uk_subject_target", []string{"subject", "target"}, "I5: one row per (subject, target)"},
	{"idempotency_key", "uk_principal_key", []string{"principal", "idem_key"}, "idempotency: one result per principal and key"},
	{"audit_event", "uk_dedupe", []string{"dedupe_key"}, "audit: re-recording an event is a no-op"},
	{"repo_control", "PRIMARY", []string{"repo"}, "queue control: one pause row per repository"},
	{"event_outbox", "uk_event_receiver", []string{"event_id", "receiver"}, "outbox: one row per event and receiver"},
}

// requiredIndex is a plain (non-unique) index a hot path relies on, with its exact
// columns: without it the query still answers, but by scanning.
type requiredIndex struct {
	table, index string
	columns      []string
	why          string
}

var requiredIndexes = []requiredIndex{
	{"merge_batch_request", "idx_repo_group_waiting", []string{"repo", "batch_id", "grp", "lane", "created_at", "id"},
		"claim: waiting rows of one group (bisection half, retry) of a repository, urgent first, then oldest"},
	{"merge_batch_request", "idx_repo_waiting", []string{"repo", "batch_id", "lane", "created_at", "id"},
		"claim: the first waiting row of a repository, urgent first, then oldest"},
	{"event_outbox", "idx_due", []string{"delivered_at", "next_attempt_at"}, "outbox: due rows and the purge, without a scan"},
	{"event_outbox", "idx_order", []string{"order_key", "receiver", "delivered_at", "id"}, "outbox: an operation's earlier undelivered event, per receiver"},
}

// requiredColumns are the failure-isolation columns (migration 00002) the claim and the
// failure settlement write in the same guarded statements as the rest of the waiting
// set: a schema without them is one the groups cannot live in.
//
// The principal columns (migration 00006) are written by admission's group statements
// and by every decision: without them no operation can be recorded. The queue-control
// columns (migration 00007) the claim and admission read and write.
var requiredColumns = map[string][]string{
	"merge_batch_request": {"grp", "kind", "parent_id", "depth", "half", "retries", "tries", "lane"},
	"merge_batch":         {"kind", "grp", "parent_id", "depth", "fail_class"},
	"merge_batch_member":  {"why"},
	"operation":           {"requested_by", "approved_by", "rejected_by", "withdrawn_by", "retried_by", "priority"},
	"audit_event":         {"actor", "repo"},
	"idempotency_key":     {"principal"},
	"repo_control":        {"paused", "reason", "paused_until", "paused_by", "version"},
}

// columnsMigration names the migration that adds each table's required columns.
var columnsMigration = map[string]string{
	"merge_batch_request": "failure isolation, migration 00002; queue control, migration 00007",
	"merge_batch":         "failure isolation, migration 00002",
	"merge_batch_member":  "failure isolation, migration 00002",
	"operation":           "principals, migration 00006; queue control, migration 00007",
	"audit_event":         "principals, migration 00006; queue control, migration 00007",
	"idempotency_key":     "principals, migration 00006",
	"repo_control":        "queue control, migration 00007",
}

// versionTables carry the monotonic version every guarded write checks and bumps (I6).
var versionTables = []string{"merge_batch", "operation", "binding"}

// indexPart is one row of information_schema.STATISTICS.
type indexPart struct {
	Table     string `db:"TABLE_NAME"`
	Index     string `db:"INDEX_NAME"`
	NonUnique int    `db:"NON_UNIQUE"`
	Seq       int    `db:"SEQ_IN_INDEX"`
	Column    string `db:"COLUMN_NAME"`
	Type      string `db:"INDEX_TYPE"`
	SubPart   *int64 `db:"SUB_PART"`
}

// columnInfo is one row of information_schema.COLUMNS.
type columnInfo struct {
	Table       string  `db:"TABLE_NAME"`
	Column      string  `db:"COLUMN_NAME"`
	Extra       string  `db:"EXTRA"`
	IsGenerated *string `db:"IS_GENERATED"`
	Expression  *string `db:"GENERATION_EXPRESSION"`
}

// CheckSchema verifies the live schema has every constraint the invariants rely on
// (I8): each required UNIQUE index exists, is unique, is a real B-tree (not MariaDB's
// HASH "long unique", whose lookups scan the table) over exactly the expected columns
// without prefixes; active_slot is a STORED generated column holding the repository
// while status is 1 or 4; the version columns exist. It also reads back the server's
// isolation variables. On drift it returns the report and an error wrapping
// ErrSchemaDrift that names each table, index or column and what is wrong.
func (s *Store) CheckSchema(ctx context.Context) (SchemaReport, error) {
	var rep SchemaReport
	if err := s.db.GetContext(ctx, &rep.Database, "SELECT COALESCE(DATABASE(), '')"); err != nil {
		return rep, translate(err)
	}
	if err := s.readIsolation(ctx, &rep); err != nil {
		return rep, err
	}

	var parts []indexPart
	if err := s.db.SelectContext(ctx, &parts,
		`SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME, INDEX_TYPE, SUB_PART
		   FROM information_schema.STATISTICS
		  WHERE TABLE_SCHEMA = DATABASE()
		  ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX`); err != nil {
		return rep, translate(err)
	}
	byIndex := map[[2]string][]indexPart{}
	for _, p := range parts {
		k := [2]string{strings.ToLower(p.Table), strings.ToLower(p.Index)}
		byIndex[k] = append(byIndex[k], p)
	}
	for _, u := range requiredUniques {
		rep.checkUnique(u, byIndex[[2]string{u.table, strings.ToLower(u.index)}])
	}
	for _, ix := range requiredIndexes {
		rep.checkIndex(ix, byIndex[[2]string{ix.table, strings.ToLower(ix.index)}])
	}

	var cols []columnInfo
	if err := s.db.SelectContext(ctx, &cols,
		`SELECT TABLE_NAME, COLUMN_NAME, EXTRA, IS_GENERATED, GENERATION_EXPRESSION
		   FROM information_schema.COLUMNS
		  WHERE TABLE_SCHEMA = DATABASE() AND COLUMN_NAME IN ('active_slot', 'version')`); err != nil {
		return rep, translate(err)
	}
	byColumn := map[[2]string]columnInfo{}
	for _, c := range cols {
		byColumn[[2]string{strings.ToLower(c.Table), strings.ToLower(c.Column)}] = c
	}
	rep.checkActiveSlot(byColumn)
	if err := s.checkColumns(ctx, &rep); err != nil {
		return rep, err
	}
	if err := s.checkInstallation(ctx, &rep); err != nil {
		return rep, err
	}
	for _, t := range versionTables {
		if _, ok := byColumn[[2]string{t, "version"}]; !ok {
			rep.problem("table %s: column version is missing (I6 guards every state write on it)", t)
		} else {
			rep.Checked = append(rep.Checked, t+".version exists")
		}
	}

	if len(rep.Problems) > 0 {
		return rep, fmt.Errorf("%w in database %q: %s", ErrSchemaDrift, rep.Database, strings.Join(rep.Problems, "; "))
	}
	return rep, nil
}

func (r *SchemaReport) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

func (r *SchemaReport) checkUnique(u requiredUnique, got []indexPart) {
	where := fmt.Sprintf("table %s, index %s (%s)", u.table, u.index, u.why)
	if len(got) == 0 {
		r.problem("%s: index is missing", where)
		return
	}
	var cols []string
	bad := false
	for _, p := range got {
		cols = append(cols, strings.ToLower(p.Column))
		if p.SubPart != nil {
			r.problem("%s: column %s is indexed on a %d-character prefix, so uniqueness is on the prefix only", where, p.Column, *p.SubPart)
			bad = true
		}
	}
	if got[0].NonUnique != 0 {
		r.problem("%s: index is not UNIQUE (a plain index enforces nothing)", where)
		bad = true
	}
	if !strings.EqualFold(got[0].Type, "BTREE") {
		r.problem("%s: index type is %s, not BTREE (MariaDB made it a long-unique HASH key: keep unique keys under 3072 bytes)", where, got[0].Type)
		bad = true
	}
	if !slices.Equal(cols, u.columns) {
		r.problem("%s: columns are (%s), want (%s)", where, strings.Join(cols, ", "), strings.Join(u.columns, ", "))
		bad = true
	}
	if !bad {
		r.Checked = append(r.Checked, fmt.Sprintf("%s.%s UNIQUE BTREE (%s)", u.table, u.index, strings.Join(u.columns, ", ")))
	}
}

// checkIndex verifies a required plain index exists over exactly its columns, without
// prefixes.
func (r *SchemaReport) checkIndex(ix requiredIndex, got []indexPart) {
	where := fmt.Sprintf("table %s, index %s (%s)", ix.table, ix.index, ix.why)
	if len(got) == 0 {
		r.problem("%s: index is missing", where)
		return
	}
	var cols []string
	for _, p := range got {
		cols = append(cols, strings.ToLower(p.Column))
		if p.SubPart != nil {
			r.problem("%s: column %s is indexed on a %d-character prefix", where, p.Column, *p.SubPart)
			return
		}
	}
	if !slices.Equal(cols, ix.columns) {
		r.problem("%s: columns are (%s), want (%s)", where, strings.Join(cols, ", "), strings.Join(ix.columns, ", "))
		return
	}
	r.Checked = append(r.Checked, fmt.Sprintf("%s.%s (%s)", ix.table, ix.index, strings.Join(ix.columns, ", ")))
}

// checkColumns verifies the columns of requiredColumns exist.
func (s *Store) checkColumns(ctx context.Context, rep *SchemaReport) error {
	var have []struct {
		Table  string `db:"TABLE_NAME"`
		Column string `db:"COLUMN_NAME"`
	}
	if err := s.db.SelectContext(ctx, &have,
		`SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS
		  WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN
		        ('merge_batch_request', 'merge_batch', 'merge_batch_member', 'operation', 'audit_event', 'idempotency_key', 'repo_control')`); err != nil {
		return translate(err)
	}
	got := map[[2]string]bool{}
	for _, c := range have {
		got[[2]string{strings.ToLower(c.Table), strings.ToLower(c.Column)}] = true
	}
	tables := make([]string, 0, len(requiredColumns))
	for t := range requiredColumns {
		tables = append(tables, t)
	}
	slices.Sort(tables)
	for _, t := range tables {
		var missing []string
		for _, c := range requiredColumns[t] {
			if !got[[2]string{t, c}] {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			rep.problem("table %s: column(s) %s missing (%s: run batcherd migrate)", t, strings.Join(missing, ", "), columnsMigration[t])
		} else {
			rep.Checked = append(rep.Checked, fmt.Sprintf("%s has %s", t, strings.Join(requiredColumns[t], ", ")))
		}
	}
	return nil
}

// checkActiveSlot verifies merge_batch.active_slot is STORED generated from status in
// (1, 4) and the repository. The expression is compared after normalising what servers
// vary on: case, backticks, whitespace and redundant parentheses around it.
func (r *SchemaReport) checkActiveSlot(byColumn map[[2]string]columnInfo) {
	const where = "table merge_batch, column active_slot (I1 slot)"
	c, ok := byColumn[[2]string{"merge_batch", "active_slot"}]
	if !ok {
		r.problem("%s: column is missing", where)
		return
	}
	extra := strings.ToUpper(c.Extra)
	if !strings.Contains(extra, "STORED GENERATED") && !strings.Contains(extra, "PERSISTENT") {
		r.problem("%s: column is not a STORED generated column (EXTRA=%q); a VIRTUAL column cannot carry the unique index reliably", where, c.Extra)
		return
	}
	expr := ""
	if c.Expression != nil {
		expr = *c.Expression
	}
	norm := normalizeExpression(expr)
	if !strings.Contains(norm, "statusin(1,4)") || !strings.Contains(norm, "thenrepo") || !strings.Contains(norm, "elsenull") {
		r.problem("%s: generation expression %q is not CASE WHEN status IN (1, 4) THEN repo ELSE NULL END", where, expr)
		return
	}
	r.Checked = append(r.Checked, "merge_batch.active_slot STORED GENERATED AS "+expr)
}

// normalizeExpression lower-cases a generation expression and drops backticks and
// whitespace so that the forms MariaDB and MySQL store compare equal.
func normalizeExpression(expr string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(expr) {
		switch r {
		case '`', ' ', '\t', '\n', '\r':
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// readIsolation reads back whichever isolation variables the server has. SHOW VARIABLES
// rather than SELECT @@…: asking for a variable the server lacks is an error, and which
// names exist differs between MariaDB and MySQL versions.
func (s *Store) readIsolation(ctx context.Context, rep *SchemaReport) error {
	rows, err := s.db.QueryxContext(ctx, `SHOW VARIABLES WHERE Variable_name IN
		('tx_isolation', 'transaction_isolation', 'innodb_snapshot_isolation', 'version', 'wsrep_on', 'wsrep_sync_wait')`)
	if err != nil {
		return translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return translate(err)
		}
		switch strings.ToLower(name) {
		case "tx_isolation":
			rep.TxIsolation = value
		case "transaction_isolation":
			rep.TransactionIsolation = value
		case "innodb_snapshot_isolation":
			rep.SnapshotIsolation = value
		case "version":
			rep.ServerVersion = value
		case "wsrep_on":
			rep.WsrepOn = value
		case "wsrep_sync_wait":
			rep.WsrepSyncWait = value
		}
	}
	return translate(rows.Err())
}
