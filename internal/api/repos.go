package api

import (
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/wire"
)

// withHealth fills a repository object's gitlab and drift from repo_state, which the
// scanner's replicas write (GitLab's last answer; the last drift check), so every
// replica answers alike. Both stay null while no replica has recorded them.
func withHealth(o wire.Repo, health map[string]store.RepoHealth) wire.Repo {
	h, ok := health[o.Repo]
	if !ok {
		return o
	}
	if h.GitLabState != "" && h.GitLabChangedAt != nil {
		state := h.GitLabState
		o.GitLab = &state
	}
	if h.DriftCheckedAt != nil && h.DriftUnexpected != nil && h.DriftMissing != nil && h.DriftModified != nil {
		o.Drift = &wire.Drift{Unexpected: *h.DriftUnexpected, Missing: *h.DriftMissing, Modified: *h.DriftModified, CheckedAt: ts(*h.DriftCheckedAt)}
	}
	return o
}
