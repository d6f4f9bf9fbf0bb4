package mr

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// GitLab's answers differ by version, and the merge request's state has more to it than
// opened/merged/closed: mergeability is computed in the background, fast-forward and
// semi-linear projects need a rebase, and a failed pipeline can be retried in place.
// This file holds the calls for those (README, GitLab states).

// ServerVersion is what GET /version said ("17.11.4-ee" → 17, 11), zero when unknown.
type ServerVersion struct {
	Major, Minor int
	Raw          string
}

// Known reports whether the version was read.
func (v ServerVersion) Known() bool { return v.Major > 0 }

// AtLeast reports whether the version is major.minor or later.
func (v ServerVersion) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// KnowsAutoMerge: the merge endpoint takes auto_merge (GitLab 17.11 and later). Older
// versions drop it as an unknown parameter, so a call with only auto_merge is a plain
// merge there (405 while the pipeline runs).
func (v ServerVersion) KnowsAutoMerge() bool { return v.AtLeast(17, 11) }

func parseServerVersion(raw string) ServerVersion {
	parts := strings.SplitN(raw, ".", 3)
	if len(parts) < 2 {
		return ServerVersion{Raw: raw}
	}
	maj, err1 := strconv.Atoi(parts[0])
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	mn, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil {
		return ServerVersion{Raw: raw}
	}
	return ServerVersion{Major: maj, Minor: mn, Raw: raw}
}

// versionCache holds the server's version once read. GitLab is not upgraded under a
// running replica often enough to re-read it; a restart reads it again.
type versionCache struct {
	mu  sync.Mutex
	ver ServerVersion
}

// ServerVersion reads GET /version once and remembers it. An error (GitLab down, a
// token without read access to it) is returned and not remembered, so the next call
// tries again.
func (c *Client) ServerVersion(ctx context.Context) (ServerVersion, error) {
	c.version.mu.Lock()
	defer c.version.mu.Unlock()
	if c.version.ver.Known() {
		return c.version.ver, nil
	}
	var out struct {
		Version string `json:"version"`
	}
	if err := c.raw(ctx, "get_version", http.MethodGet, "version", nil, &out); err != nil {
		return ServerVersion{}, err
	}
	v := parseServerVersion(out.Version)
	if v.Known() {
		c.version.ver = v
	}
	return v, nil
}

// autoMergeOptions is the merge call that arms auto-merge, in the words the server's
// version understands: auto_merge from 17.11 (where merge_when_pipeline_succeeds is its
// deprecated alias), merge_when_pipeline_succeeds before. When the version cannot be
// read, both: each version takes the one it knows and drops the other.
func (c *Client) autoMergeOptions(ctx context.Context, sha string) *gitlab.AcceptMergeRequestOptions {
	opt := &gitlab.AcceptMergeRequestOptions{SHA: &sha}
	v, err := c.ServerVersion(ctx)
	switch {
	case err != nil || !v.Known():
		opt.AutoMerge, opt.MergeWhenPipelineSucceeds = gitlab.Ptr(true), gitlab.Ptr(true)
	case v.KnowsAutoMerge():
		opt.AutoMerge = gitlab.Ptr(true)
	default:
		opt.MergeWhenPipelineSucceeds = gitlab.Ptr(true)
	}
	return opt
}

// Rebase asks GitLab to rebase the MR's source branch onto its target (fast-forward
// and semi-linear projects: detailed_merge_status need_rebase). GitLab answers 202 and
// rebases in the background: the MR shows RebaseInProgress, then a new SHA, or
// MergeError when the rebase failed (a conflict). A rebase already running is fine.
func (c *Client) Rebase(ctx context.Context, project string, iid int64) error {
	err := c.raw(ctx, "rebase", http.MethodPut, mrPath(project, iid)+"/rebase", nil, nil)
	if isStatus(err, http.StatusConflict) && messageContains(err, "in progress") {
		return nil
	}
	return err
}

// CommitInfo is a commit of an MR as the layer reads it.
type CommitInfo struct {
	ID       string
	Trailers map[string]string
	carries  commitTrailers
}

// Carries reports whether the commit carries owner's trailers (this installation's
// Batcherd-Installation and the batch's Batcherd-Batch), read as FindMR reads them.
func (c CommitInfo) Carries(owner Owner) bool { return c.carries.carries(owner) }

// OwnerOf is the owner of a batch branch: the installation its name carries (none for
// a legacy branch) and the batch.
func OwnerOf(branch string, batch BatchRef) Owner { return ownerOf(branch, batch) }

// MRCommits lists the MR's own commits (those not on its target), newest first.
func (c *Client) MRCommits(ctx context.Context, project string, iid int64) ([]CommitInfo, error) {
	var out []CommitInfo
	var next gitlab.RequestOptionFunc
	opt := &gitlab.ListOptions{PerPage: 100}
	for page := 0; page < 100; page++ {
		var cs []glCommit
		resp, err := c.rawResp(ctx, "list_mr_commits", http.MethodGet, mrPath(project, iid)+"/commits", opt, &cs, next)
		if err != nil {
			return nil, err
		}
		for i := range cs {
			out = append(out, CommitInfo{ID: cs[i].ID, Trailers: cs[i].Trailers, carries: readTrailers(&cs[i])})
		}
		n, ok := gitlab.WithNext(resp)
		if !ok {
			return out, nil
		}
		next = n
	}
	return nil, &Error{Op: "list_mr_commits", Class: ClassPermanent, Message: "more than 100 pages of commits"}
}

// RetryPipeline runs a pipeline's failed and canceled jobs again, in the same pipeline
// (same sha, same MR). It answers with the pipeline's new status.
func (c *Client) RetryPipeline(ctx context.Context, project string, pipelineID int64) (string, error) {
	var pl glPipeline
	err := c.raw(ctx, "retry_pipeline", http.MethodPost, projectPath(project, "pipelines", strconv.FormatInt(pipelineID, 10), "retry"), nil, &pl)
	return pl.Status, err
}

// PipelineRetries is how many times the pipeline's jobs were retried: the most runs of
// any one job, less one (GitLab lists a retried job's earlier runs only with
// include_retried). Zero for a pipeline never retried.
func (c *Client) PipelineRetries(ctx context.Context, project string, pipelineID int64) (int, error) {
	opt := &gitlab.ListJobsOptions{ListOptions: gitlab.ListOptions{PerPage: 100}, IncludeRetried: gitlab.Ptr(true)}
	var jobs []struct {
		Name string `json:"name"`
	}
	if err := c.raw(ctx, "list_jobs", http.MethodGet, projectPath(project, "pipelines", strconv.FormatInt(pipelineID, 10), "jobs"), opt, &jobs); err != nil {
		return 0, err
	}
	runs := map[string]int{}
	most := 0
	for _, j := range jobs {
		runs[j.Name]++
		most = max(most, runs[j.Name])
	}
	return max(most-1, 0), nil
}
