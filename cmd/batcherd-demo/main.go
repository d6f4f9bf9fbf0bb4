// Command batcherd-demo is `make demo`: batcherd as it runs in production — three
// `batcherd serve` replicas as separate processes, coordinating only through one
// MariaDB/MySQL database — against the GitLab simulator, on this machine, in about a
// minute.
//
// It creates a fresh database (dropped at the end), starts cmd/gitlab-sim and three
// replicas (internal/harness does the process work), then through the HTTP API only:
//
//   - applies for a few hundred grants over two repositories, in waves, and approves
//     each one (every call goes to whichever replica is next, round-robin);
//   - once early grants are merged, applies for revokes of those bindings;
//   - replays some applications with the same Idempotency-Key (same operation back);
//   - kills one replica with SIGKILL while batches are in flight, and the two
//     others finish them;
//
// printing progress every second (operations waiting / in a batch / merged, batches,
// MRs open and merged, and per replica the batches it claimed, the MRs it opened and
// the batches it settled, from each replica's /metrics). At the end it checks every
// operation merged, one MR per batch and none for a failed batch, binding files
// present or deleted in the repository, runs `batcherd verify`, prints a summary,
// stops everything and exits 0 — or exits 1 saying what is wrong.
//
// Usage (make demo builds ./bin first and passes -bin bin):
//
//	batcherd-demo [-bin DIR] [-grants 240] [-revokes 80] [-replicas 3] [-waves 12]
//	              [-wave-interval 2s] [-timeout 100s] [-keep-db] [-v]
//
// The database server is BATCHERD_TEST_DSN (default
// batcherd:batcherd@tcp(127.0.0.1:3306)/, which `make db` sets up).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

const dbPrefix = "batcherd_demo"

var repos = []string{"platform/access-bindings", "platform/network-policies"}

// Each repository gets its own target namespace: a binding (subject, target) is
// unique across repositories.
var targets = map[string][]string{
	repos[0]: {"db/orders-prod", "db/payments-prod", "db/ledger-prod", "kafka/events", "vault/ci-secrets", "s3/backups"},
	repos[1]: {"k8s/prod-eu", "k8s/prod-us", "k8s/staging", "vpn/office", "bastion/prod", "gcp/billing"},
}

type config struct {
	bin      string
	grants   int
	revokes  int
	replicas int
	waves    int
	every    time.Duration
	keepDB   bool
	verbose  bool
	timeout  time.Duration
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "bin", "", "directory with prebuilt batcherd and gitlab-sim (default: build them)")
	flag.IntVar(&cfg.grants, "grants", 240, "grant operations, split over the two repositories")
	flag.IntVar(&cfg.revokes, "revokes", 80, "revoke operations of bindings granted earlier (at most half the grants)")
	flag.IntVar(&cfg.replicas, "replicas", 3, "batcherd serve processes (one is killed midway when there are at least 2)")
	flag.IntVar(&cfg.waves, "waves", 12, "waves the grants arrive in")
	flag.DurationVar(&cfg.every, "wave-interval", 2*time.Second, "time between two waves")
	flag.BoolVar(&cfg.keepDB, "keep-db", false, "keep the demo database (and the process logs) for inspection")
	flag.BoolVar(&cfg.verbose, "v", false, "print the harness's steps")
	flag.DurationVar(&cfg.timeout, "timeout", 100*time.Second, "give up when the operations are not all merged by then")
	flag.Parse()
	if cfg.revokes > cfg.grants/2 {
		cfg.revokes = cfg.grants / 2
	}
	if cfg.grants < 2 || cfg.replicas < 1 || cfg.waves < 1 {
		fmt.Fprintln(os.Stderr, "batcherd-demo: -grants must be at least 2, -replicas and -waves at least 1")
		os.Exit(2)
	}

	// The first Ctrl-C stops what was started, in order; a second kills it all at once.
	ctx, stop := harness.InterruptContext()
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stdout, "\ninterrupted; everything the demo started is stopped")
			os.Exit(130)
		}
		fmt.Fprintf(os.Stdout, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
}

// opRec is one operation the demo applied for.
type opRec struct {
	id, repo, subject, target, action string
	wave                              int
}

type demo struct {
	cfg   config
	out   io.Writer
	c     *harness.Cluster
	api   *harness.Client
	start time.Time

	mu         sync.Mutex // guards everything below and the output
	grants     []opRec
	revokes    []opRec
	revoked    map[string]bool // grant id → revoke submitted
	replays    int
	conflicts  int // 409 answers to revokes submitted before the binding was active (retried)
	work       map[string]harness.Work
	killed     *harness.Replica
	killedAt   time.Duration
	inflight   []harness.Batch // active batches when the replica was killed
	lastPub    map[string]time.Time
	lastStatus status
}

// status is one progress sample.
type status struct {
	submitted, waiting, inBatch, merged, failedOps int
	active, succeeded, failed                      int
	mrOpen, mrMerged, mrClosed                     int
	batches                                        []harness.Batch
}

func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	d := &demo{cfg: cfg, out: out, start: time.Now(), revoked: map[string]bool{},
		work: map[string]harness.Work{}, lastPub: map[string]time.Time{}}
	fmt.Fprintf(out, "batcherd demo: %d replicas (separate processes), 2 repositories, %d grants + %d revokes through the HTTP API\n\n",
		cfg.replicas, cfg.grants, cfg.revokes)

	// Databases of earlier demos that were killed before they could drop them.
	if dropped, err := harness.DropStaleDatabases(ctx, "", dbPrefix, time.Hour); err == nil && len(dropped) > 0 {
		fmt.Fprintf(out, "dropped %d database(s) left behind by interrupted demos: %s\n\n", len(dropped), strings.Join(dropped, ", "))
	}
	var bins *harness.Binaries
	if cfg.bin != "" {
		if bins, err = harness.Prebuilt(cfg.bin); err != nil {
			return err
		}
	}
	logDir, err := os.MkdirTemp("", "batcherd-demo-logs-")
	if err != nil {
		return err
	}
	defer func() {
		entries, _ := os.ReadDir(logDir)
		if (err == nil && !cfg.keepDB) || len(entries) == 0 {
			os.RemoveAll(logDir)
		} else {
			fmt.Fprintf(out, "process logs kept in %s\n", logDir)
		}
	}()
	opts := harness.Options{
		Replicas:          cfg.replicas,
		Repos:             repos,
		DBPrefix:          dbPrefix,
		KeepDatabase:      cfg.keepDB,
		Binaries:          bins,
		LogDir:            logDir,
		PipelineDuration:  2 * time.Second,
		ClaimSchedule:     "@every 2s",
		ReconcileInterval: time.Second,
		StopGrace:         8 * time.Second,
	}
	if cfg.verbose {
		opts.Logf = func(f string, a ...any) { d.say("  harness: "+f, a...) }
	}
	if bins == nil {
		fmt.Fprintln(out, "building batcherd and gitlab-sim ...")
	}
	c, err := harness.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("starting: %w", err)
	}
	d.c = c
	defer func() {
		fmt.Fprintf(out, "\nstopping %d replica(s) and gitlab-sim (SIGTERM) ...\n", len(c.Live()))
		if cerr := c.Close(); cerr != nil {
			fmt.Fprintf(out, "cleanup: %v\n", cerr)
			if err == nil {
				err = cerr
			}
		}
		if cfg.keepDB {
			fmt.Fprintf(out, "database %s kept (-keep-db): BATCHERD_MYSQL_DSN='%s'\n", c.DBName, c.DSN)
		} else {
			fmt.Fprintf(out, "dropped database %s\n", c.DBName)
		}
	}()
	d.api = c.Client()
	fmt.Fprintf(out, "  database    %s (fresh, migrated with 'batcherd migrate')\n", c.DBName)
	fmt.Fprintf(out, "  gitlab-sim  %s  projects %s; pipelines take %s\n", c.Sim.URL, strings.Join(repos, ", "), opts.PipelineDuration)
	for _, r := range c.Replicas {
		fmt.Fprintf(out, "  %-10s  %s  pid %d  (claim round %s, reconcile every %s)\n", r.ID, r.URL(), r.Pid(), opts.ClaimSchedule, opts.ReconcileInterval)
	}
	fmt.Fprintf(out, "  started in %s\n\n", time.Since(d.start).Round(100*time.Millisecond))
	d.start = time.Now()

	runCtx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if err := d.drive(runCtx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			d.explainStuck(ctx)
			return fmt.Errorf("not every operation was merged within %s", cfg.timeout)
		}
		return err
	}
	return d.finish(ctx)
}

// say prints one event line.
func (d *demo) say(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sayLocked(format, args...)
}

func (d *demo) sayLocked(format string, args ...any) {
	fmt.Fprintf(d.out, "%6.1fs  "+format+"\n", append([]any{time.Since(d.start).Seconds()}, args...)...)
}

// drive submits the load, kills a replica midway and waits until every operation is
// merged. The progress printer runs alongside.
func (d *demo) drive(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel(nil)
	fail := func(err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			cancel(err)
		}
	}
	d.printHeader()
	wg.Go(func() { d.progress(ctx) })

	grantsDone := make(chan struct{})
	wg.Go(func() {
		defer close(grantsDone)
		fail(d.submitGrants(ctx))
	})
	wg.Go(func() { fail(d.submitRevokes(ctx, grantsDone)) })
	if d.cfg.replicas >= 2 {
		wg.Go(func() { fail(d.killOne(ctx)) })
	}

	// Done when every grant and revoke is submitted and merged.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
				return c
			}
			return ctx.Err()
		case <-tick.C:
		}
		d.mu.Lock()
		s := d.lastStatus
		total := len(d.grants) + len(d.revokes)
		want := d.cfg.grants + d.cfg.revokes
		killDone := d.killed != nil || d.cfg.replicas < 2
		d.mu.Unlock()
		if s.failedOps > 0 {
			return fmt.Errorf("%d operation(s) are in failed batches (see the batches below)%s", s.failedOps, failedBatches(s.batches))
		}
		if total == want && s.merged == want && s.active == 0 && killDone {
			d.printStatus(ctx) // the final line
			return nil
		}
	}
}

func failedBatches(bs []harness.Batch) string {
	var b strings.Builder
	for _, x := range bs {
		if x.Status == "failed" {
			fmt.Fprintf(&b, "\n  batch %d (%s): %v", x.ID, x.Repo, x.Error)
		}
	}
	return b.String()
}

// submitGrants applies for and approves the grants, in waves a second apart, half in
// each repository, 8 requests at a time.
func (d *demo) submitGrants(ctx context.Context) error {
	per := (d.cfg.grants + d.cfg.waves - 1) / d.cfg.waves
	n := 0
	for wave := 1; wave <= d.cfg.waves && n < d.cfg.grants; wave++ {
		var batch []opRec
		for i := 0; i < per && n < d.cfg.grants; i++ {
			repo := repos[n%2]
			k := n / 2
			ts := targets[repo]
			batch = append(batch, opRec{
				repo: repo, action: "grant", wave: wave,
				subject: fmt.Sprintf("user-%03d", k),
				target:  ts[k%len(ts)],
			})
			n++
		}
		if err := d.submitAll(ctx, batch, func(i int) string {
			return fmt.Sprintf("demo-grant-%s-%s", batch[i].subject, batch[i].target)
		}); err != nil {
			return err
		}
		d.mu.Lock()
		d.grants = append(d.grants, batch...)
		d.sayLocked("▶ wave %d: applied for and approved %d grants (%d so far)", wave, len(batch), len(d.grants))
		d.mu.Unlock()

		// Replay the first two of the wave with the same Idempotency-Key: the API answers
		// 200 with the operation it created the first time, and queues nothing new.
		for i := 0; i < 2 && i < len(batch); i++ {
			op, created, err := d.api.Submit(ctx, harness.OperationRequest{Subject: batch[i].subject, Target: batch[i].target, Action: "grant", Repo: batch[i].repo},
				fmt.Sprintf("demo-grant-%s-%s", batch[i].subject, batch[i].target))
			if err != nil {
				return fmt.Errorf("replaying an application: %w", err)
			}
			if created || op.ID != batch[i].id {
				return fmt.Errorf("replaying Idempotency-Key of %s gave operation %s (created=%v), want %s", batch[i].subject, op.ID, created, batch[i].id)
			}
			d.mu.Lock()
			d.replays++
			d.mu.Unlock()
		}
		if wave < d.cfg.waves {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d.cfg.every):
			}
		}
	}
	return nil
}

// submitAll applies for and approves ops concurrently, filling in their ids.
func (d *demo) submitAll(ctx context.Context, ops []opRec, key func(i int) string) error {
	var wg sync.WaitGroup
	errc := make(chan error, len(ops))
	sem := make(chan struct{}, 8)
	for i := range ops {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			o := &ops[i]
			op, _, err := d.api.Submit(ctx, harness.OperationRequest{Subject: o.subject, Target: o.target, Action: o.action, Repo: o.repo}, key(i))
			if err != nil {
				errc <- err
				return
			}
			o.id = op.ID
			if op.Status == "pending_approval" {
				if _, err := d.api.Approve(ctx, op.ID); err != nil {
					errc <- fmt.Errorf("approving %s: %w", op.ID, err)
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// submitRevokes revokes bindings granted in the first waves once their grant is
// merged (a revoke of a binding still pending is refused with 409).
func (d *demo) submitRevokes(ctx context.Context, grantsDone <-chan struct{}) error {
	if d.cfg.revokes == 0 {
		return nil
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		d.mu.Lock()
		s := d.lastStatus
		var cands []opRec
		need := d.cfg.revokes - len(d.revokes)
		merged := map[string]bool{}
		for _, b := range s.batches {
			if b.Status == "succeeded" {
				for _, id := range b.OperationIDs {
					merged[id] = true
				}
			}
		}
		// Oldest grants first, alternating repositories as the grants do.
		for _, g := range d.grants {
			if len(cands) == need {
				break
			}
			if merged[g.id] && !d.revoked[g.id] {
				cands = append(cands, opRec{repo: g.repo, subject: g.subject, target: g.target, action: "revoke", wave: g.wave, id: g.id})
			}
		}
		d.mu.Unlock()
		if need == 0 {
			return nil
		}
		if len(cands) == 0 {
			continue
		}
		grantIDs := make([]string, len(cands))
		for i := range cands {
			grantIDs[i] = cands[i].id
			cands[i].id = ""
		}
		err := d.submitAll(ctx, cands, func(i int) string { return "demo-revoke-" + grantIDs[i] })
		if harness.IsAPIError(err, 409, "") {
			d.mu.Lock()
			d.conflicts++
			d.mu.Unlock()
			continue // a binding not active yet; the next pass retries (same keys)
		}
		if err != nil {
			return fmt.Errorf("revoking: %w", err)
		}
		d.mu.Lock()
		for i, g := range grantIDs {
			d.revoked[g] = true
			d.revokes = append(d.revokes, cands[i])
		}
		d.sayLocked("▶ applied for and approved %d revokes of bindings whose grant merged (%d so far)", len(cands), len(d.revokes))
		d.mu.Unlock()
	}
}

// killOne waits until the load is well under way, then kills one replica with
// SIGKILL at a moment when every repository has a batch in flight whose MR is open:
// the killed replica leaves work behind (pipelines running, MRs to reconcile and
// settle, waiting operations to claim) and the survivors finish it.
//
// Why "MR already recorded": a replica killed in the middle of publishing (between
// claiming a batch and recording its MR) holds that batch's publish reservation,
// which another replica takes over only after the publish lease (2 minutes) — safe,
// but longer than this demo. That recovery is what the end-to-end and chaos tests
// exercise.
func (d *demo) killOne(ctx context.Context) error {
	// Start looking once half the grants are in.
	for {
		d.mu.Lock()
		half := len(d.grants) >= d.cfg.grants/2
		d.mu.Unlock()
		if half {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		bs, err := d.api.Batches(ctx, "", "running")
		if err != nil {
			return fmt.Errorf("listing batches: %w", err)
		}
		withMR := map[string]bool{}
		noMR := false
		for _, b := range bs {
			if b.MRIID != nil {
				withMR[b.Repo] = true
			} else {
				noMR = true
			}
		}
		if noMR || (len(withMR) < len(repos) && time.Now().Before(deadline)) {
			continue
		}
		// The victim: the replica that opened an MR most recently — its batch is in
		// flight — else the last one.
		live := d.c.Live()
		victim := live[len(live)-1]
		d.mu.Lock()
		var best time.Time
		for _, r := range live {
			if t := d.lastPub[r.ID]; t.After(best) {
				best, victim = t, r
			}
		}
		d.mu.Unlock()
		if err := victim.Kill(); err != nil {
			return fmt.Errorf("killing %s: %w", victim.ID, err)
		}
		var desc []string
		for _, b := range bs {
			desc = append(desc, fmt.Sprintf("batch %d (%s, %d ops, MR !%v open)", b.ID, b.Repo, b.Size, deref(b.MRIID)))
		}
		d.mu.Lock()
		d.killed, d.killedAt, d.inflight = victim, time.Since(d.start), bs
		why := ""
		if !best.IsZero() {
			why = ", the replica that opened the latest MR,"
		}
		d.sayLocked("✖ kill -9 %s (pid %d)%s with %s in flight; %s carry on",
			victim.ID, victim.Pid(), why, strings.Join(desc, " and "), others(d.c, victim))
		d.mu.Unlock()
		return nil
	}
}

func others(c *harness.Cluster, victim *harness.Replica) string {
	var ids []string
	for _, r := range c.Replicas {
		if r != victim && r.Running() {
			ids = append(ids, r.ID)
		}
	}
	return strings.Join(ids, " and ")
}

func deref(p *int64) any {
	if p == nil {
		return "?"
	}
	return *p
}

func (d *demo) printHeader() {
	d.mu.Lock()
	defer d.mu.Unlock()
	var reps []string
	for _, r := range d.c.Replicas {
		reps = append(reps, fmt.Sprintf("%-12s", r.ID))
	}
	fmt.Fprintf(d.out, "%7s  %-36s  %-17s  %-15s  %s\n", "", "operations", "batches", "MRs", "per replica: claimed/MRs opened/settled")
	fmt.Fprintf(d.out, "%7s  %8s %8s %8s %8s  %8s %8s  %7s %7s  %s\n", "time", "applied", "waiting", "in batch", "merged", "active", "done", "open", "merged", strings.Join(reps, " "))
}

// progress prints a status line every second.
func (d *demo) progress(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			d.printStatus(ctx)
		}
	}
}

func (d *demo) printStatus(ctx context.Context) {
	s, err := d.sample(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.say("(progress sample failed: %v)", err)
		}
		return
	}
	var reps []string
	for _, r := range d.c.Replicas {
		if !r.Running() {
			reps = append(reps, fmt.Sprintf("%-12s", "KILLED"))
			continue
		}
		w, err := r.Work(ctx)
		if err != nil {
			reps = append(reps, fmt.Sprintf("%-12s", "?"))
			continue
		}
		d.mu.Lock()
		if w.Published > d.work[r.ID].Published {
			d.lastPub[r.ID] = time.Now()
		}
		d.work[r.ID] = w
		d.mu.Unlock()
		reps = append(reps, fmt.Sprintf("%-12s", fmt.Sprintf("%d/%d/%d", w.Claimed, w.Published, w.Merged+w.Failed)))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastStatus = s
	fmt.Fprintf(d.out, "%6.1fs  %8d %8d %8d %8d  %8d %8d  %7d %7d  %s\n", time.Since(d.start).Seconds(),
		s.submitted, s.waiting, s.inBatch, s.merged, s.active, s.succeeded+s.failed, s.mrOpen, s.mrMerged, strings.Join(reps, " "))
}

// sample reads the batches (API) and the MRs (simulator).
func (d *demo) sample(ctx context.Context) (status, error) {
	var s status
	bs, err := d.api.Batches(ctx, "", "")
	if err != nil {
		return s, err
	}
	st, err := d.c.Sim.State(ctx)
	if err != nil {
		return s, err
	}
	d.mu.Lock()
	s.submitted = len(d.grants) + len(d.revokes)
	d.mu.Unlock()
	s.batches = bs
	for _, b := range bs {
		switch b.Status {
		case "running", "blocked":
			s.active++
			s.inBatch += len(b.OperationIDs)
		case "succeeded":
			s.succeeded++
			s.merged += len(b.OperationIDs)
		case "failed":
			s.failed++
			s.failedOps += len(b.OperationIDs)
		}
	}
	s.waiting = max(0, s.submitted-s.inBatch-s.merged-s.failedOps)
	for _, p := range st.Projects {
		for _, mrs := range p.MergeRequests {
			for _, m := range mrs {
				switch m.State {
				case "opened":
					s.mrOpen++
				case "merged":
					s.mrMerged++
				case "closed":
					s.mrClosed++
				}
			}
		}
	}
	return s, nil
}

// finish checks the end state, runs batcherd verify and prints the summary.
func (d *demo) finish(ctx context.Context) error {
	elapsed := time.Since(d.start)
	d.mu.Lock()
	grants, revokes := d.grants, d.revokes
	d.mu.Unlock()

	exp := harness.Expect{Settled: true}
	revokedKey := map[harness.BindingKey]bool{}
	for _, r := range revokes {
		exp.Merged = append(exp.Merged, r.id)
		k := harness.BindingKey{Repo: r.repo, Subject: r.subject, Target: r.target}
		revokedKey[k] = true
		exp.Absent = append(exp.Absent, k)
	}
	for _, g := range grants {
		exp.Merged = append(exp.Merged, g.id)
		if k := (harness.BindingKey{Repo: g.repo, Subject: g.subject, Target: g.target}); !revokedKey[k] {
			exp.Present = append(exp.Present, k)
		}
	}
	rep, err := d.c.Audit(ctx, d.api, exp)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	vout, vcode, verr := d.c.Verify(ctx)

	out := d.out
	fmt.Fprintf(out, "\n=== summary ===\n")
	fmt.Fprintf(out, "operations   %d applied (%d grants, %d revokes), %d merged, %d replayed with the same Idempotency-Key (same operation back)\n",
		len(grants)+len(revokes), len(grants), len(revokes), rep.Operations["merged"], d.replays)
	perRepo := map[string]int{}
	sizes := []int{}
	bs, _ := d.api.Batches(ctx, "", "")
	for _, b := range bs {
		perRepo[b.Repo]++
		sizes = append(sizes, b.Size)
	}
	sort.Ints(sizes)
	fmt.Fprintf(out, "batches      %d (%s %d, %s %d): %s; %s each\n", rep.Batches, repos[0], perRepo[repos[0]], repos[1], perRepo[repos[1]], counts(rep.BatchesByStatus), sizeRange(sizes))
	fmt.Fprintf(out, "MRs          %d (%s); batches with exactly one MR: %d of %d\n", rep.MRs, counts(rep.MRsByState), rep.OneMRPerBatch, rep.Batches)
	fmt.Fprintf(out, "repository   %d binding files on main: %d granted bindings present, %d revoked ones deleted\n",
		rep.Files, len(exp.Present), len(exp.Absent))
	fmt.Fprintf(out, "per replica  (claimed / MRs opened / batches settled)\n")
	d.mu.Lock()
	for _, r := range d.c.Replicas {
		w := d.work[r.ID]
		note := ""
		if r == d.killed {
			note = fmt.Sprintf("  killed with -9 at %.1fs (figures as last scraped)", d.killedAt.Seconds())
		}
		fmt.Fprintf(out, "  %-10s %3d / %3d / %3d%s\n", r.ID, w.Claimed, w.Published, w.Merged+w.Failed, note)
	}
	if d.killed != nil {
		byID := map[int64]harness.Batch{}
		for _, b := range bs {
			byID[b.ID] = b
		}
		for _, b := range d.inflight {
			now := byID[b.ID]
			fmt.Fprintf(out, "  in flight at the kill: batch %d (%s) → %s, finished by the surviving replicas\n", b.ID, b.Repo, now.Status)
		}
	}
	d.mu.Unlock()
	if n := d.api.Failovers.Load(); n > 0 {
		fmt.Fprintf(out, "API failover %d call(s) in flight to the killed replica were retried on another one (same Idempotency-Key)\n", n)
	}
	fmt.Fprintf(out, "batcherd verify: exit %d\n%s", vcode, indent(vout))
	fmt.Fprintf(out, "time         %.1fs from the first application to the last merge\n", elapsed.Seconds())

	var problems []string
	problems = append(problems, rep.Problems...)
	if verr != nil || vcode != 0 {
		problems = append(problems, fmt.Sprintf("batcherd verify exited %d (%v)", vcode, verr))
	}
	if rep.Operations["merged"] != len(grants)+len(revokes) {
		problems = append(problems, fmt.Sprintf("%d of %d operations merged", rep.Operations["merged"], len(grants)+len(revokes)))
	}
	if d.cfg.replicas >= 2 && d.killed == nil {
		problems = append(problems, "no replica was killed")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d problem(s):\n  - %s", len(problems), strings.Join(problems, "\n  - "))
	}
	fmt.Fprintf(out, "\nOK: every operation merged, one MR per batch, no MR for a failed batch, repository matches, verify clean.\n")
	return nil
}

// counts renders {"succeeded": 16, "failed": 1} as "16 succeeded, 1 failed".
func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func sizeRange(s []int) string {
	if len(s) == 0 {
		return "-"
	}
	return fmt.Sprintf("%d..%d operations", s[0], s[len(s)-1])
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}

// explainStuck prints what is still open when the demo times out.
func (d *demo) explainStuck(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	bs, err := d.api.Batches(ctx, "", "")
	if err != nil {
		fmt.Fprintf(d.out, "cannot list batches: %v\n", err)
		return
	}
	for _, b := range bs {
		if b.Status != "succeeded" {
			fmt.Fprintf(d.out, "  batch %d %s %s size %d MR %v error %v\n", b.ID, b.Repo, b.Status, b.Size, deref(b.MRIID), b.Error)
		}
	}
	fmt.Fprintf(d.out, "last log lines of each process (full logs below):\n%s", d.c.LogTail(6))
}
