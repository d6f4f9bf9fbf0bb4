package bench

import (
	"context"
	"testing"
)

func TestLowerBound(t *testing.T) {
	for _, c := range []struct{ n, k, want int }{
		{64, 1, 7},  // log2 64 = 6
		{64, 2, 12}, // log2 2016 = 10.98
		{64, 4, 21}, // log2 635376 = 19.28
		{8, 8, 1},   // one possible set: only the first run
	} {
		if got := LowerBound(c.n, c.k); got != c.want {
			t.Errorf("LowerBound(%d, %d) = %d, want %d", c.n, c.k, got, c.want)
		}
	}
}

// TestRunIsolationSmall is a short slice of the isolation measurement: 16 operations,
// one culprit, the real scanner against the simulator. The culprit is named, every
// other operation merged, and the runs are the policy's: the batch, one run per level
// of log₂ 16 = 4 (a passing part merges and the next part is already the split of the
// rest), the lone culprit's in-place flake retry, and one or both of: the culprit's
// own run (when the search ended on a single member inferred to be bad), the
// remainder's run (when a part failed on the way) — 7 or 8, where running both halves
// of every level took 10.
func TestRunIsolationSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	r, err := RunIsolation(context.Background(), IsolationCase{N: 16, K: 1, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", r)
	if r.CulpritsNamed != 1 || r.Merged != 15 || r.InnocentsFailed != 0 || r.CulpritsMerged != 0 {
		t.Fatalf("outcome %+v", r)
	}
	if r.Runs < 7 || r.Runs > 8 || r.Runs != r.Batches+r.FlakeRetries || r.FlakeRetries != 1 {
		t.Fatalf("runs %d, batches %d, flake retries %d", r.Runs, r.Batches, r.FlakeRetries)
	}
}
