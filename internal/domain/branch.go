package domain

import (
	"strconv"
	"strings"
	"time"
)

// Git trailers every batch commit carries (README, "Installation
// identity"). An MR found by its branch name is a batch's only when its commits carry
// both, with this installation's id and the batch's id.
const (
	TrailerInstallation = "Batcherd-Installation"
	TrailerBatch        = "Batcherd-Batch"
	// TrailerBatchClaimed is the batch's claim time (BatchStamp): batch ids are unique
	// in one database but a restore from an older backup issues them again, and the
	// MRs GitLab keeps from after the backup carry the same installation and id. The
	// claim time of the re-issued batch differs, so its MR search never adopts them.
	TrailerBatchClaimed = "Batcherd-Batch-Claimed"
)

// BatchStamp is the value of TrailerBatchClaimed for a batch claimed at claimed (the
// batch row's created_at, read in UTC to the microsecond): a per-batch nonce that needs
// no column of its own.
func BatchStamp(claimed time.Time) string {
	if claimed.IsZero() {
		return ""
	}
	return claimed.UTC().Format("2006-01-02T15:04:05.000000Z")
}

// branchRoot is the prefix of every batch branch.
const branchRoot = "batcherd/"

// BranchName is the deterministic source branch of a batch of one installation:
// batcherd/<installation>/batch-<id>. Every publish step is idempotent by it, and settle
// failure finds the batch's MR through it even when none is recorded yet. Batch ids
// start at 1 in every database, so the installation id is what keeps two databases
// pointed at one GitLab project (a staging install, a re-created database) from
// naming — and adopting — each other's branches.
func BranchName(installation string, batchID int64) string {
	return branchRoot + installation + "/batch-" + strconv.FormatInt(batchID, 10)
}

// LegacyBranchName is the branch of a batch claimed before installations had ids
// (batcherd/batch-<id>). Only batch rows that recorded it use it.
func LegacyBranchName(batchID int64) string {
	return branchRoot + "batch-" + strconv.FormatInt(batchID, 10)
}

// ParseBranch reads a batch branch: the installation ("" for a legacy branch) and the
// batch id, only when the branch is exactly what BranchName (or LegacyBranchName)
// makes for them — no leading zeros, no suffix, a valid installation id.
func ParseBranch(branch string) (installation string, batchID int64, ok bool) {
	rest, found := strings.CutPrefix(branch, branchRoot)
	if !found {
		return "", 0, false
	}
	inst, idPart, nested := strings.Cut(rest, "/")
	if !nested {
		idPart, inst = rest, ""
	} else if !ValidInstallationID(inst) {
		return "", 0, false
	}
	digits, found := strings.CutPrefix(idPart, "batch-")
	if !found {
		return "", 0, false
	}
	id, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != digits {
		return "", 0, false
	}
	return inst, id, true
}

// BatchIDFromBranch returns the batch id of a branch of this installation
// (batcherd/<installation>/batch-<id>); another installation's branch, a legacy one or
// any other name is not ours.
func BatchIDFromBranch(installation, branch string) (int64, bool) {
	inst, id, ok := ParseBranch(branch)
	if !ok || inst == "" || inst != installation {
		return 0, false
	}
	return id, true
}

// ValidInstallationID reports whether s is an installation id: 8 to 12 lower-case
// ASCII letters and digits (it is part of branch names and trailers).
func ValidInstallationID(s string) bool {
	if len(s) < 8 || len(s) > 12 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}
