package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/batcherd/batcherd/bench"
	"github.com/batcherd/batcherd/internal/store"
)

type profileOut struct {
	mode bench.AdmitMode
	res  bench.Result
	top  string
}

type report struct {
	cfg                  config
	started              time.Time
	total                time.Duration
	machine              bench.Machine
	endLoad, endPressure string
	took, skipped        []string
	failures             []string

	tp         map[int]map[string][]bench.Result
	admitStats store.AdmitStats
	profiles   []profileOut
	anatomy    []bench.AnatomyStep
	rows       []bench.AdmissionRowCount
	lat        map[bool]map[bench.ClaimVariant][]bench.LatencyResult
	loads      []string

	claimBySize, claimByBatch []bench.ClaimSample
	settles                   []bench.SettleResult
	cont                      *bench.ContentionResult
	e2e, baseline             *bench.E2EResult
}

var names = map[string]string{
	"raw-go":        "raw single-row INSERT, minimal Go loop",
	"raw-slap":      "raw single-row INSERT, mariadb-slap",
	"store-serial":  "store, per-request transaction (before: `AdmitSerial`)",
	"store-single":  "store, group transaction of one (fewer round trips, no coalescing: `AdmitSingle`)",
	"store-grouped": "store, group commit (default: `AdmitGrouped`)",
	"api-serial":    "HTTP API, per-request transaction",
	"api-grouped":   "HTTP API, group commit (default)",
	"api-wrk":       "HTTP API, group commit, driven by wrk",
}

// median of a per-repetition value.
func med(rs []bench.Result, f func(bench.Result) float64) float64 {
	xs := make([]float64, 0, len(rs))
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return bench.Median(xs)
}

func rate(r bench.Result) float64 { return r.Rate() }

func msf(f float64) string { return bench.Ms(time.Duration(f)) }

func usf(f float64) string {
	if f == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f", f/1e3)
}

func yes(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

// ceiling is the higher of the two raw measurements at c clients.
func (r *report) ceiling(c int) float64 {
	return max(med(r.tp[c]["raw-go"], rate), med(r.tp[c]["raw-slap"], rate))
}

// apiRate is the higher of the two API measurements at c clients (in-process Go client,
// wrk), as the ceiling is the higher of its two (Go loop, mariadb-slap): each side gets
// the better of an in-process Go client and a C load generator in its own process. It
// returns the variant that gave it.
func (r *report) apiRate(c int) (float64, string) {
	g, k := med(r.tp[c]["api-grouped"], rate), med(r.tp[c]["api-wrk"], rate)
	if k > g {
		return k, "wrk"
	}
	return g, "Go client"
}

func (r *report) markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	m := r.machine
	w("# batcherd benchmarks\n\n")
	w("Written by `make bench` (`go run ./bench/cmd/benchrun`), which measured every figure below in one run of %s on %s. ",
		r.total.Round(time.Second), r.started.UTC().Format("2006-01-02 15:04 UTC"))
	w("The targets are issue 20's (the second performance pass; issue 8 asked for these measurements first), each with the reason for a miss below the summary. ")
	w("Numbers are medians of interleaved repetitions, compared side by side with ratios, because this machine is shared: ")
	w("its absolute numbers move by a factor of two from one minute to the next (load and CPU pressure below).\n\n")

	w("## Summary\n\n")
	r.summary(w)

	r.analysis(w)

	w("\n## Machine\n\n")
	w("| | |\n|---|---|\n")
	w("| CPUs (nproc) | %d × %s |\n", m.CPUs, m.CPUModel)
	w("| memory | %s |\n", m.MemTotal)
	w("| kernel | %s |\n", m.Kernel)
	w("| database | MariaDB %s on 127.0.0.1:3306, same machine |\n", m.Server)
	w("| server settings | %s |\n", strings.Join(m.Settings, ", "))
	w("| Go | %s |\n", m.Go)
	w("| load average at start / end | %s / %s |\n", m.LoadAvg, r.endLoad)
	w("| CPU pressure at start / end | %s / %s |\n", m.CPUPressure, r.endPressure)
	w("| sections | %s |\n", strings.Join(r.took, ", "))
	if len(r.skipped) > 0 {
		w("| skipped | %s |\n", strings.Join(r.skipped, ", "))
	}
	if len(r.failures) > 0 {
		w("\n**Failures in this run:**\n\n")
		for _, f := range r.failures {
			w("- %s\n", f)
		}
	}

	r.throughputSection(w)
	r.anatomySection(w)
	r.rowsSection(w)
	r.profileSection(w)
	r.latencySection(w)
	r.claimSection(w)
	r.settleSection(w)
	r.contentionSection(w)
	r.e2eSection(w)
	r.methodSection(w)
	return b.String()
}

const (
	claimTarget      = 50 * time.Millisecond
	claimFlatTarget  = 1.5
	latencyTarget    = 2.0 // admission p99 while claiming ÷ without
	loserRoundTrips  = 2.0 // losing claimant p99 ÷ a bare round trip's p99
	rowsTarget       = 3   // rows per admission without an Idempotency-Key
	rowsKeyedTarget  = 4   // with one
	settlePerStmtMin = 20  // members per settlement statement: grows with size/chunk
)

// summary writes one row per target of issue 20's table (in its order), then the
// other measured figures.
func (r *report) summary(w func(string, ...any)) {
	w("| # | measurement | target | measured | |\n|---|---|---|---|---|\n")
	if nk, k, kr, ok := r.rowCounts(); ok {
		w("| 1c | rows written per admission without / with an Idempotency-Key | ≤ %d / ≤ %d | %d / %d (an event receiver adds its outbox row in the same transaction: %d with a key and one receiver) | %s |\n",
			rowsTarget, rowsKeyedTarget, nk.Rows, k.Rows, kr.Rows, yes(nk.Rows <= rowsTarget && k.Rows <= rowsKeyedTarget))
	}
	if r.tp != nil {
		for _, c := range r.cfg.clients {
			ceil := r.ceiling(c)
			if ceil == 0 {
				continue
			}
			s := med(r.tp[c]["store-grouped"], rate) / ceil
			ar, by := r.apiRate(c)
			a := ar / ceil
			goRaw := med(r.tp[c]["raw-go"], rate)
			other := func(x float64, v string) string {
				parts := []string{}
				if goRaw > 0 {
					parts = append(parts, fmt.Sprintf("÷ Go loop %.2f", x*ceil/goRaw))
				}
				if b := med(r.tp[c][v], rate); b > 0 {
					parts = append(parts, fmt.Sprintf("%.1f× per-request", x*ceil/b))
				}
				return strings.Join(parts, "; ")
			}
			st, at := admissionTarget(c)
			w("| 1 | admission, store, %d client(s) | ≥ %.2f of raw | %.2f (%.0f/s vs %.0f/s; %s) | %s |\n", c, st, s, s*ceil, ceil,
				other(s, "store-serial"), yes(s >= st))
			w("| 1 | admission, HTTP API, %d client(s) | ≥ %.2f of raw | %.2f (%.0f/s, %s; %s) | %s |\n", c, at, a, a*ceil, by,
				other(a, "api-serial"), yes(a >= at))
		}
	}
	if len(r.claimBySize) > 0 {
		lo, hi := r.claimBySize[0].Median, r.claimBySize[0].Median
		for _, s := range r.claimBySize {
			lo, hi = min(lo, s.Median), max(hi, s.Median)
		}
		ratio := float64(hi) / float64(lo)
		w("| 3 | claim of 1,000, slowest median over %s waiting | ≤ %s ms | %s ms | %s |\n", r.claimSizesText(),
			bench.Ms(claimTarget), bench.Ms(hi), yes(hi <= claimTarget))
		w("| 3 | claim of 1,000: slowest ÷ fastest median over %s waiting (flat) | ≤ %.1f | %.2f | %s |\n", r.claimSizesText(),
			claimFlatTarget, ratio, yes(ratio <= claimFlatTarget))
	}
	for _, drain := range []bool{false, true} {
		if p, ok := r.latP99Ratio(drain); ok {
			set := "preloaded waiting set"
			if drain {
				set = "drained (each claim takes every waiting row)"
			}
			w("| 2 | admission p99 while claims of 1,000 run back to back ÷ without, %s | ≤ %.1f | %.2f | %s |\n", set, latencyTarget, p, yes(p <= latencyTarget))
		}
	}
	if c := r.cont; c != nil {
		ratio := float64(c.Losers.P99) / float64(max(c.RoundTrip.P99, 1))
		w("| 5 | losing claimant p99 | ≤ %.0f × a bare round trip's p99 in the same run | %s ms = %.2f × %s ms | %s |\n",
			loserRoundTrips, bench.Ms(c.Losers.P99), ratio, bench.Ms(c.RoundTrip.P99), yes(c.RoundTrip.P99 > 0 && ratio <= loserRoundTrips))
		w("| 5 | contention: errors | 0 | %d | %s |\n", c.Errors, yes(c.Errors == 0))
	}
	if ok, txt := r.settleVerdict(); txt != "" {
		w("| 4 | settlement statements grow with size/chunk, not size | | %s | %s |\n", txt, yes(ok))
	}
	if e, bl := r.e2e, r.baseline; e != nil && bl != nil && bl.Merged > 0 && e.Merged > 0 {
		w("| 6 | end to end, %d operations: time until all merged | (vs one MR per operation) | %s vs %s (extrapolated) | |\n",
			e.Cfg.Ops, e.MergedTime.Round(100*time.Millisecond), r.baselineExtrapolated().Round(time.Minute))
		w("| 6 | end to end: MRs; GitLab calls per operation | | %d vs %d; %.3f vs %.1f | |\n",
			e.MRs, e.Cfg.Ops, e.CallsPerOp(), bl.CallsPerOp())
	}
	w("| 8 | failure isolation: pipeline runs ÷ the group-testing bound, k ≤ 2; innocents named by a flake | within 1.5×; none | section 8 (bench/cmd/isolation, run by `make bench` after this) | |\n")
}

// rowCounts returns the admission row counts without a key, with one, and with one and
// a receiver.
func (r *report) rowCounts() (nk, k, kr bench.AdmissionRowCount, ok bool) {
	if len(r.rows) != 3 {
		return nk, k, kr, false
	}
	return r.rows[0], r.rows[1], r.rows[2], true
}

func (r *report) rowsSection(w func(string, ...any)) {
	if len(r.rows) == 0 {
		return
	}
	w("\n## 1c. Rows written per admission\n\n")
	w("One auto-approved admission of a new relation through `store.OperationCreate` (what `POST /v1/operations` calls), " +
		"every table's rows counted before and after it (as `TestAdmissionRows` does). The created and admitted events are " +
		"derived from the operation row when the event log is read, not written. An event receiver (`BATCHERD_EVENTS_URL`) " +
		"adds one outbox row per receiver in the same transaction (the transactional outbox), and only when one is configured.\n\n")
	w("| admission | rows | by table |\n|---|---:|---|\n")
	for _, c := range r.rows {
		w("| %s | %d | %s |\n", c.Name, c.Rows, c.Tables())
	}
}

// admissionTarget is the ratio to raw that admission should reach at c clients, in the
// store and through the HTTP API: issue 20's targets (store 0.55 / 0.55 / 0.75 at 1 / 8 /
// 32 clients, API 0.40 / 0.50 at 8 / 32), issue 8's 0.40 for the API at one client.
func admissionTarget(c int) (store, api float64) {
	switch {
	case c >= 32:
		return 0.75, 0.50
	case c >= 8:
		return 0.55, 0.40
	}
	return 0.55, 0.40
}

func (r *report) claimSizesText() string {
	var s []string
	for _, c := range r.claimBySize {
		s = append(s, count(c.Waiting))
	}
	return strings.Join(s, "/")
}

func count(n int) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return fmt.Sprintf("%dM", n/1000000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

func (r *report) throughputSection(w func(string, ...any)) {
	if r.tp == nil {
		return
	}
	w("\n## 1. Admission throughput\n\n")
	w("Closed loop: each client sends the next request when the previous one was answered, for %s, %d repetitions "+
		"interleaved (the order rotates), median shown. Every run starts from empty tables (all of them truncated "+
		"before it), so no variant writes into what the runs before it left behind. An admission is an auto-approved grant of a new relation with an "+
		"Idempotency-Key: it writes the key, the operation, the binding and the waiting row (4 rows; 3 without a key — the created and admitted events are derived from the operation row when read, TestAdmissionRows counts them) "+
		"and checks its file for a case collision, in one statement that answers with the id and the clock it wrote (nothing is read back). "+
		"No event receiver is configured: with one (BATCHERD_EVENTS_URL), an auto-approved admission writes one more row, its operation.queued event, "+
		"in the same statement. "+
		"The raw ceiling writes one `operation` row per autocommit INSERT. Ratios are to the higher of the two raw "+
		"figures at the same concurrency; the summary's API figure is likewise the higher of its two clients (the "+
		"in-process Go client, and wrk — a C load generator in its own process, as mariadb-slap is for the raw INSERT; "+
		"its client CPU column is this process's, the API server's and store's, without the client). CPU columns: CPU time per admission of this process (clients, store, API) and "+
		"of mariadbd, from /proc — the server's figure includes whatever other sessions ran on the shared server "+
		"meanwhile (other test suites use it too), so read it in the quiet rows.\n\n", r.cfg.dur, r.cfg.reps)
	for _, c := range r.cfg.clients {
		ceil := r.ceiling(c)
		w("**%d client(s)**\n\n", c)
		w("| variant | ops/s | ÷ raw | ÷ per-request | p50 ms | p99 ms | client CPU µs/op | server CPU µs/op | notes |\n")
		w("|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
		base := map[string]float64{
			"store-single": med(r.tp[c]["store-serial"], rate), "store-grouped": med(r.tp[c]["store-serial"], rate),
			"api-grouped": med(r.tp[c]["api-serial"], rate), "api-wrk": med(r.tp[c]["api-serial"], rate),
		}
		for _, v := range variants {
			rs := r.tp[c][v]
			if len(rs) == 0 {
				continue
			}
			rt := med(rs, rate)
			vs := ""
			if b := base[v]; b > 0 {
				vs = fmt.Sprintf("%.1f×", rt/b)
			}
			p50 := med(rs, func(x bench.Result) float64 { return float64(x.Lat.P50) })
			p99 := med(rs, func(x bench.Result) float64 { return float64(x.Lat.P99) })
			lat50, lat99 := msf(p50), msf(p99)
			if v == "raw-slap" {
				lat50, lat99 = "–", "–"
			}
			note := ""
			for _, x := range rs {
				if x.Note != "" {
					note = x.Note
				}
			}
			errs := int64(0)
			for _, x := range rs {
				errs += x.Errors
			}
			if errs > 0 {
				note = fmt.Sprintf("%d errors; %s", errs, note)
			}
			w("| %s | %.0f | %.2f | %s | %s | %s | %s | %s | %s |\n", names[v], rt, rt/ceil, vs, lat50, lat99,
				usf(med(rs, func(x bench.Result) float64 { return float64(x.SelfCPU) })),
				usf(med(rs, func(x bench.Result) float64 { return float64(x.ServerCPU) })), note)
		}
		w("\n")
	}
	s := r.admitStats
	w("Admission counters of the throughput store over all grouped runs: %d group transactions for %d requests "+
		"(%.1f per group, largest %d), %d of them as compound statements, %d optimistic one-round-trip attempts (%d refused), "+
		"%d requests answered by the per-request path, %d groups fell back.\n",
		s.Groups, s.Grouped, float64(s.Grouped)/float64(max(1, s.Groups)), s.MaxGroup, s.Compound, s.Optimistic, s.OptimisticMisses,
		s.Serial, s.Fallbacks)
}

func (r *report) profileSection(w func(string, ...any)) {
	if len(r.profiles) == 0 {
		return
	}
	w("\n## 7. Profile of the hottest path: admission\n\n")
	w("CPU profile (runtime/pprof) of this process during %s of store-level admission at 32 clients, before (per-request "+
		"transaction) and after (group commit). The database server's side is in the CPU columns of section 1.\n\n", r.cfg.profileDur)
	for _, p := range r.profiles {
		w("**%s** — %.0f admissions/s, client CPU %s µs/op, server CPU %s µs/op\n\n```\n%s\n```\n\n", p.mode, p.res.Rate(),
			usf(float64(p.res.SelfCPU)), usf(float64(p.res.ServerCPU)), p.top)
	}
}

func mergeLat(rs []bench.LatencyResult) (bench.Summary, float64, int, bench.Summary) {
	// The summaries of the repetitions are combined by taking the median of each figure.
	var p50, p99, mx, rt, cl, c50 []float64
	for _, x := range rs {
		p50 = append(p50, float64(x.Admissions.P50))
		p99 = append(p99, float64(x.Admissions.P99))
		mx = append(mx, float64(x.Admissions.Max))
		rt = append(rt, x.Rate)
		cl = append(cl, float64(x.Claims))
		c50 = append(c50, float64(x.ClaimTime.P50))
	}
	return bench.Summary{P50: time.Duration(bench.Median(p50)), P99: time.Duration(bench.Median(p99)), Max: time.Duration(bench.Median(mx))},
		bench.Median(rt), int(bench.Median(cl)), bench.Summary{P50: time.Duration(bench.Median(c50))}
}

func (r *report) latP99Ratio(drain bool) (float64, bool) {
	if r.lat == nil || len(r.lat[drain][bench.NoClaims]) == 0 || len(r.lat[drain][bench.StoreClaims]) == 0 {
		return 0, false
	}
	a, _, _, _ := mergeLat(r.lat[drain][bench.NoClaims])
	b, _, _, _ := mergeLat(r.lat[drain][bench.StoreClaims])
	if a.P99 == 0 {
		return 0, false
	}
	return float64(b.P99) / float64(a.P99), true
}

func (r *report) latencySection(w func(string, ...any)) {
	if r.lat == nil {
		return
	}
	w("\n## 2. Admission latency while claiming\n\n")
	w("4 clients admit (store, group commit) into one repository for %s while, next to them, one claimer claims up to 1,000 "+
		"back to back in the same repository, freeing the slot after each claim (the claimed rows stay claimed). Three "+
		"variants, run interleaved twice (median of the two): no claims; `store.BatchClaim` (READ COMMITTED, no locking "+
		"read); and the rejected design, the same statements with the waiting rows read `FOR UPDATE` under REPEATABLE READ "+
		"(written in bench/latency.go only). Two waiting sets: **preloaded** — %s waiting rows, so each claim takes 1,000 "+
		"of the oldest while admissions append at the end of the index; **drained** — only what the admissions add, so "+
		"each claim takes every waiting row (the common case, and the one measured in docs/ARCHITECTURE.md, \"Database facts\": the locking claim's next-key "+
		"locks then cover the end of the range where admissions insert).\n\n", r.cfg.latDur, count(r.cfg.latPreload))
	for _, drain := range []bool{false, true} {
		title := "preloaded (claims of 1,000)"
		if drain {
			title = "drained (each claim takes every waiting row)"
		}
		base, _, _, _ := mergeLat(r.lat[drain][bench.NoClaims])
		w("**%s**\n\n| claims | admission p50 ms | p99 ms | max ms | p99 ÷ no claims | admissions/s | claims | claim p50 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|\n", title)
		for _, v := range []bench.ClaimVariant{bench.NoClaims, bench.StoreClaims, bench.ForUpdateRRClaims} {
			rs := r.lat[drain][v]
			if len(rs) == 0 {
				continue
			}
			s, rt, n, ct := mergeLat(rs)
			ratio := "1.00"
			if base.P99 > 0 && v != bench.NoClaims {
				ratio = fmt.Sprintf("%.2f", float64(s.P99)/float64(base.P99))
			}
			claimP50 := "–"
			if n > 0 {
				claimP50 = bench.Ms(ct.P50)
			}
			w("| %s | %s | %s | %s | %s | %.0f | %d | %s |\n", v, bench.Ms(s.P50), bench.Ms(s.P99), bench.Ms(s.Max), ratio, rt, n, claimP50)
		}
		w("\n")
	}
}

func (r *report) claimSection(w func(string, ...any)) {
	if len(r.claimBySize) == 0 {
		return
	}
	w("\n## 3. Claim cost\n\n")
	w("`store.BatchClaim` on a one-connection store (so its statements can be counted from SHOW SESSION STATUS), one "+
		"repository, after one unmeasured warm-up claim; each claim is undone by fixture SQL (rows back to waiting, slot "+
		"freed) so the waiting set keeps its size and every claim takes the same oldest rows. Waiting rows were bulk-loaded "+
		"with multi-row INSERTs (%s); only the oldest 5,000 have operation rows (a claim never reads further), and the "+
		"loader uses time-ordered UUIDs so that loading a million rows measures the server, not random B-tree inserts "+
		"beyond the buffer pool. Phases from store.Hooks: precheck, slot INSERT and waiting-row read (one round trip on MariaDB); "+
		"guarded UPDATEs, member history, batch row, its event and COMMIT (one round trip). Statements are the session's "+
		"`Questions` (a compound statement is one) and, by type, its `Com_*` counters, which count the statements inside a compound too.\n\n", strings.Join(r.loads, ", "))
	w("**vs waiting-set size** (batch 1,000, %d claims each)\n\n", r.cfg.claimReps)
	w("| waiting | median ms | max ms | ÷ smallest | slot+read ms | writes+commit ms | statements |\n|---:|---:|---:|---:|---:|---:|---|\n")
	first := r.claimBySize[0].Median
	for _, s := range r.claimBySize {
		w("| %s | %s | %s | %.2f | %s | %s | %s |\n", count(s.Waiting), bench.Ms(s.Median), bench.Ms(s.Max),
			float64(s.Median)/float64(first), bench.Ms(s.Read), bench.Ms(s.Writes), s.Statements)
	}
	if len(r.claimByBatch) > 0 {
		w("\n**vs batch size** (%s waiting, %d claims each)\n\n", count(r.claimByBatch[0].Waiting), r.cfg.batchReps)
		w("| batch | median ms | ms per 1,000 | slot+read ms | writes+commit ms | statements |\n|---:|---:|---:|---:|---:|---|\n")
		for _, s := range r.claimByBatch {
			w("| %s | %s | %s | %s | %s | %s |\n", count(s.Batch), bench.Ms(s.Median),
				bench.Ms(time.Duration(float64(s.Median)*1000/float64(s.Batch))), bench.Ms(s.Read), bench.Ms(s.Writes), s.Statements)
		}
	}
}

func (r *report) settleVerdict() (bool, string) {
	if len(r.settles) == 0 {
		return false, ""
	}
	ok := true
	var parts []string
	for _, s := range r.settles {
		per := float64(s.Size) / float64(max(1, s.Statements.Total))
		if per < settlePerStmtMin {
			ok = false
		}
		kind := "success"
		if !s.Success {
			kind = "failure"
		}
		parts = append(parts, fmt.Sprintf("%s %s: %d", count(s.Size), kind, s.Statements.Total))
	}
	return ok, strings.Join(parts, ", ") + " statements"
}

func (r *report) settleSection(w func(string, ...any)) {
	if len(r.settles) == 0 {
		return
	}
	w("\n## 4. Settlement cost\n\n")
	w("A batch of N operations (each with a pending binding) is claimed, then settled through the store on a " +
		"one-connection pool; statements are the session's `Questions` delta (calibrated for the SHOW itself), by type " +
		"from `Com_*`.\n\n")
	w("| members | outcome | time ms | ms per 1,000 | statements | members per statement | moved |\n|---:|---|---:|---:|---|---:|---:|\n")
	for _, s := range r.settles {
		kind := "merged"
		if !s.Success {
			kind = "failed"
		}
		w("| %s | %s | %s | %s | %s | %.0f | %d |\n", count(s.Size), kind, bench.Ms(s.Time),
			bench.Ms(time.Duration(float64(s.Time)*1000/float64(s.Size))), s.Statements,
			float64(s.Size)/float64(max(1, s.Statements.Total)), s.Moved)
	}
	w("\nThe statements are a constant (BEGIN, the batch guard, the member read, COMMIT) plus one per chunk: operations " +
		"in chunks of 500 (a locking read and an UPDATE each), bindings in chunks of 166 (grants and revokes separately), " +
		"audit events in chunks of 100 — so they grow with size/chunk, not with size.\n")
}

func (r *report) anatomySection(w func(string, ...any)) {
	if len(r.anatomy) == 0 {
		return
	}
	w("\n## 1b. Anatomy of one admission (1 client)\n\n")
	w("At 1 client nothing can be coalesced, so the admission's figure is the time of its one statement. Here it is "+
		"built up part by part on one connection, %d times per step, each step from empty tables, 3 interleaved "+
		"repetitions (median): the statements mirror the store's optimistic admission and are written in "+
		"bench/anatomy.go only to be measured; the store itself sending that statement follows, and last, for "+
		"comparison, the statement the store sent before it stopped reading the new rows back.\n\n", r.anatomy[0].Ops)
	w("| step | µs per admission | added | ÷ raw INSERT |\n|---|---:|---:|---:|\n")
	raw := float64(r.anatomy[0].PerOp)
	for i, s := range r.anatomy {
		add := ""
		if s.Added && i > 0 {
			add = fmt.Sprintf("%+.0f", float64(s.PerOp-r.anatomy[i-1].PerOp)/1e3)
		}
		w("| %s | %s | %s | %.2f |\n", s.Name, usf(float64(s.PerOp)), add, float64(s.PerOp)/max(raw, 1))
	}
}

func (r *report) contentionSection(w func(string, ...any)) {
	c := r.cont
	if c == nil {
		return
	}
	w("\n## 5. Contention for one repository's slot\n\n")
	w("%d goroutine replicas, each with its own store (pool of 4) and its own scanner, call `Scanner.RunRound` — the "+
		"code of the scheduled round: `BatchClaim`, whose first round trip is one compound statement on MariaDB — the lock-free precheck "+
		"(anything waiting? slot held by a committed batch?), then, only when it may claim, the slot INSERT, which does not wait "+
		"for a claim in flight, and the read; a loser's round ends there — %.0f times a second each on one "+
		"repository for %s%s. Meanwhile a feeder admits %d operations/s into it and a settler settles each "+
		"claimed batch as merged %s after its claim, so the slot is alternately held and free, as between rounds in "+
		"production.\n\n", c.Replicas, c.PerReplica, c.Elapsed.Round(time.Second), shortened(c.Elapsed), r.cfg.contentionAdmitPerSec, c.SettleAfter)
	outs := make([]string, 0, len(c.Outcomes))
	for k, v := range c.Outcomes {
		outs = append(outs, fmt.Sprintf("%s %d", k, v))
	}
	slices.Sort(outs)
	w("| rounds answered | rounds/s | outcomes | errors | losers p50 / p99 / max ms | slot_occupied p99 ms | winners p50 / p99 ms | batches settled | bare round trip p50 / p99 ms |\n")
	w("|---:|---:|---|---:|---|---:|---|---:|---|\n")
	w("| %d | %.1f | %s | %d | %s / %s / %s | %s | %s / %s | %d | %s / %s |\n", c.Rounds, float64(c.Rounds)/c.Elapsed.Seconds(),
		strings.Join(outs, ", "), c.Errors, bench.Ms(c.Losers.P50), bench.Ms(c.Losers.P99), bench.Ms(c.Losers.Max),
		bench.Ms(c.Occupied.P99), bench.Ms(c.Winners.P50), bench.Ms(c.Winners.P99), c.Settled, bench.Ms(c.RoundTrip.P50), bench.Ms(c.RoundTrip.P99))
	if c.FirstError != "" {
		w("\nFirst error: `%s`\n", c.FirstError)
	}
}

func (r *report) baselineExtrapolated() time.Duration {
	bl := r.baseline
	if bl == nil || bl.Merged == 0 || r.e2e == nil {
		return 0
	}
	// One active batch per repository (I1): a one-operation batch per repository at a
	// time, so the time grows linearly with the operations per repository.
	return time.Duration(float64(bl.MergedTime) * float64(r.e2e.Cfg.Ops) / float64(bl.Merged))
}

func (r *report) e2eSection(w func(string, ...any)) {
	e, bl := r.e2e, r.baseline
	if e == nil {
		return
	}
	w("\n## 6. End to end\n\n")
	w("%d `batcherd serve` processes and the GitLab simulator as processes (internal/harness), %d repositories, every "+
		"GitLab API call delayed %s (a simulator latency fault on every route), pipelines of %s, merge mode auto, claim "+
		"schedule every second, reconcile every second, auto-approve. %d clients submit through the HTTP API (round robin "+
		"over the replicas, with Idempotency-Keys); the clock runs from the first submission until every operation is "+
		"merged (read from the database). GitLab calls are those the simulator answered after start-up.\n\n",
		e.Cfg.Replicas, e.Cfg.Repos, e.Cfg.CallDelay, e.Cfg.Pipeline, e.Cfg.Clients)
	w("| run | operations | max batch | admissions answered in | all merged after | merged / failed | batches | MRs | GitLab calls | calls per operation |\n")
	w("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n")
	row := func(name string, x *bench.E2EResult) {
		w("| %s | %d | %d | %s | %s | %d / %d | %d | %d | %d | %.3f |\n", name, x.Cfg.Ops, x.Cfg.MaxBatch,
			x.SubmitTime.Round(time.Millisecond), x.MergedTime.Round(time.Millisecond), x.Merged, x.Failed, x.Batches, x.MRs,
			x.GitLabCalls, x.CallsPerOp())
	}
	row("batched (default max batch 500)", e)
	if bl != nil {
		row("one MR per operation (max batch 1)", bl)
		ext := r.baselineExtrapolated()
		w("\nThe one-MR-per-operation baseline was run with %d operations only: with one active batch per repository (I1) "+
			"each repository merges one operation per cycle (claim tick, publish, %s pipeline, reconcile), so %d operations "+
			"would take about **%s** (%d × %s ÷ %d, linear in operations per repository) — %.0f× the batched run's %s — "+
			"and need %d MRs and about %.0f GitLab calls instead of %d MRs and %d calls.",
			bl.Cfg.Ops, bl.Cfg.Pipeline, e.Cfg.Ops, ext.Round(time.Minute), e.Cfg.Ops, bl.MergedTime.Round(100*time.Millisecond), bl.Merged,
			float64(ext)/float64(e.MergedTime), e.MergedTime.Round(100*time.Millisecond), e.Cfg.Ops, bl.CallsPerOp()*float64(e.Cfg.Ops), e.MRs, e.GitLabCalls)
		if !e.Complete {
			w(" The batched run did not finish within its timeout.")
		}
		w("\n")
	}
}

func (r *report) methodSection(w func(string, ...any)) {
	w("\n## Method and reproduction\n\n")
	w("- `make bench` builds `bin/` and runs `go run ./bench/cmd/benchrun -out BENCHMARKS.md -bin bin`. Flags shorten or skip " +
		"sections (`-quick`, `-skip e2e,…`); `go test -run '^$' -bench . ./bench/` runs the Go benchmarks of the same " +
		"measurements (admission at 1/8/32 clients per mode, claim, settlement), which report ops/s and statement counts.\n")
	w("- Every measurement uses its own freshly migrated database on the server of `BATCHERD_TEST_DSN` and drops it; only " +
		"loopback traffic.\n")
	w("- Throughput: closed loops of N goroutines (in process; the HTTP API runs on a loopback `httptest` server in the " +
		"same process, with keep-alive clients); and, for the API, wrk when installed (`scripts/bench-tools.sh`, run by " +
		"`make bench`, installs it and mariadb-slap on Debian): N keep-alive connections on up to 2 wrk threads, each " +
		"request a new admission with its own Idempotency-Key; a non-2xx answer or a socket error fails the run, and " +
		"every admission it counted must be in the database. The store's pool is 20 connections, the default of " +
		"`BATCHERD_MYSQL_MAX_CONNS`; the raw Go loop gets one connection per client.\n")
	w("- Latencies are per request, nearest-rank percentiles.\n")
	w("- Admission modes (`bench.AdmitMode`; the store has one, `AdmitGrouped`): `AdmitSerial` is the per-request transaction admission used before " +
		"this work (and still the fallback of the group path); `AdmitSingle` runs each request alone through the group " +
		"code (fewer round trips, no coalescing); `AdmitGrouped`, the default, coalesces concurrent admissions.\n")
}

func cpuOf(rs []bench.Result) (client, server float64) {
	return med(rs, func(x bench.Result) float64 { return float64(x.SelfCPU) }),
		med(rs, func(x bench.Result) float64 { return float64(x.ServerCPU) })
}

func groupSize(rs []bench.Result) float64 {
	// The note says "n requests/group"; the counters are per run.
	var xs []float64
	for _, x := range rs {
		var g float64
		if _, err := fmt.Sscanf(x.Note, "%f requests/group", &g); err == nil {
			xs = append(xs, g)
		}
	}
	return bench.Median(xs)
}

// analysis explains the misses with the run's own figures.
func (r *report) analysis(w func(string, ...any)) {
	w("\n## Why the misses miss (from this run's figures)\n\n")
	if r.tp != nil && len(r.cfg.clients) > 0 {
		cs := r.cfg.clients
		one, hi := cs[0], cs[len(cs)-1]
		rc, rsv := cpuOf(r.tp[hi]["raw-go"])
		gc, gsv := cpuOf(r.tp[hi]["store-grouped"])
		w("- **Admission throughput.** The database and the clients share %d CPUs, and at %d clients both are "+
			"CPU-bound: a raw INSERT cost %s µs of server CPU (%s µs in the Go client), a grouped admission %s µs "+
			"(%s µs). An admission writes 4 rows with 13 secondary-index entries (3 rows and 11 entries without a key) "+
			"and looks up one more (its case-collision check), where the raw INSERT writes 1 row with 4 entries; nothing is "+
			"read back. So even with the statement and commit overhead shared by a whole group it needs more server work "+
			"than the ceiling it is compared with.", r.machine.CPUs, hi, usf(rsv), usf(rc), usf(gsv), usf(gc))
		if g8, g32 := groupSize(r.tp[cs[min(1, len(cs)-1)]]["store-grouped"]), groupSize(r.tp[hi]["store-grouped"]); len(cs) >= 3 && g8 > 0 && g32 > g8 {
			_, s8 := cpuOf(r.tp[cs[1]]["store-grouped"])
			// Server CPU per admission = F/g + v for groups of g: F per group, v per
			// admission, fitted through the two points.
			f := (s8 - gsv) / (1/g8 - 1/g32)
			v := gsv - f/g32
			if v > 0 && f > 0 {
				w(" Fitting server CPU per group through the %d- and %d-client runs (groups of %.1f and %.1f): about %s µs "+
					"per group plus %s µs per admission — so small groups (%d clients) pay the per-group part on few "+
					"admissions, and the per-admission part alone is about %.1f× a raw INSERT.", cs[1], hi, g8, g32,
					usf(f), usf(v), cs[1], v/max(rsv, 1))
			}
		}
		p50raw := med(r.tp[one]["raw-go"], func(x bench.Result) float64 { return float64(x.Lat.P50) })
		p50adm := med(r.tp[one]["store-grouped"], func(x bench.Result) float64 { return float64(x.Lat.P50) })
		if sl, g := med(r.tp[hi]["raw-slap"], rate), med(r.tp[hi]["raw-go"], rate); sl > g*1.2 {
			_, slsv := cpuOf(r.tp[hi]["raw-slap"])
			w(" The ceiling is mariadb-slap's %.0f/s, %.1f× the minimal Go loop's %.0f/s: its C client leaves more of "+
				"the shared CPUs to the server (server CPU per INSERT %s µs), while the Go clients of the store and API "+
				"measurements run in this process.", sl, sl/g, g, usf(slsv))
		}
		w(" With %d client nothing can be coalesced and the figure is latency: the admission is one round trip too "+
			"(the optimistic compound statement) but carries 4 rows and a transaction, p50 %s ms against %s ms for the raw "+
			"INSERT. The HTTP API adds JSON, routing and a loopback HTTP exchange, in the same process and on the same CPUs.",
			one, msf(p50adm), msf(p50raw))
		if a := r.anatomy; len(a) == 7 {
			us := func(i int) float64 { return float64(a[i].PerOp) }
			w(" Section 1b takes the one-client admission apart: the operation row alone, in a transaction, costs %.2f× "+
				"the raw INSERT; the other three rows add %s µs, the case-collision check %s µs, the answer (first id and "+
				"clock, no row read back) %s µs; the store sending that statement takes %.2f× the raw INSERT (the statement "+
				"it sent before, with a read-back of the new rows and row-count guards, %.2f×). Four rows in a transaction "+
				"take %.2f× the raw INSERT's time before anything else, so the one-client ratio is bounded by about %.2f.",
				us(1)/max(us(0), 1), usf(us(2)-us(1)), usf(us(3)-us(2)), usf(us(4)-us(3)), us(5)/max(us(0), 1),
				us(6)/max(us(0), 1), us(2)/max(us(0), 1), us(0)/max(us(2), 1))
		}

		w("\n")
	}
	for _, drain := range []bool{false, true} {
		p, ok := r.latP99Ratio(drain)
		if !ok || p <= latencyTarget || len(r.lat[drain][bench.StoreClaims]) == 0 {
			continue
		}
		set := "preloaded"
		if drain {
			set = "drained"
		}
		_, _, n, ct := mergeLat(r.lat[drain][bench.StoreClaims])
		busy := float64(n) * float64(ct.P50) / float64(r.cfg.latDur)
		w("- **Admission p99 while claiming, %s (%.2f).** Admissions do not wait for the claim's locks (READ COMMITTED, "+
			"no locking read; TestI3AdmissionNeverWaitsForClaim and TestAdmissionNeverWaitsForOpenClaim hold a claim open "+
			"and admit meanwhile); they wait for CPU. The claims run back to back: %d claims of p50 %s ms kept the claimer "+
			"busy %.0f%% of the %s, whatever one claim costs — a cheaper claim only makes more of them — on a %d-CPU machine "+
			"that also runs the server, its purge and log threads and the admitting clients.", set, p, n, bench.Ms(ct.P50),
			100*min(busy, 1), r.cfg.latDur, r.machine.CPUs)
		if drain && len(r.lat[true][bench.ForUpdateRRClaims]) > 0 {
			nc, _, _, _ := mergeLat(r.lat[true][bench.NoClaims])
			rc, _, _, _ := mergeLat(r.lat[true][bench.StoreClaims])
			fu, _, _, _ := mergeLat(r.lat[true][bench.ForUpdateRRClaims])
			w(" Where the claim takes every waiting row, the locking variant's next-key locks cover the end "+
				"of the range admissions insert into: admission p50 %s ms with it, %s ms with the store's claim, %s ms "+
				"without claims.", bench.Ms(fu.P50), bench.Ms(rc.P50), bench.Ms(nc.P50))
		}
		w("\n")
	}
	if len(r.claimBySize) > 0 {
		hi := r.claimBySize[0]
		for _, s := range r.claimBySize {
			if s.Median > hi.Median {
				hi = s
			}
		}
		if hi.Median > claimTarget {
			w("- **Claim of 1,000 (%s ms).** Flat across the waiting-set sizes (the read stays an index range of the "+
				"oldest rows: %s ms for precheck, slot and read at %s waiting) but over %s ms: %s ms are the writes and COMMIT, "+
				"one round trip (%d statements counted by the server), about %s µs per claimed operation of server work on "+
				"rows: its waiting row's UPDATE (2 secondary-index entries move: idx_repo_waiting, idx_repo_group_waiting), its "+
				"operation's (1: idx_status_updated) and one member row (its primary key and idx_operation). None of the three "+
				"is derivable from the others without changing what a row says (the operation's status is read by every "+
				"path; the member row is the batch's history after the waiting row is requeued or cleaned up).\n",
				bench.Ms(hi.Median), bench.Ms(hi.Read), count(hi.Waiting), bench.Ms(claimTarget), bench.Ms(hi.Writes),
				hi.Statements.Total, usf(float64(hi.Writes)/1000))
		}
	}
	if c := r.cont; c != nil && c.RoundTrip.P99 > 0 && float64(c.Losers.P99) > loserRoundTrips*float64(c.RoundTrip.P99) {
		w("- **Losing rounds (p99 %s ms, %.2f × a bare round trip's p99 of %s ms).** On MariaDB a loser is one round "+
			"trip: the precheck, the slot attempt and, when it began one, the transaction's ROLLBACK are one compound "+
			"statement (TestLosingClaimIsOneStatement); it never waits for the winner's claim. The rest of the tail is CPU: "+
			"the 8 replicas' rounds fire together, on %d CPUs that also run the server, the winner's claim (p50 %s ms), the "+
			"feeder and the settler, while the bare round trip is sampled alone between them.\n",
			bench.Ms(c.Losers.P99), float64(c.Losers.P99)/float64(c.RoundTrip.P99), bench.Ms(c.RoundTrip.P99), r.machine.CPUs,
			bench.Ms(c.Winners.P50))
	}
}

// shortened notes a contention run shorter than the 30 s.
func shortened(d time.Duration) string {
	if d >= 29*time.Second {
		return " (the issue's 30 s)"
	}
	return " (shortened from the issue's 30 s by -contention-dur or -quick)"
}
