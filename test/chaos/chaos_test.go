package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

// ciConfig is the short variant `go test ./...` (and so .ci/run) runs: every kind of
// chaos of the full run, over 30 seconds, with a lighter load and three replicas, so
// that it passes on a loaded 2-core machine.
func ciConfig() Config {
	c := defaultConfig()
	c.Duration = 30 * time.Second
	c.Drain = 150 * time.Second // a bound, not a wait: typically 20–40s
	c.Replicas = 3
	c.Workers = 3
	c.Rate = 3
	c.KillEvery = 4 * time.Second
	c.FreezeMax = 8 * time.Second
	c.ConnKillEvery = 1500 * time.Millisecond
	c.FaultEvery = 2 * time.Second
	c.HumanEvery = 4 * time.Second
	c.OperatorEvery = 4 * time.Second
	c.PipelineFailureRate = 0.05
	return c
}

// TestChaosShort is the short chaos run: real processes (a private mariadbd restarted
// once, gitlab-sim, three `batcherd serve` replicas killed and restarted), faults
// everywhere, then every end check of `make chaos`. BATCHERD_CHAOS_SEED reproduces a
// run's random choices (timing still differs).
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: starts a private MariaDB and real processes (skipped under -short)")
	}
	cfg := ciConfig()
	if s := os.Getenv("BATCHERD_CHAOS_SEED"); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("BATCHERD_CHAOS_SEED: %v", err)
		}
		cfg.Seed = seed
	}
	cfg.Logf = t.Logf
	ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
	defer cancel()
	// The replicas are normal builds even when this test runs under -race: the race
	// detector slows them several times over, and what is tested here is the protocol
	// between processes, not their memory.
	bins, err := harness.Build(ctx, t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Bin = bins.Dir
	var out strings.Builder
	start := time.Now()
	sum, err := Run(ctx, cfg, &out)
	t.Logf("chaos run output (%s):\n%s", time.Since(start).Round(100*time.Millisecond), out.String())
	if err != nil {
		t.Fatalf("chaos run: %v", err)
	}
	if len(sum.Violations) > 0 {
		t.Fatalf("%d violation(s):\n  %s", len(sum.Violations), strings.Join(sum.Violations, "\n  "))
	}
}
