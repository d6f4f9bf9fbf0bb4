// Command benchrun runs every measurement of package bench side by side and writes
// BENCHMARKS.md: the machine, the method, every figure with its ratio to the ceiling
// or the alternative it is compared with, and which targets of issue 20 (the second
// performance pass; issue 8 was the first) were met, with the reason for each miss.
//
//	go run ./bench/cmd/benchrun -out BENCHMARKS.md -bin bin
//
// `make bench` runs it after building the binaries the end-to-end run starts. It talks
// only to the database server of BATCHERD_TEST_DSN and to loopback ports.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/batcherd/batcherd/bench"
	"github.com/batcherd/batcherd/internal/harness"
	"github.com/batcherd/batcherd/internal/store"
)

type config struct {
	out, bin              string
	dur                   time.Duration
	reps                  int
	clients               []int
	latDur                time.Duration
	latPreload            int
	claimSizes            []int
	contDur               time.Duration
	e2eOps, baselineOps   int
	e2eTimeout            time.Duration
	skip                  map[string]bool
	profileDur            time.Duration
	settleSizes           []int
	claimReps, batchReps  int
	claimBatchWaiting     int
	contentionAdmitPerSec int
	anatomyOps            int
}

func main() {
	var c config
	var skip, sizes string
	quick := flag.Bool("quick", false, "short run for trying the driver (figures are not the reference ones)")
	flag.StringVar(&c.out, "out", "BENCHMARKS.md", "report to write")
	flag.StringVar(&c.bin, "bin", "bin", "directory with prebuilt batcherd and gitlab-sim (built by the harness when missing)")
	flag.DurationVar(&c.dur, "dur", 2*time.Second, "duration of one throughput measurement")
	flag.IntVar(&c.reps, "reps", 5, "repetitions of each throughput measurement (interleaved; medians reported)")
	flag.DurationVar(&c.latDur, "lat-dur", 5*time.Second, "duration of one admission-latency measurement")
	flag.StringVar(&sizes, "claim-sizes", "1000,10000,100000,1000000", "waiting-set sizes for the claim cost")
	flag.DurationVar(&c.contDur, "contention-dur", 30*time.Second, "duration of the contention run")
	flag.IntVar(&c.e2eOps, "e2e-ops", 10000, "operations of the end-to-end run")
	flag.IntVar(&c.baselineOps, "baseline-ops", 40, "operations of the one-MR-per-operation baseline (extrapolated to -e2e-ops)")
	flag.DurationVar(&c.e2eTimeout, "e2e-timeout", 4*time.Minute, "give up waiting for merges after this")
	flag.StringVar(&skip, "skip", "", "comma-separated sections to skip: rows,throughput,anatomy,profile,latency,claim,settle,contention,e2e")
	flag.Parse()
	c.clients = []int{1, 8, 32}
	c.latPreload = 60000
	c.profileDur = 5 * time.Second
	c.settleSizes = []int{1000, 5000}
	c.claimReps, c.batchReps, c.claimBatchWaiting = 5, 3, 100000
	c.contentionAdmitPerSec = 200
	c.anatomyOps = 1500
	for _, s := range strings.Split(sizes, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err == nil && n > 0 {
			c.claimSizes = append(c.claimSizes, n)
		}
	}
	c.skip = map[string]bool{}
	for _, s := range strings.Split(skip, ",") {
		if s = strings.TrimSpace(s); s != "" {
			c.skip[s] = true
		}
	}
	if *quick {
		c.dur, c.reps, c.latDur, c.latPreload = time.Second, 1, 2*time.Second, 20000
		c.claimSizes = []int{1000, 10000, 100000}
		c.contDur, c.e2eOps, c.baselineOps, c.profileDur = 5*time.Second, 1000, 8, 2*time.Second
		c.claimReps, c.batchReps, c.claimBatchWaiting = 2, 2, 10000
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	bench.DropStale(ctx)
	r := &report{cfg: c, started: start}
	if err := run(ctx, r); err != nil {
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		os.Exit(1)
	}
	r.total = time.Since(start)
	r.endLoad, r.endPressure = bench.MachineLoad()
	if err := os.WriteFile(c.out, []byte(r.markdown()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		os.Exit(1)
	}
	logf("wrote %s in %s", c.out, r.total.Round(time.Second))
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

// section runs one part, timing it; a failure is recorded in the report, not fatal.
func (r *report) section(ctx context.Context, name string, fn func() error) {
	if r.cfg.skip[name] || ctx.Err() != nil {
		r.skipped = append(r.skipped, name)
		return
	}
	logf("%s …", name)
	t0 := time.Now()
	err := fn()
	r.took = append(r.took, fmt.Sprintf("%s %s", name, time.Since(t0).Round(time.Second)))
	if err != nil {
		logf("%s failed: %v", name, err)
		r.failures = append(r.failures, fmt.Sprintf("%s: %v", name, err))
	}
}

func run(ctx context.Context, r *report) error {
	d, err := bench.NewDB(ctx, "machine")
	if err != nil {
		return err
	}
	raw, err := d.Raw(1)
	if err != nil {
		d.Close()
		return err
	}
	r.machine = bench.DescribeMachine(ctx, raw)
	bench.MeasureServerCPU(ctx, raw)
	raw.Close()
	d.Close()
	logf("machine: %d CPUs, %s, %s, load %s", r.machine.CPUs, r.machine.MemTotal, r.machine.Server, r.machine.LoadAvg)

	r.section(ctx, "rows", func() error { return admissionRows(ctx, r) })
	r.section(ctx, "throughput", func() error { return throughput(ctx, r) })
	r.section(ctx, "anatomy", func() error { return anatomy(ctx, r) })
	r.section(ctx, "profile", func() error { return profile(ctx, r) })
	r.section(ctx, "latency", func() error { return latency(ctx, r) })
	r.section(ctx, "claim", func() error { return claims(ctx, r) })
	r.section(ctx, "settle", func() error { return settlement(ctx, r) })
	r.section(ctx, "contention", func() error { return contention(ctx, r) })
	r.section(ctx, "e2e", func() error { return endToEnd(ctx, r) })
	return nil
}

// --- 1. admission throughput ---

var variants = []string{"raw-go", "raw-slap", "store-serial", "store-single", "store-grouped", "api-serial", "api-grouped", "api-wrk"}

// withStore runs fn on a fresh database and a store on it as a replica runs it: a pool
// of 20 (the BATCHERD_MYSQL_MAX_CONNS default). Both are closed (and the database
// dropped) afterwards.
func withStore(ctx context.Context, what string, fn func(d *bench.DB, st *store.Store) error) error {
	d, err := bench.NewDB(ctx, what)
	if err != nil {
		return err
	}
	defer d.Close()
	st, err := d.Open(ctx, 20)
	if err != nil {
		return err
	}
	defer st.Close()
	return fn(d, st)
}

func throughput(ctx context.Context, r *report) error {
	return withStore(ctx, "throughput", func(d *bench.DB, st *store.Store) error { return throughputOn(ctx, r, d, st) })
}

func throughputOn(ctx context.Context, r *report, d *bench.DB, st *store.Store) error {
	slap, wrk := bench.SlapAvailable(), bench.WrkAvailable()
	if !wrk {
		logf("  wrk is not installed (apt-get install wrk): the API is measured with the in-process Go client only")
	}
	r.tp = map[int]map[string][]bench.Result{}
	for _, c := range r.cfg.clients {
		r.tp[c] = map[string][]bench.Result{}
		for rep := 0; rep < r.cfg.reps; rep++ {
			// Rotate the order each repetition, so no variant always runs first.
			order := slices.Clone(variants)
			k := rep % len(order)
			order = append(order[k:], order[:k]...)
			var rawRate float64
			for _, v := range order {
				if (v == "raw-slap" && !slap) || (v == "api-wrk" && !wrk) {
					continue
				}
				// Every run starts from empty tables (bench.DB.Reset says why).
				if err := d.Reset(ctx); err != nil {
					return err
				}
				var res bench.Result
				var err error
				switch v {
				case "raw-go":
					res, err = bench.RawInsert(ctx, d, c, r.cfg.dur)
					rawRate = res.Rate()
				case "raw-slap":
					est := rawRate
					if est == 0 {
						est = 2000 * float64(min(c, 4))
					}
					total := max(500, int(est*r.cfg.dur.Seconds()))
					total -= total % c
					res, err = bench.Slap(ctx, d, c, total)
				case "store-serial":
					res = bench.StoreAdmission(ctx, st, bench.AdmitSerial, c, r.cfg.dur)
				case "store-single":
					res = bench.StoreAdmission(ctx, st, bench.AdmitSingle, c, r.cfg.dur)
				case "store-grouped":
					res = bench.StoreAdmission(ctx, st, bench.AdmitGrouped, c, r.cfg.dur)
				case "api-serial":
					res, err = bench.APIAdmission(ctx, st, bench.AdmitSerial, c, r.cfg.dur)
				case "api-grouped":
					res, err = bench.APIAdmission(ctx, st, bench.AdmitGrouped, c, r.cfg.dur)
				case "api-wrk":
					res, err = bench.APIAdmissionWrk(ctx, st, c, r.cfg.dur)
				}
				if err != nil {
					return fmt.Errorf("%s at %d clients: %w", v, c, err)
				}
				r.tp[c][v] = append(r.tp[c][v], res)
				logf("  %-14s c=%-2d %7.0f/s p50 %s ms p99 %s ms %s", v, c, res.Rate(), bench.Ms(res.Lat.P50), bench.Ms(res.Lat.P99), res.Note)
			}
		}
	}
	st.SetAdmitOptions(store.AdmitOptions{})
	r.admitStats = st.AdmitStats()
	return nil
}

// --- 1c. rows per admission ---

func admissionRows(ctx context.Context, r *report) error {
	return withStore(ctx, "rows", func(d *bench.DB, st *store.Store) error {
		rows, err := bench.AdmissionRows(ctx, d, st)
		for _, c := range rows {
			logf("  %-50s %d rows (%s)", c.Name, c.Rows, c.Tables())
		}
		r.rows = rows
		return err
	})
}

// --- 1b. anatomy of one admission ---

func anatomy(ctx context.Context, r *report) error {
	return withStore(ctx, "anatomy", func(d *bench.DB, st *store.Store) error {
		steps, err := bench.AdmissionAnatomy(ctx, d, st, r.cfg.anatomyOps, 3)
		for _, s := range steps {
			logf("  %-90s %s µs", s.Name, usf(float64(s.PerOp)))
		}
		r.anatomy = steps
		return err
	})
}

// --- 7. profile ---

func profile(ctx context.Context, r *report) error {
	return withStore(ctx, "profile", func(_ *bench.DB, st *store.Store) error { return profileOn(ctx, r, st) })
}

func profileOn(ctx context.Context, r *report, st *store.Store) error {
	for _, m := range []bench.AdmitMode{bench.AdmitSerial, bench.AdmitGrouped} {
		f, err := os.CreateTemp("", "batcherd-admission-*.pprof")
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return err
		}
		res := bench.StoreAdmission(ctx, st, m, 32, r.cfg.profileDur)
		pprof.StopCPUProfile()
		f.Close()
		top, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount=14", f.Name()).Output()
		os.Remove(f.Name())
		if err != nil {
			return fmt.Errorf("go tool pprof: %w", err)
		}
		r.profiles = append(r.profiles, profileOut{mode: m, res: res, top: trimPprof(string(top))})
	}
	return nil
}

func trimPprof(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") ||
			strings.HasPrefix(l, "Time:") || strings.TrimSpace(l) == "" {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// --- 2. admission latency while claiming ---

func latency(ctx context.Context, r *report) error {
	rig, err := bench.NewLatencyRig(ctx, r.cfg.latPreload)
	if err != nil {
		return err
	}
	defer rig.Close()
	r.lat = map[bool]map[bench.ClaimVariant][]bench.LatencyResult{false: {}, true: {}}
	for rep := 0; rep < 2; rep++ {
		for _, drain := range []bool{false, true} {
			for _, v := range []bench.ClaimVariant{bench.NoClaims, bench.StoreClaims, bench.ForUpdateRRClaims} {
				res, err := rig.Run(ctx, v, drain, 4, r.cfg.latDur)
				if err != nil {
					return fmt.Errorf("%s: %w", v, err)
				}
				r.lat[drain][v] = append(r.lat[drain][v], res)
				logf("  drain=%v %-50s adm p50 %s p99 %s ms, %d claims (p50 %s ms) in %s", drain, v,
					bench.Ms(res.Admissions.P50), bench.Ms(res.Admissions.P99), res.Claims, bench.Ms(res.ClaimTime.P50), res.Elapsed.Round(time.Millisecond))
			}
		}
	}
	return nil
}

// --- 3. claim cost ---

func claims(ctx context.Context, r *report) error {
	rig, err := bench.NewClaimRig(ctx, 5000)
	if err != nil {
		return err
	}
	defer rig.Close()
	for _, n := range r.cfg.claimSizes {
		took, err := rig.Grow(ctx, n)
		if err != nil {
			return err
		}
		r.loads = append(r.loads, fmt.Sprintf("%d rows in %s", n, took.Round(time.Millisecond)))
		s, err := rig.Sample(ctx, 1000, r.cfg.claimReps)
		if err != nil {
			return err
		}
		r.claimBySize = append(r.claimBySize, s)
		logf("  claim 1000 of %d: median %s ms max %s ms, %s", n, bench.Ms(s.Median), bench.Ms(s.Max), s.Statements)
		if n == r.cfg.claimBatchWaiting {
			for _, b := range []int{100, 1000, 5000} {
				s, err := rig.Sample(ctx, b, r.cfg.batchReps)
				if err != nil {
					return err
				}
				r.claimByBatch = append(r.claimByBatch, s)
				logf("  claim %d of %d: median %s ms, %s", b, n, bench.Ms(s.Median), s.Statements)
			}
		}
	}
	return nil
}

// --- 4. settlement ---

func settlement(ctx context.Context, r *report) error {
	d, err := bench.NewDB(ctx, "settle")
	if err != nil {
		return err
	}
	defer d.Close()
	for _, n := range r.cfg.settleSizes {
		for _, ok := range []bool{true, false} {
			s, err := bench.Settlement(ctx, d, n, ok)
			if err != nil {
				return err
			}
			r.settles = append(r.settles, s)
			logf("  settle %d success=%v: %s ms, %s", n, ok, bench.Ms(s.Time), s.Statements)
		}
	}
	return nil
}

// --- 5. contention ---

func contention(ctx context.Context, r *report) error {
	res, err := bench.Contention(ctx, 8, 20, r.cfg.contDur, r.cfg.contentionAdmitPerSec, 250*time.Millisecond)
	if err != nil {
		return err
	}
	r.cont = &res
	logf("  %d rounds, %v, errors %d, losers p99 %s ms, bare round trip p99 %s ms", res.Rounds, res.Outcomes, res.Errors,
		bench.Ms(res.Losers.P99), bench.Ms(res.RoundTrip.P99))
	return nil
}

// --- 6. end to end ---

func endToEnd(ctx context.Context, r *report) error {
	bin, err := harness.Prebuilt(r.cfg.bin)
	if err != nil {
		logf("  %v: building", err)
		dir, derr := os.MkdirTemp("", "benchrun-bin-")
		if derr != nil {
			return derr
		}
		defer os.RemoveAll(dir)
		if bin, err = harness.Build(ctx, dir, false); err != nil {
			return err
		}
	}
	base := bench.E2EConfig{Repos: 4, Replicas: 3, CallDelay: 20 * time.Millisecond, Pipeline: 2 * time.Second,
		Clients: 32, Timeout: r.cfg.e2eTimeout, Binaries: bin}
	batched := base
	batched.Ops, batched.MaxBatch = r.cfg.e2eOps, 500
	res, err := bench.EndToEnd(ctx, batched)
	if err != nil {
		return err
	}
	r.e2e = &res
	logf("  batched: %d ops merged in %s, %d MRs, %.2f calls/op", res.Merged, res.MergedTime.Round(time.Millisecond), res.MRs, res.CallsPerOp())
	one := base
	one.Ops, one.MaxBatch, one.Clients = r.cfg.baselineOps, 1, 4
	bl, err := bench.EndToEnd(ctx, one)
	if err != nil {
		return err
	}
	r.baseline = &bl
	logf("  one MR per operation: %d ops merged in %s, %d MRs, %.2f calls/op", bl.Merged, bl.MergedTime.Round(time.Millisecond), bl.MRs, bl.CallsPerOp())
	return nil
}
