package mr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// Config configures the client.
type Config struct {
	BaseURL      string        // e.g. https://gitlab.example.com (the /api/v4 suffix is added)
	Token        string        // PRIVATE-TOKEN; never logged
	CallTimeout  time.Duration // per call, default 15s: bounds each API request with its retries; a method making several requests bounds each, and the caller's ctx bounds the method
	TargetBranch string        // default "main"

	// MaxRetries bounds the transport's retries of one call (429, and 5xx/network
	// errors of reads). Default 3; negative disables retries.
	MaxRetries int
	// RetryWaitMin and RetryWaitMax bound the exponential backoff between retries
	// that GitLab did not time itself. Defaults 100ms and 2s.
	RetryWaitMin, RetryWaitMax time.Duration
	// MaxRetryAfter is the longest Retry-After a call waits out by itself; a longer
	// one (or one beyond the call's budget) is returned as a transient *Error with
	// RetryAfter set. Default 10s.
	MaxRetryAfter time.Duration
	// MaxActionsPerCommit and MaxCommitBytes split a large batch into several
	// commits, so a single request stays well inside GitLab's request size and
	// Gitaly's time limits. Defaults 500 actions and 8 MiB of content.
	MaxActionsPerCommit int
	MaxCommitBytes      int
	// HTTPClient replaces the pooled default (its Transport is wrapped, not replaced).
	HTTPClient *http.Client
}

// Client implements what the scanner needs from GitLab.
type Client struct {
	cfg     Config
	gl      *gitlab.Client
	version versionCache
}

// New builds a client. It does not call GitLab.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("mr: BaseURL is required")
	}
	if cfg.Token == "" {
		return nil, errors.New("mr: Token is required")
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 15 * time.Second
	}
	if cfg.TargetBranch == "" {
		cfg.TargetBranch = "main"
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 3
	} else if cfg.MaxRetries < 0 {
		cfg.MaxRetries = 0
	}
	if cfg.RetryWaitMin <= 0 {
		cfg.RetryWaitMin = 100 * time.Millisecond
	}
	if cfg.RetryWaitMax < cfg.RetryWaitMin {
		cfg.RetryWaitMax = max(2*time.Second, cfg.RetryWaitMin)
	}
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = 10 * time.Second
	}
	if cfg.MaxActionsPerCommit <= 0 {
		cfg.MaxActionsPerCommit = 500
	}
	if cfg.MaxCommitBytes <= 0 {
		cfg.MaxCommitBytes = 8 << 20
	}

	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	} else {
		cp := *hc
		hc = &cp
	}
	next := hc.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	hc.Transport = captureTransport{next: next}
	// The per-call context bounds each call; a client-level timeout would cut a
	// call that legitimately waits out a Retry-After.
	hc.Timeout = 0

	c := &Client{cfg: cfg}
	gl, err := gitlab.NewClient(cfg.Token,
		gitlab.WithBaseURL(cfg.BaseURL),
		gitlab.WithHTTPClient(hc),
		gitlab.WithCustomRetry(c.checkRetry),
		gitlab.WithCustomBackoff(c.backoff),
		gitlab.WithCustomRetryMax(cfg.MaxRetries),
		gitlab.WithCustomRetryWaitMinMax(cfg.RetryWaitMin, cfg.RetryWaitMax),
		gitlab.WithURLWarningLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		// client-go's option errors do not contain the token, but be certain.
		return nil, fmt.Errorf("mr: %s", c.redact(err.Error()))
	}
	c.gl = gl
	return c, nil
}

// TargetBranch is the configured default target branch.
func (c *Client) TargetBranch() string { return c.cfg.TargetBranch }

// call runs one client-go call bounded by CallTimeout and classifies its error.
func (c *Client) call(ctx context.Context, op, method string, f func(opt gitlab.RequestOptionFunc) (*gitlab.Response, error)) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CallTimeout)
	defer cancel()
	ctx = context.WithValue(ctx, captureKey{}, &capture{})
	ctx = context.WithValue(ctx, methodKey{}, method)
	resp, err := f(gitlab.WithContext(ctx))
	return c.classify(ctx, op, resp, err)
}

// Answers are decoded into the layer's own small types instead of client-go's:
// GitLab answers "extended_trailers" as {"Key": ["value", …]} while client-go v1.46
// declares map[string]string, so every answer carrying a commit with a trailer —
// which batcherd's commits always have — fails to decode; and GitLab's documented
// examples show float durations where client-go expects integers. The requests still
// go through client-go (URL building, auth, retries, error parsing); only the
// decoding is ours, limited to the fields the layer reads.

// glCommit is the part of GitLab's commit entity the layer reads.
type glCommit struct {
	ID        string            `json:"id"`
	Message   string            `json:"message"`
	ParentIDs []string          `json:"parent_ids"`
	Trailers  map[string]string `json:"trailers"`
	// ExtendedTrailers: GitLab answers {"Key": ["value", …]} (arrays of strings).
	ExtendedTrailers map[string][]string `json:"extended_trailers"`
}

// glBranch is the part of GitLab's branch entity the layer reads.
type glBranch struct {
	Name   string    `json:"name"`
	Commit *glCommit `json:"commit"`
}

// glJob is the part of GitLab's job entity the layer reads.
type glJob struct {
	ID            int64  `json:"id"`
	Status        string `json:"status"`
	AllowFailure  bool   `json:"allow_failure"`
	FailureReason string `json:"failure_reason"`
	// DownstreamPipeline is set on a trigger (bridge) job: the pipeline it started.
	DownstreamPipeline *struct {
		ID        int64 `json:"id"`
		ProjectID int64 `json:"project_id"`
	} `json:"downstream_pipeline"`
}

// maxPipelineDepth bounds how far firstFailureReason follows trigger jobs into
// downstream pipelines (GitLab nests child pipelines at most two levels deep).
const maxPipelineDepth = 3

// raw runs one request built by client-go and decodes the answer into out.
func (c *Client) raw(ctx context.Context, op, method, path string, opt, out any) error {
	_, err := c.rawResp(ctx, op, method, path, opt, out, nil)
	return err
}

// rawResp is raw returning the response (for pagination), with an extra request
// option (the next page).
func (c *Client) rawResp(ctx context.Context, op, method, path string, opt, out any, extra gitlab.RequestOptionFunc) (*gitlab.Response, error) {
	var resp *gitlab.Response
	err := c.call(ctx, op, method, func(o gitlab.RequestOptionFunc) (*gitlab.Response, error) {
		req, err := c.gl.NewRequest(method, path, opt, []gitlab.RequestOptionFunc{o, extra})
		if err != nil {
			return nil, err
		}
		resp, err = c.gl.Do(req, out)
		return resp, err
	})
	return resp, err
}

func projectPath(project string, rest ...string) string {
	p := "projects/" + gitlab.PathEscape(project)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// EnsureBranch creates branch from ref; an existing branch is fine. Publish does not
// use it: a batch branch is created by its commit (CommitFiles), because GitLab runs a
// pipeline for every branch it creates, and one created from ref runs a pipeline on
// ref's head that tests nothing of the batch. It is for branches without a batch
// commit (tests, tools).
func (c *Client) EnsureBranch(ctx context.Context, project, branch, ref string) error {
	if ref == "" {
		ref = c.cfg.TargetBranch
	}
	var created glBranch
	err := c.raw(ctx, "create_branch", http.MethodPost, projectPath(project, "repository/branches"),
		&gitlab.CreateBranchOptions{Branch: &branch, Ref: &ref}, &created)
	if err == nil {
		return nil
	}
	if isStatus(err, http.StatusBadRequest) && messageContains(err, "already exists") {
		return nil
	}
	if ClassOf(err) == ClassTransient {
		// The answer may have been lost after GitLab created the branch.
		if _, found, gerr := c.getBranch(ctx, project, branch); gerr == nil && found {
			return nil
		}
	}
	return err
}

// DeleteBranch deletes a branch; one that is not there is fine.
func (c *Client) DeleteBranch(ctx context.Context, project, branch string) error {
	err := c.raw(ctx, "delete_branch", http.MethodDelete, projectPath(project, "repository/branches", gitlab.PathEscape(branch)), nil, nil)
	if ClassOf(err) == ClassNotFound {
		return nil
	}
	return err
}

// getBranch reads a branch; found=false when GitLab says it is not there.
func (c *Client) getBranch(ctx context.Context, project, branch string) (*glBranch, bool, error) {
	var b glBranch
	err := c.raw(ctx, "get_branch", http.MethodGet, projectPath(project, "repository/branches", gitlab.PathEscape(branch)), nil, &b)
	if ClassOf(err) == ClassNotFound && !messageContains(err, "project") {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return &b, true, nil
}

// FindMR looks up the MR for a source branch in any state (newest first); found=false
// when there is none. A merged or closed MR for the branch is the batch's MR — but only
// when it is the batch's: see below.
//
// When several MRs exist for the branch (a human reopened or recreated one), a
// merged one wins because its content landed, then an open one, then the newest
// closed one.
//
// Only an MR from this project's own branch into the configured target branch can be
// the batch's. A project's MR list also holds MRs from forks, whose branches may carry
// the same (predictable) name, and MRs from the batch branch into another branch:
// adopting one would let a stranger's MR stand in for the batch — its merge marking
// the batch merged without its files, its closing failing the members.
//
// And only an MR whose commits carry the branch owner's trailers (Batcherd-Installation
// of the installation the branch names, Batcherd-Batch: batchID) is the batch's. A
// second database pointed at the same project starts batch ids at 1 again; without
// this check its batch 1 adopted the first installation's long-merged MR and settled
// its operations merged with none of their files written. When MRs exist for the
// branch but none is the batch's, FindMR returns a *ForeignMRError naming the best of
// them, and the caller leaves it alone.
func (c *Client) FindMR(ctx context.Context, project, sourceBranch string, batch BatchRef) (MergeRequest, bool, error) {
	owner := ownerOf(sourceBranch, batch)
	all, err := c.listMRs(ctx, "find_mr", project, &gitlab.ListProjectMergeRequestsOptions{
		State:        gitlab.Ptr("all"),
		SourceBranch: &sourceBranch,
		OrderBy:      gitlab.Ptr("created_at"),
		Sort:         gitlab.Ptr("desc"),
	})
	if err != nil {
		return MergeRequest{}, false, err
	}
	rank := func(s string) int {
		switch s {
		case StateMerged:
			return 3
		case StateOpened, StateLocked:
			return 2
		}
		return 1
	}
	var cands []*glMR
	for i := range all {
		m := &all[i]
		if m.SourceBranch != sourceBranch || m.TargetBranch != c.cfg.TargetBranch || !m.fromThisProject() {
			continue // never adopt another branch's MR, one from a fork, or one into another branch
		}
		cands = append(cands, m)
	}
	// Best first; the listing is newest first and the sort is stable.
	slices.SortStableFunc(cands, func(a, b *glMR) int { return rank(b.State) - rank(a.State) })
	for _, m := range cands {
		ours, err := c.mrCarries(ctx, project, m.IID, sourceBranch, owner)
		if err != nil {
			return MergeRequest{}, false, err
		}
		if !ours {
			continue
		}
		mr, err := c.GetMR(ctx, project, m.IID)
		if err != nil {
			return MergeRequest{}, false, err
		}
		return mr, true, nil
	}
	if len(cands) > 0 {
		m := cands[0]
		return MergeRequest{}, false, &ForeignMRError{Branch: sourceBranch, Owner: owner, IID: m.IID, State: m.State, WebURL: m.WebURL}
	}
	return MergeRequest{}, false, nil
}

// IsBatchMR reports whether m, an MR this layer listed (ListOpenLabeled, which leaves
// forks out), is batch batchID's own by the rules FindMR adopts by: from the batch's
// branch m.SourceBranch into the configured target branch, with a commit carrying the
// trailers of the branch's owner (Batcherd-Installation of the installation the branch
// names, Batcherd-Batch: batchID). Whoever closes or adopts an MR found by its branch
// name asks this first: the name is predictable, and someone else's MR on it — another
// installation's, a human's — is never batcherd's to close, nor its merge the batch's.
func (c *Client) IsBatchMR(ctx context.Context, project string, m MergeRequest, batch BatchRef) (bool, error) {
	if m.TargetBranch != c.cfg.TargetBranch {
		return false, nil // into another branch: never the batch's (as in FindMR)
	}
	return c.mrCarries(ctx, project, m.IID, m.SourceBranch, ownerOf(m.SourceBranch, batch))
}

// maxMRCommitPages bounds how many pages of an MR's commits mrCarries reads: a batch
// MR has one commit per chunk, so its trailers are on the first page; a branch with
// more commits than this is not a batch's.
const maxMRCommitPages = 10

// mrCarries reports whether any commit of MR iid carries owner's trailers. An MR with
// no commits of its own — opened from branch after the branch's commits reached the
// target, e.g. by a publisher whose lease lapsed between its FindMR and its create
// while another replica's MR merged (docs/MODEL.md) — has nothing to merge; it is
// judged by the branch's head commit, so the orphan sweep closes such an MR of ours
// instead of leaving it open as someone else's.
func (c *Client) mrCarries(ctx context.Context, project string, iid int64, branch string, owner Owner) (bool, error) {
	opt := &gitlab.ListOptions{PerPage: 100}
	var next gitlab.RequestOptionFunc
	seen := 0
	for page := 0; page < maxMRCommitPages; page++ {
		var commits []glCommit
		resp, err := c.rawResp(ctx, "list_mr_commits", http.MethodGet, mrPath(project, iid)+"/commits", opt, &commits, next)
		if err != nil {
			return false, err
		}
		seen += len(commits)
		for i := range commits {
			if readTrailers(&commits[i]).carries(owner) {
				return true, nil
			}
		}
		n, ok := gitlab.WithNext(resp)
		if !ok {
			break
		}
		next = n
	}
	if seen > 0 {
		return false, nil
	}
	b, found, err := c.getBranch(ctx, project, branch)
	if err != nil || !found {
		return false, err
	}
	return readTrailers(b.Commit).carries(owner), nil
}

// listMRs reads every page of a merge request listing.
func (c *Client) listMRs(ctx context.Context, op, project string, opt *gitlab.ListProjectMergeRequestsOptions) ([]glMR, error) {
	opt.PerPage = 100
	var out []glMR
	var next gitlab.RequestOptionFunc
	for page := 0; ; page++ {
		if page > 1000 {
			return nil, &Error{Op: op, Class: ClassPermanent, Message: "more than 1000 pages of merge requests"}
		}
		var mrs []glMR
		resp, err := c.rawResp(ctx, op, http.MethodGet, projectPath(project, "merge_requests"), opt, &mrs, next)
		if err != nil {
			return nil, err
		}
		out = append(out, mrs...)
		n, ok := gitlab.WithNext(resp)
		if !ok {
			return out, nil
		}
		next = n
	}
}

// EnsureMR returns the branch's MR, creating it if there is none. A 409 "Another open
// merge request already exists" means look it up again, never a second MR.
//
// spec.BatchID is the batch the branch belongs to: an MR found for the branch that is
// not that batch's (see FindMR) is never adopted, and EnsureMR returns FindMR's
// *ForeignMRError instead of opening one beside it (GitLab refuses a second open MR
// for a branch anyway).
func (c *Client) EnsureMR(ctx context.Context, project string, spec MRSpec) (MergeRequest, error) {
	if mr, found, err := c.FindMR(ctx, project, spec.SourceBranch, spec.Batch); err != nil || found {
		return mr, err
	}
	target := spec.TargetBranch
	if target == "" {
		target = c.cfg.TargetBranch
	}
	labels := gitlab.LabelOptions(withLabel(spec.Labels))
	var created glMR
	err := c.raw(ctx, "create_mr", http.MethodPost, projectPath(project, "merge_requests"), &gitlab.CreateMergeRequestOptions{
		Title:        &spec.Title,
		Description:  &spec.Description,
		SourceBranch: &spec.SourceBranch,
		TargetBranch: &target,
		Labels:       &labels,
	}, &created)
	if err == nil {
		return c.withFailureReason(ctx, project, created.convert()), nil
	}
	if isStatus(err, http.StatusConflict) || ClassOf(err) == ClassTransient {
		// 409: another replica (or our own lost answer) created it. Transient: the
		// answer may have been lost after GitLab created it. Either way, read again.
		mr, found, ferr := c.FindMR(ctx, project, spec.SourceBranch, spec.Batch)
		if ferr == nil && found {
			return mr, nil
		}
		var foreign *ForeignMRError
		if errors.As(ferr, &foreign) {
			return MergeRequest{}, ferr
		}
	}
	return MergeRequest{}, err
}

func withLabel(labels []string) []string {
	out := make([]string, 0, len(labels)+1)
	out = append(out, Label)
	for _, l := range labels {
		l = strings.TrimSpace(l)
		if l != "" && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// GetMR reads one MR, with its head pipeline status and failure reason, and whether a
// rebase is running.
func (c *Client) GetMR(ctx context.Context, project string, iid int64) (MergeRequest, error) {
	var m glMR
	opt := &gitlab.GetMergeRequestsOptions{IncludeRebaseInProgress: gitlab.Ptr(true)}
	if err := c.raw(ctx, "get_mr", http.MethodGet, mrPath(project, iid), opt, &m); err != nil {
		return MergeRequest{}, err
	}
	return c.withFailureReason(ctx, project, m.convert()), nil
}

// withFailureReason fills FailureReason of an MR whose head pipeline failed. The MR
// read stands either way; a reason that could not be read is FailureReasonErr, so the
// caller that classifies the failure can wait for it instead of calling it unknown.
func (c *Client) withFailureReason(ctx context.Context, project string, mr MergeRequest) MergeRequest {
	if mr.PipelineStatus == "failed" && mr.PipelineID != 0 {
		mr.FailureReason, mr.FailureReasonErr = c.firstFailureReason(ctx, project, mr.PipelineID)
	}
	return mr
}

// firstFailureReason returns the failure_reason of the earliest failed job of a
// pipeline. A pipeline whose jobs did not fail but whose trigger (bridge) job did —
// parent/child and multi-project pipelines, whose jobs run downstream — gets the reason
// of its downstream pipeline: GitLab's jobs listing leaves trigger jobs out, and
// without following them every such failure read as unknown.
func (c *Client) firstFailureReason(ctx context.Context, project string, pipelineID int64) (string, error) {
	return c.failureReasonAt(ctx, project, pipelineID, 0)
}

func (c *Client) failureReasonAt(ctx context.Context, project string, pipelineID int64, depth int) (string, error) {
	scope := []gitlab.BuildStateValue{gitlab.Failed}
	opt := &gitlab.ListJobsOptions{ListOptions: gitlab.ListOptions{PerPage: 100}, Scope: &scope}
	var jobs []glJob
	if err := c.raw(ctx, "list_failed_jobs", http.MethodGet, projectPath(project, "pipelines", strconv.FormatInt(pipelineID, 10), "jobs"), opt, &jobs); err != nil {
		return "", err
	}
	if first := firstFailed(jobs); first != nil {
		return first.FailureReason, nil
	}
	if depth >= maxPipelineDepth {
		return "", nil
	}
	var bridges []glJob
	if err := c.raw(ctx, "list_failed_bridges", http.MethodGet, projectPath(project, "pipelines", strconv.FormatInt(pipelineID, 10), "bridges"), opt, &bridges); err != nil {
		return "", err
	}
	first := firstFailed(bridges)
	if first == nil {
		return "", nil
	}
	if first.DownstreamPipeline == nil || first.DownstreamPipeline.ID == 0 {
		return first.FailureReason, nil // the trigger itself failed (downstream never created)
	}
	down := project
	if first.DownstreamPipeline.ProjectID != 0 {
		down = strconv.FormatInt(first.DownstreamPipeline.ProjectID, 10)
	}
	return c.failureReasonAt(ctx, down, first.DownstreamPipeline.ID, depth+1)
}

// firstFailed is the earliest failed job that is allowed to fail the pipeline.
func firstFailed(jobs []glJob) *glJob {
	var first *glJob
	for i := range jobs {
		j := &jobs[i]
		if j.Status != "failed" || j.AllowFailure {
			continue
		}
		if first == nil || j.ID < first.ID {
			first = j
		}
	}
	return first
}

// SetAutoMerge arms "merge when pipeline succeeds", guarded by sha. If the pipeline
// already succeeded GitLab merges at once, and the returned MR says merged.
func (c *Client) SetAutoMerge(ctx context.Context, project string, iid int64, sha string) (MergeRequest, error) {
	mr, err := c.acceptMR(ctx, "set_auto_merge", project, iid, c.autoMergeOptions(ctx, sha))
	if err == nil {
		return mr, nil
	}
	if retryable := ClassOf(err) == ClassTransient || isStatus(err, http.StatusMethodNotAllowed) || isStatus(err, http.StatusUnprocessableEntity); retryable {
		// A lost answer to an earlier call, or a merge that already happened, shows
		// in the MR itself.
		if cur, gerr := c.GetMR(ctx, project, iid); gerr == nil {
			if cur.State == StateMerged || (cur.State == StateOpened && cur.MergeWhenPipelineSucceeds && cur.SHA == sha) {
				return cur, nil
			}
		}
	}
	return MergeRequest{}, err
}

// Merge merges now, guarded by sha.
func (c *Client) Merge(ctx context.Context, project string, iid int64, sha string) (MergeRequest, error) {
	mr, err := c.acceptMR(ctx, "merge", project, iid, &gitlab.AcceptMergeRequestOptions{SHA: &sha})
	if err == nil {
		return mr, nil
	}
	if retryable := ClassOf(err) == ClassTransient || isStatus(err, http.StatusMethodNotAllowed) || isStatus(err, http.StatusUnprocessableEntity); retryable {
		if cur, gerr := c.GetMR(ctx, project, iid); gerr == nil && cur.State == StateMerged {
			return cur, nil
		}
	}
	return MergeRequest{}, err
}

func (c *Client) acceptMR(ctx context.Context, op, project string, iid int64, opt *gitlab.AcceptMergeRequestOptions) (MergeRequest, error) {
	var m glMR
	if err := c.raw(ctx, op, http.MethodPut, mrPath(project, iid)+"/merge", opt, &m); err != nil {
		return MergeRequest{}, err
	}
	return c.withFailureReason(ctx, project, m.convert()), nil
}

// CloseMR closes an MR; closing a closed MR is fine; a merged MR stays merged (the
// returned MergeRequest says which). Callers re-read after closing: merged wins.
func (c *Client) CloseMR(ctx context.Context, project string, iid int64) (MergeRequest, error) {
	var m glMR
	err := c.raw(ctx, "close_mr", http.MethodPut, mrPath(project, iid), &gitlab.UpdateMergeRequestOptions{StateEvent: gitlab.Ptr("close")}, &m)
	if err == nil {
		return c.withFailureReason(ctx, project, m.convert()), nil
	}
	if ClassOf(err) == ClassTransient || ClassOf(err) == ClassPermanent {
		// Either the answer was lost, or GitLab refused a transition (merged, locked):
		// the MR's current state is the answer the caller needs.
		if cur, gerr := c.GetMR(ctx, project, iid); gerr == nil && (cur.State == StateClosed || cur.State == StateMerged) {
			return cur, nil
		}
	}
	return MergeRequest{}, err
}

// ListOpenLabeled lists open MRs carrying label (all pages).
func (c *Client) ListOpenLabeled(ctx context.Context, project, label string) ([]MergeRequest, error) {
	labels := gitlab.LabelOptions{label}
	all, err := c.listMRs(ctx, "list_open_labeled", project, &gitlab.ListProjectMergeRequestsOptions{
		State:   gitlab.Ptr(StateOpened),
		Labels:  &labels,
		OrderBy: gitlab.Ptr("created_at"),
		Sort:    gitlab.Ptr("asc"),
	})
	if err != nil {
		return nil, err
	}
	out := make([]MergeRequest, 0, len(all))
	for _, m := range all {
		if m.fromThisProject() { // a fork's MR is never one of batcherd's (see FindMR)
			out = append(out, m.convert())
		}
	}
	return out, nil
}

// fromThisProject reports whether the MR comes from a branch of the project it targets,
// not from a fork.
func (m glMR) fromThisProject() bool { return m.SourceProjectID == m.TargetProjectID }

func mrPath(project string, iid int64) string {
	return projectPath(project, "merge_requests", strconv.FormatInt(iid, 10))
}

// glMR is the part of GitLab's merge request entity the layer reads (list answers
// lack the pipelines). Decoding only these fields keeps the layer independent of
// fields whose type varies between GitLab versions and implementations (durations
// that are floats in some, integers in others).
type glMR struct {
	IID                       int64       `json:"iid"`
	State                     string      `json:"state"`
	MergeStatus               string      `json:"merge_status"`
	DetailedMergeStatus       string      `json:"detailed_merge_status"`
	MergeError                *string     `json:"merge_error"`
	RebaseInProgress          bool        `json:"rebase_in_progress"`
	HasConflicts              bool        `json:"has_conflicts"`
	SHA                       string      `json:"sha"`
	WebURL                    string      `json:"web_url"`
	SourceBranch              string      `json:"source_branch"`
	TargetBranch              string      `json:"target_branch"`
	SourceProjectID           int64       `json:"source_project_id"`
	TargetProjectID           int64       `json:"target_project_id"`
	Labels                    []string    `json:"labels"`
	MergeWhenPipelineSucceeds bool        `json:"merge_when_pipeline_succeeds"`
	MergedAt                  *time.Time  `json:"merged_at"`
	ClosedAt                  *time.Time  `json:"closed_at"`
	HeadPipeline              *glPipeline `json:"head_pipeline"`
	Pipeline                  *glPipeline `json:"pipeline"`
}

type glPipeline struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
	SHA    string `json:"sha"`
}

func (m glMR) convert() MergeRequest {
	mr := MergeRequest{
		IID:                       m.IID,
		State:                     m.State,
		MergeStatus:               m.MergeStatus,
		DetailedMergeStatus:       m.DetailedMergeStatus,
		RebaseInProgress:          m.RebaseInProgress,
		HasConflicts:              m.HasConflicts,
		SHA:                       m.SHA,
		WebURL:                    m.WebURL,
		SourceBranch:              m.SourceBranch,
		TargetBranch:              m.TargetBranch,
		Labels:                    slices.Clone(m.Labels),
		MergeWhenPipelineSucceeds: m.MergeWhenPipelineSucceeds,
		MergedAt:                  m.MergedAt,
		ClosedAt:                  m.ClosedAt,
	}
	if m.MergeError != nil {
		mr.MergeError = *m.MergeError
	}
	switch {
	case m.HeadPipeline != nil:
		mr.PipelineStatus, mr.PipelineID = m.HeadPipeline.Status, m.HeadPipeline.ID
	case m.Pipeline != nil && m.Pipeline.SHA == m.SHA:
		mr.PipelineStatus, mr.PipelineID = m.Pipeline.Status, m.Pipeline.ID
	}
	return mr
}
