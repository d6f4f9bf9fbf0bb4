package domain

import "testing"

func TestParseBranchInvertsBranchName(t *testing.T) {
	const inst = "abc123xyz0"
	type want struct {
		inst string
		id   int64
		ok   bool
	}
	for branch, w := range map[string]want{
		BranchName(inst, 12):            {inst, 12, true},
		LegacyBranchName(12):            {"", 12, true},
		"batcherd/abc123xyz0/batch-012": {},
		"batcherd/abc123xyz0/batch-0":   {},
		"batcherd/abc123xyz0/batch-1/x": {},
		"batcherd/ABC123XYZ0/batch-1":   {}, // not an installation id
		"batcherd/short/batch-1":        {},
		"batcherd/batch-012":            {},
		"batcherd/batch-x":              {},
		"batcherd/batch-":               {},
		"batcherd/batch-12/x":           {},
		"feature/x":                     {},
	} {
		gi, gid, ok := ParseBranch(branch)
		if gi != w.inst || gid != w.id || ok != w.ok {
			t.Errorf("ParseBranch(%q) = %q %d %v, want %q %d %v", branch, gi, gid, ok, w.inst, w.id, w.ok)
		}
	}
	if id, ok := BatchIDFromBranch(inst, BranchName(inst, 7)); !ok || id != 7 {
		t.Errorf("own branch not recognised: %d %v", id, ok)
	}
	for _, other := range []string{BranchName("zzzzzzzz", 7), LegacyBranchName(7)} {
		if _, ok := BatchIDFromBranch(inst, other); ok {
			t.Errorf("BatchIDFromBranch took %q as this installation's", other)
		}
	}
}

func TestValidInstallationID(t *testing.T) {
	for s, want := range map[string]bool{"abcdefgh": true, "abcdefgh1234": true, "abcdefg": false, "abcdefgh12345": false, "abcdEfgh": false, "abcd-fgh": false} {
		if ValidInstallationID(s) != want {
			t.Errorf("ValidInstallationID(%q) != %v", s, want)
		}
	}
}
