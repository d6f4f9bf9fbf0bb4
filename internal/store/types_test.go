package store

import "testing"

func TestBatchIDFromBranchInvertsBranchName(t *testing.T) {
	for branch, want := range map[string]int64{
		BranchName(12): 12, "batcherd/batch-012": 0, "batcherd/batch-x": 0, "feature/x": 0,
		"batcherd/batch-": 0, "batcherd/batch-0": 0, "batcherd/batch-12/x": 0,
	} {
		got, ok := BatchIDFromBranch(branch)
		if got != want || ok != (want != 0) {
			t.Errorf("BatchIDFromBranch(%q) = %d %v, want %d", branch, got, ok, want)
		}
	}
}
