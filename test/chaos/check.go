package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/batcherd/batcherd/internal/harness"
)

// drain learns the outcome of every unknown answer, then waits (bounded by
// Config.Drain) until the system is idle: no operation pending, queued or in a batch,
// no active batch, no expired binding left to revoke, no batch MR open. Idle must hold
// on two consecutive looks a second apart.
func (r *run) drain(ctx context.Context) {
	deadline := time.Now().Add(r.cfg.Drain)
	if err := r.load.resolve(ctx, deadline); err != nil {
		r.violation("after the chaos: %v", err)
	}
	stable := 0
	for {
		idle, why := r.idle(ctx)
		if idle {
			if stable++; stable >= 2 {
				r.logf("drained: %s", r.statusLine(ctx))
				return
			}
		} else {
			stable = 0
		}
		if time.Now().After(deadline) {
			r.violation("not drained within %s of the end of the chaos: %s", r.cfg.Drain, why)
			r.explainStuck(ctx)
			return
		}
		if !sleep(ctx, time.Second) {
			return
		}
	}
}

// idle reports whether nothing is left to do, or what is.
func (r *run) idle(ctx context.Context) (bool, string) {
	var why []string
	q := func(what, query string) {
		var n int
		if err := r.sql.QueryRowContext(ctx, query).Scan(&n); err != nil {
			why = append(why, what+": "+err.Error())
		} else if n > 0 {
			why = append(why, fmt.Sprintf("%d %s", n, what))
		}
	}
	q("operations pending approval", "SELECT COUNT(*) FROM operation WHERE status = 'pending_approval'")
	q("operations queued", "SELECT COUNT(*) FROM operation WHERE status = 'queued'")
	q("operations in a batch", "SELECT COUNT(*) FROM operation WHERE status = 'in_batch'")
	q("active batches", "SELECT COUNT(*) FROM merge_batch WHERE status IN (1, 4)")
	// A binding whose expiry revoke failed stays active for the operator's retry:
	// expiry does not start another (store.BindingsExpired).
	q("expired bindings not yet revoked", `SELECT COUNT(*) FROM binding b LEFT JOIN operation o ON o.operation_id = b.operation_id
		WHERE b.status = 'active' AND b.expires_at <= CURRENT_TIMESTAMP(6) AND NOT (o.action <=> 'revoke' AND o.status <=> 'failed')`)
	if st, err := r.c.Sim.State(ctx); err != nil {
		why = append(why, "simulator: "+err.Error())
	} else if n := countOpen(st); n > 0 {
		why = append(why, fmt.Sprintf("%d batch MRs open", n))
	}
	return len(why) == 0, strings.Join(why, ", ")
}

func countOpen(st harness.SimState) int {
	n := 0
	for _, ms := range openBatchMRs(st) {
		n += len(ms)
	}
	return n
}

// explainStuck prints what did not drain.
func (r *run) explainStuck(ctx context.Context) {
	rows, err := r.sql.QueryContext(ctx, `SELECT id, repo, status, COALESCE(mr_iid, 0), error_code, error_message,
		TIMESTAMPDIFF(SECOND, created_at, CURRENT_TIMESTAMP(6)), next_check_at FROM merge_batch WHERE status IN (1, 4)`)
	if err == nil {
		for rows.Next() {
			var id, iid, age int64
			var repo, code, msg string
			var status int
			var next time.Time
			if rows.Scan(&id, &repo, &status, &iid, &code, &msg, &age, &next) == nil {
				r.logf("  stuck batch %d %s status %d MR !%d age %ds next check %s: %s %s", id, repo, status, iid, age, next.Format(time.RFC3339Nano), code, msg)
			}
		}
		rows.Close()
	}
	rows, err = r.sql.QueryContext(ctx, `SELECT operation_id, status, COALESCE(batch_id, 0), action, subject, target FROM operation
		WHERE status IN ('pending_approval', 'queued', 'in_batch') ORDER BY id LIMIT 20`)
	if err == nil {
		for rows.Next() {
			var id, status, action, subject, target string
			var batch int64
			if rows.Scan(&id, &status, &batch, &action, &subject, &target) == nil {
				r.logf("  stuck operation %s %s (batch %d) %s %s→%s", id, status, batch, action, subject, target)
			}
		}
		rows.Close()
	}
	if st, err := r.c.Sim.State(ctx); err == nil {
		for repo, ms := range openBatchMRs(st) {
			for _, m := range ms {
				r.logf("  open MR %s!%d %s pipeline %s auto-merge %v", repo, m.IID, m.SourceBranch, m.PipelineStatus, m.AutoMerge)
			}
		}
	}
}

// dbOp is an operation as the database holds it at the end.
type dbOp struct {
	status, code, action string
}

// check verifies the end state against every answer the load received, the
// repository and `batcherd verify`.
func (r *run) check(ctx context.Context) {
	l := r.load
	ops := map[string]dbOp{}
	rows, err := r.sql.QueryContext(ctx, "SELECT operation_id, status, error_code, action FROM operation")
	if err != nil {
		r.violation("reading operations: %v", err)
		return
	}
	for rows.Next() {
		var id string
		var o dbOp
		if err := rows.Scan(&id, &o.status, &o.code, &o.action); err != nil {
			r.violation("reading operations: %v", err)
		}
		ops[id] = o
	}
	rows.Close()
	expiry := map[string]bool{}
	for _, id := range r.strings(ctx, "SELECT DISTINCT operation_id FROM audit_event WHERE code = 'expiry_revoke' AND operation_id IS NOT NULL") {
		expiry[id] = true
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	// Every operation an answer named exists and ended where it must.
	for _, id := range sortedKeys(l.ops) {
		o := l.ops[id]
		d, ok := ops[id]
		switch {
		case !ok:
			r.violation("operation %s (%s %s→%s, key %s) was answered but does not exist: lost", id, o.action, o.rel.subject, o.rel.target, o.key)
		case o.accepted && d.status != "merged" && d.status != "failed":
			r.violation("accepted operation %s (%s %s→%s) is %s, not merged or failed", id, o.action, o.rel.subject, o.rel.target, d.status)
		case o.accepted && d.status == "failed" && d.code == "":
			r.violation("failed operation %s has no reason", id)
		case !o.accepted && o.decided && o.decision == "reject" && d.status != "rejected":
			r.violation("rejected operation %s is %s", id, d.status)
		}
	}
	// Every operation in the database is one an answer named (or an expiry revoke): a
	// second operation for one key would show up here.
	for _, id := range sortedKeys(ops) {
		d := ops[id]
		switch d.status {
		case "pending_approval", "queued", "in_batch":
			r.violation("operation %s is still %s after the drain", id, d.status)
		}
		if l.ops[id] == nil && !expiry[id] {
			r.violation("operation %s (%s, %s) exists but no answer named it: created by a request whose key answered another operation?", id, d.action, d.status)
		}
	}

	// Idempotency: every 2xx answer of a key names one operation; at most one created
	// it; once one arrived, no later request with the key is refused; the stored key
	// points at that operation.
	stored := map[string]string{}
	srows, err := r.sql.QueryContext(ctx, "SELECT idem_key, operation_id FROM idempotency_key")
	if err != nil {
		r.violation("reading idempotency keys: %v", err)
	} else {
		for srows.Next() {
			var k, id string
			if srows.Scan(&k, &id) == nil {
				stored[k] = id
			}
		}
		srows.Close()
	}
	for _, key := range sortedKeys(l.keys) {
		k := l.keys[key]
		ids := map[string]bool{}
		created := 0
		for _, a := range k.answers {
			if a.status/100 == 2 {
				ids[a.opID] = true
				if a.created {
					created++
				}
			}
			if a.status == 422 {
				r.violation("key %s: the same request answered 422 %s", key, a.code)
			}
			if a.status >= 400 && a.status < 500 && !k.firstOK.IsZero() && a.sent.After(k.firstOK) {
				r.violation("key %s: request sent after the key answered %s was refused %d %s: %s (answers: %s)", key, k.opID, a.status, a.code, a.err, r.answerTrail(k))
			}
		}
		if len(ids) > 1 {
			r.violation("key %s: answers name %d different operations %v", key, len(ids), sortedKeys(ids))
		}
		if created > 1 {
			r.violation("key %s: %d answers said created (201)", key, created)
		}
		switch s, ok := stored[key]; {
		case k.opID != "" && !ok:
			r.violation("key %s answered %s but is not stored", key, k.opID)
		case k.opID != "" && s != k.opID:
			r.violation("key %s answered %s but stores %s", key, k.opID, s)
		case k.opID == "" && ok:
			r.violation("key %s stores operation %s but every answer refused it", key, s)
		}
	}

	r.checkRepository(ctx)

	out, code, err := r.c.Verify(ctx)
	r.mu.Lock()
	r.verifyOut, r.verifyCode = out, code
	r.mu.Unlock()
	if err != nil || code != 0 {
		r.violation("batcherd verify exited %d (%v):\n%s", code, err, out)
	}
}

// strings runs a query of one string column.
func (r *run) strings(ctx context.Context, query string, args ...any) []string {
	rows, err := r.sql.QueryContext(ctx, query, args...)
	if err != nil {
		r.violation("%s: %v", query, err)
		return nil
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if rows.Scan(&s) == nil {
			out = append(out, s)
		}
	}
	return out
}

type bindingFile struct {
	Subject     string `yaml:"subject"`
	Target      string `yaml:"target"`
	OperationID string `yaml:"operation_id"`
}

// checkRepository compares the repository with the database: no open MR, one MR per
// batch and the batch's own (harness.Audit), and the binding files on each default
// branch exactly the active bindings, each written by the relation's latest merged
// grant.
func (r *run) checkRepository(ctx context.Context) {
	st, err := r.c.Sim.State(ctx)
	if err != nil {
		r.violation("simulator state: %v", err)
		return
	}
	if n := countOpen(st); n > 0 {
		r.violation("%d batch MR(s) still open at the end", n)
	}
	rep, err := r.c.Audit(ctx, r.api, harness.Expect{Settled: true})
	if err != nil {
		r.violation("audit: %v", err)
	}
	for _, p := range rep.Problems {
		r.violation("audit: %s", p)
	}
	r.mu.Lock()
	r.audit = rep
	r.mu.Unlock()

	type rel struct{ subject, target string }
	latestGrant := map[rel]string{}
	rows, err := r.sql.QueryContext(ctx, "SELECT subject, target, operation_id FROM operation WHERE action = 'grant' AND status = 'merged' ORDER BY id")
	if err != nil {
		r.violation("reading merged grants: %v", err)
		return
	}
	for rows.Next() {
		var s, t, id string
		if rows.Scan(&s, &t, &id) == nil {
			latestGrant[rel{s, t}] = id
		}
	}
	rows.Close()
	want := map[string]map[string]string{} // repo → path → operation id
	var active int
	brows, err := r.sql.QueryContext(ctx, "SELECT subject, target, repo FROM binding WHERE status = 'active'")
	if err != nil {
		r.violation("reading bindings: %v", err)
		return
	}
	for brows.Next() {
		var s, t, repo string
		if brows.Scan(&s, &t, &repo) != nil {
			continue
		}
		active++
		if want[repo] == nil {
			want[repo] = map[string]string{}
		}
		want[repo][harness.BindingPath(s, t)] = latestGrant[rel{s, t}]
	}
	brows.Close()
	files := 0
	for _, repo := range repos {
		got := map[string]string{}
		for path, content := range st.Projects[repo].Files {
			if strings.HasPrefix(path, "bindings/") {
				got[path] = content
				files++
			}
		}
		for _, path := range sortedKeys(want[repo]) {
			content, ok := got[path]
			if !ok {
				r.violation("%s: active binding's file %s is missing", repo, path)
				continue
			}
			var f bindingFile
			if err := yaml.Unmarshal([]byte(content), &f); err != nil {
				r.violation("%s: %s is not YAML: %v", repo, path, err)
				continue
			}
			if harness.BindingPath(f.Subject, f.Target) != path {
				r.violation("%s: %s names subject %q and target %q", repo, path, f.Subject, f.Target)
			}
			if w := want[repo][path]; f.OperationID != w {
				r.violation("%s: %s was written by operation %s, the relation's latest merged grant is %q", repo, path, f.OperationID, w)
			}
		}
		for _, path := range sortedKeys(got) {
			if _, ok := want[repo][path]; !ok {
				r.violation("%s: file %s on the default branch, but no active binding", repo, path)
			}
		}
	}
	r.mu.Lock()
	r.files, r.activeBindings = files, active
	r.mu.Unlock()
}

// summary is the report printed at the end.
func (r *run) summary(ctx context.Context) string {
	l := r.load
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	// End states of the accepted operations, failures by reason.
	status := map[string]int{}
	reasons := map[string]int{}
	rows, err := r.sql.QueryContext(ctx, "SELECT operation_id, status, error_code FROM operation")
	dbStatus := map[string][2]string{}
	if err == nil {
		for rows.Next() {
			var id, s, code string
			if rows.Scan(&id, &s, &code) == nil {
				dbStatus[id] = [2]string{s, code}
			}
		}
		rows.Close()
	}
	l.mu.Lock()
	accepted, rejected, retriedOps := 0, 0, 0
	for _, o := range l.ops {
		d := dbStatus[o.id]
		if o.accepted {
			accepted++
			status[d[0]]++
			if d[0] == "failed" {
				reasons[d[1]]++
			}
		}
		if o.decision == "reject" && o.decided {
			rejected++
		}
		if o.retried > 0 {
			retriedOps++
		}
	}
	expiring := l.expiring
	keys, requests, unknown := len(l.keys), l.requests, l.unknown
	refused := 0
	var refusedBy []string
	for _, k := range sortedKeys(l.refused) {
		refused += l.refused[k]
		refusedBy = append(refusedBy, fmt.Sprintf("%d× %s", l.refused[k], k))
	}
	dupGroups, dupRequests, exact := l.dupGroups, l.dupRequests, l.exactRetries
	resolvedKeys, resolvedDecis, decUnknown := l.resolvedKeys, l.resolvedDecis, l.decisionUnknown
	answered := len(l.ops)
	l.mu.Unlock()
	system := map[string]int{}
	for id, d := range dbStatus {
		l.mu.Lock()
		ours := l.ops[id] != nil
		l.mu.Unlock()
		if !ours {
			system[d[0]]++
		}
	}

	r.mu.Lock()
	s := r.stats
	viol := len(r.viol)
	audit, verifyOut, verifyCode := r.audit, r.verifyOut, r.verifyCode
	files, active := r.files, r.activeBindings
	r.mu.Unlock()
	faults := 0
	var faultKinds []string
	for _, k := range sortedKeys(s.Faults) {
		faults += s.Faults[k]
		faultKinds = append(faultKinds, fmt.Sprintf("%s %d", k, s.Faults[k]))
	}
	var reasonList []string
	for _, k := range sortedKeys(reasons) {
		reasonList = append(reasonList, fmt.Sprintf("%s %d", k, reasons[k]))
	}
	if len(reasonList) == 0 {
		reasonList = []string{"none"}
	}

	p("")
	p("=== chaos summary (seed %d) ===", r.cfg.Seed)
	dbKind := "private MariaDB"
	if r.gal != nil {
		dbKind = "Galera cluster (" + r.cfg.HA + " writer)"
	}
	p("duration          %s of chaos + %s to drain (%s in all); %d replicas, 3 repositories, %s",
		s.ChaosTime.Round(100*time.Millisecond), s.DrainTime.Round(100*time.Millisecond), s.Total.Round(100*time.Millisecond), r.cfg.Replicas, dbKind)
	p("applications      %d sent with %d Idempotency-Keys (%d exact retries, %d concurrent duplicate groups of %d requests); %d answers unknown (5xx or none) and retried, %d keys resolved after the chaos",
		requests, keys, exact, dupGroups, dupRequests, unknown, resolvedKeys)
	p("                  %d operations created; %d refused by the API (%s)", answered, refused, strings.Join(refusedBy, ", "))
	p("operations        %d accepted (approved): %d merged, %d failed (%s); %d rejected; %d other",
		accepted, status["merged"], status["failed"], strings.Join(reasonList, ", "), rejected, accepted-status["merged"]-status["failed"])
	p("                  %d grants with expires_at; %d expiry revokes by batcherd (%s); %d failed operations retried by the operator (%d retries); %d decision calls retried, %d decided after the chaos",
		expiring, total(system), describe(system), retriedOps, s.OperatorRetries, decUnknown, resolvedDecis)
	p("replica kills     %d kill -9 + %d SIGTERM, each restarted (%d restart attempts failed while MariaDB was down); %d SIGSTOP freezes of up to %s",
		s.ReplicaKills, s.ReplicaTerms, s.ReplicaRestartFailures, s.ReplicaFreezes, r.cfg.FreezeMax)
	p("connection kills  %d KILL CONNECTION + %d KILL QUERY", s.ConnKills, s.QueryKills)
	how := "SIGTERM, clean shutdown"
	if r.cfg.DBCrash {
		how = "kill -9, crash recovery"
	}
	p("database restarts %d (%s; down %s in all)", s.DBRestarts, how, s.DBDowntime.Round(100*time.Millisecond))
	p("faults injected   %d (%s), applied to %d GitLab calls", faults, strings.Join(faultKinds, ", "), s.FaultCalls)
	p("human             %d MRs merged, %d closed behind batcherd's back; %d pipelines failed by hand, %d failed pipelines retried; pipelines also fail by themselves at %.0f%%; %d open MRs of settled batches merged",
		s.HumanMerges, s.HumanCloses, s.PipelinesFailedByHand, s.PipelinesRetried, 100*r.cfg.PipelineFailureRate, s.OrphanMerges)
	p("batches           %d (%s); MRs %d (%s); batches with exactly one MR %d", audit.Batches, describe(audit.BatchesByStatus), audit.MRs, describe(audit.MRsByState), audit.OneMRPerBatch)
	p("repository        %d binding files on the default branches, %d active bindings", files, active)
	p("batcherd verify   exit %d: %s", verifyCode, strings.ReplaceAll(strings.TrimSpace(verifyOut), "\n", "; "))
	p("                  and %d clean audits during the chaos (read-only account; %d could not run while MariaDB restarted)", s.LiveVerifies, s.LiveVerifyErrors)
	if r.ha != nil {
		b.WriteString(r.haSummary(ctx))
	}
	p("violations        %d", viol)
	if viol > 0 {
		r.mu.Lock()
		for i, v := range r.viol {
			if i == 50 {
				p("  … and %d more", len(r.viol)-i)
				break
			}
			p("  - %s", v)
		}
		r.mu.Unlock()
	}
	return b.String()
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// describe renders {"a": 2, "b": 1} as "2 a, 1 b".
func describe(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// answerTrail lists a key's answers with the run time each was sent and answered.
func (r *run) answerTrail(k *keyRec) string {
	var parts []string
	for _, a := range k.answers {
		what := fmt.Sprintf("%d %s", a.status, a.code)
		if a.status/100 == 2 {
			what = fmt.Sprintf("%d %s", a.status, a.opID)
		} else if a.status == 0 {
			what = "no answer: " + a.err
		}
		parts = append(parts, fmt.Sprintf("sent +%.2fs answered +%.2fs %s", a.sent.Sub(r.start).Seconds(), a.recv.Sub(r.start).Seconds(), what))
	}
	return strings.Join(parts, "; ")
}
