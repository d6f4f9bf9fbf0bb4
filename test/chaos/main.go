// Command chaos is `make chaos`: batcherd as production runs it — several `batcherd
// serve` replicas as separate processes, one MariaDB, a GitLab — while everything
// that can fail does, and then a check that nothing was lost or doubled.
//
// It starts a PRIVATE mariadbd (own data directory, port and socket under a
// temporary directory, so restarting it disturbs nobody else's tests on the machine),
// the GitLab simulator and N replicas (internal/harness), then for -duration:
//
//   - a stream of grant/revoke applications over 3 repositories through the HTTP API,
//     each approved (a few rejected), with exact retries carrying the same
//     Idempotency-Key and concurrent duplicates, retried on every unknown outcome;
//     an operator retries some failed operations;
//   - kill -9 of a random replica every few seconds (sometimes a graceful SIGTERM),
//     restarted shortly after, or a SIGSTOP freeze beyond the publish lease;
//   - KILL (connection or query) of random batcherd MySQL connections, found in
//     information_schema.processlist (the run's own connections use another user);
//   - one restart of mariadbd in the middle (SIGTERM, start again on the same data
//     directory and port);
//   - GitLab faults: 5xx, 429 with Retry-After, latency (some beyond the client
//     timeout), "work done, answer dropped", connection dropped before the work,
//     random pipeline failures;
//   - a "human" who merges or closes batch MRs behind batcherd's back, fails
//     pipelines and retries failed ones.
//
// Then the chaos stops, every replica runs again, the replicas drain (bounded by
// -drain), and it checks: every accepted operation is merged, or failed with a reason;
// none is lost, none stuck; no operation exists that no answer named (a retry that
// created a second one); every answer for one Idempotency-Key named the same
// operation; never two open MRs for one batch branch, none open at the end, one MR
// per batch; the files on every default branch are exactly the active bindings; and
// `batcherd verify` (the real binary) exits 0. It prints a summary and exits 1 on any
// violation (2 on a setup failure, 130 when interrupted).
//
// Usage (make chaos builds ./bin first and passes -bin bin):
//
//	chaos [-bin DIR] [-duration 3m] [-drain 3m] [-replicas 4] [-rate 8] [-seed N] [-keep] [-v]
//
// BATCHERD_CHAOS_DURATION sets the default of -duration.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

func main() {
	cfg := defaultConfig()
	if v := os.Getenv("BATCHERD_CHAOS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: BATCHERD_CHAOS_DURATION: %v\n", err)
			os.Exit(2)
		}
		cfg.Duration = d
	}
	flag.StringVar(&cfg.Bin, "bin", "", "directory with prebuilt batcherd and gitlab-sim (default: build them)")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "how long the chaos lasts (env BATCHERD_CHAOS_DURATION)")
	flag.DurationVar(&cfg.Drain, "drain", cfg.Drain, "bound on the wait for the replicas to drain after the chaos")
	flag.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "batcherd serve processes (3 to 5)")
	flag.Float64Var(&cfg.Rate, "rate", cfg.Rate, "applications per second, over every submitter")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent submitters")
	flag.Int64Var(&cfg.Seed, "seed", 0, "random seed (default: from the clock; printed)")
	flag.DurationVar(&cfg.KillEvery, "kill-every", cfg.KillEvery, "mean time between two replica kills")
	flag.DurationVar(&cfg.FreezeMax, "freeze-max", cfg.FreezeMax, "longest SIGSTOP freeze of a replica (0: none)")
	flag.DurationVar(&cfg.ConnKillEvery, "conn-kill-every", cfg.ConnKillEvery, "mean time between two MySQL connection kills")
	flag.DurationVar(&cfg.FaultEvery, "fault-every", cfg.FaultEvery, "mean time between two GitLab faults")
	flag.DurationVar(&cfg.HumanEvery, "human-every", cfg.HumanEvery, "mean time between two human actions on MRs")
	flag.Float64Var(&cfg.PipelineFailureRate, "pipeline-failure-rate", cfg.PipelineFailureRate, "probability that a pipeline fails by itself")
	flag.DurationVar(&cfg.BatchTimeout, "batch-timeout", cfg.BatchTimeout, "BATCHERD_BATCH_TIMEOUT of the replicas")
	flag.BoolVar(&cfg.NoDBRestart, "no-db-restart", false, "do not restart MariaDB")
	flag.IntVar(&cfg.DBRestarts, "db-restarts", 1, "how many times MariaDB is restarted, spread over the chaos")
	flag.BoolVar(&cfg.DBCrash, "db-crash", false, "restart MariaDB with kill -9 (crash recovery) instead of SIGTERM")
	flag.StringVar(&cfg.HA, "ha", "", "run on a three-node Galera cluster: single (HAProxy, one writer) or multi (each replica writes through another node); kills the writer node instead of the usual chaos")
	flag.IntVar(&cfg.HASyncWait, "ha-sync-wait", -1, "HA runs: wsrep_sync_wait written into batcherd's DSN (-1: none, and batcherd sets 1 itself on Galera; 0 turns it off)")
	flag.BoolVar(&cfg.HAPartition, "ha-partition", false, "HA runs: after the kills, isolate the writer (the other nodes SIGSTOPped) until it leaves the primary component, ask the store there, then let the others go on")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the logs and the private MariaDB's directory")
	flag.BoolVar(&cfg.Verbose, "v", false, "print every chaos event")
	flag.Parse()
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %v\n", err)
		os.Exit(2)
	}

	// The first Ctrl-C stops what was started, in order; a second kills it all at once.
	ctx, stop := harness.InterruptContext()
	defer stop()
	sum, err := Run(ctx, cfg, os.Stdout)
	switch {
	case ctx.Err() != nil:
		fmt.Println("\ninterrupted; everything the chaos run started is stopped and removed")
		os.Exit(130)
	case err != nil:
		fmt.Printf("\nCHAOS RUN FAILED TO RUN: %v\n", err)
		os.Exit(2)
	case len(sum.Violations) > 0:
		fmt.Printf("\nCHAOS FAILED: %d violation(s)\n", len(sum.Violations))
		os.Exit(1)
	}
	fmt.Println("\nOK: nothing lost, nothing doubled, repository matches the bindings, verify clean.")
}
