// Package gitlabsim is an in-memory GitLab REST API server for the subset batcherd
// uses: branches, multi-file commits, repository tree, merge requests (list, get,
// create, update, merge with auto-merge) and pipelines/jobs, all under /api/v4 with
// GitLab's JSON shapes, status codes and error bodies.
//
// It exists so that tests and the demo exercise the real client over real HTTP,
// including the failures that matter for correctness: answers lost after the work
// was done, rate limiting, server errors, slow answers, failed pipelines and merge
// conflicts. A control API (Go methods, and HTTP under /-/sim/) plays the human
// (merge or close an MR, fail a pipeline, push to the default branch) and injects
// faults.
//
// What it models:
//   - projects addressed by numeric id or URL-encoded path, PRIVATE-TOKEN (or Bearer)
//     auth, a protected default branch (API pushes refused, merges allowed);
//   - a commit graph with full-tree snapshots; merges apply the MR's changes since
//     the merge base onto the target and refuse when the target changed the same
//     path differently (detailed_merge_status "conflict", has_conflicts true);
//   - one pipeline per commit pushed to a non-default branch, succeeding after a
//     configurable duration, or failing by a seeded random rate, by a "poison" rule
//     (a changed file whose path or content contains a substring), or on command;
//   - merge when pipeline succeeds: the MR merges when the head pipeline succeeds if
//     the head is still the sha it was armed with.
package gitlabsim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options configure a simulator.
type Options struct {
	// Token is the only accepted PRIVATE-TOKEN. Default "sim-token".
	Token string
	// Projects are created at start, by path ("group/project"); ids count from 1.
	Projects []string
	// DefaultBranch of every project. Default "main".
	DefaultBranch string
	// PipelineDuration is how long a pipeline runs before it finishes. Zero finishes
	// it as it is created (tests that do not care about CI).
	PipelineDuration time.Duration
	// ManualPipelines keeps pipelines running until FailPipeline/SucceedPipeline.
	ManualPipelines bool
	// ChildPipelines runs every pipeline's job in a child pipeline its trigger (bridge)
	// job starts, as parent/child pipelines do: the parent's own job list is empty, and
	// why it failed is in the child's jobs, reached through GET …/pipelines/:id/bridges.
	ChildPipelines bool
	// FailureRate is the probability (0..1) that a pipeline fails by itself, with
	// FailureReason (default "script_failure").
	FailureRate   float64
	FailureReason string
	// Seed makes the random failures reproducible.
	Seed uint64
	// WebURL is the base of web_url fields. Default: the server's own URL.
	WebURL string
	// MaxActionsPerCommit makes larger commits fail with 400, to exercise chunking.
	// Zero means no limit.
	MaxActionsPerCommit int

	// Version is the GitLab version spoken (GET /version, and the merge endpoint's
	// semantics: see Version16). Default DefaultVersion.
	Version string
	// MergeMethod of every project: merge (default), ff or rebase_merge. With ff and
	// rebase_merge an MR whose source does not contain the target's head shows
	// detailed_merge_status need_rebase and is not merged until rebased
	// (PUT …/merge_requests/:iid/rebase).
	MergeMethod string
	// MergeCheckReads and MergeCheckDelay make mergeability asynchronous, as GitLab
	// computes it after an MR is created or either branch moves: the MR shows
	// merge_status/detailed_merge_status preparing (new MR) or unchecked, then
	// checking, until it has been read (GET) MergeCheckReads times and MergeCheckDelay
	// has passed. Meanwhile it cannot be merged at once (405). Zero: known at once.
	MergeCheckReads int
	MergeCheckDelay time.Duration
	// RebaseReads and RebaseDelay make a rebase asynchronous: rebase_in_progress stays
	// true until the MR has been read RebaseReads times and RebaseDelay has passed.
	// Zero: the rebase is done by the next read.
	RebaseReads int
	RebaseDelay time.Duration
	// PipelineStartStatus is the status a new pipeline shows until it ends (default
	// running; created, pending, preparing, waiting_for_resource are what GitLab shows
	// before a runner takes it).
	PipelineStartStatus string
	// PipelineRules decide how pipelines end, per branch (see PipelineRule).
	PipelineRules []PipelineRule
	// PipelineCreateReads keeps a new pipeline "being created" until the MR of its
	// branch has been read (GET) this many times: the MR shows no head pipeline
	// (detailed_merge_status ci_still_running), and the merge endpoint answers 405 to a
	// merge or auto-merge meanwhile, as GitLab does while it creates a pipeline.
	PipelineCreateReads int
}

// User is the identity behind the token, shown as author/merge_user.
type User struct {
	ID       int64
	Username string
	Name     string
	Email    string
}

// Sim is the simulator. All methods are safe for concurrent use.
type Sim struct {
	mu   sync.Mutex
	opts Options
	ver  version
	user User
	rng  *rand.Rand

	projects   map[int64]*project
	byPath     map[string]*project
	nextProjID int64
	commits    map[string]*commit
	commitSeq  int64
	nextMRID   int64
	nextPipeID int64
	nextJobID  int64

	faults    []*fault
	nextFault int64
	calls     []Call
	closed    bool

	srv    *http.Server
	ts     *httptest.Server
	url    string
	timers map[*time.Timer]bool

	// refused: paths createCommit refuses, by project path (boundary.go).
	refused map[string][]RefusedPath
}

type project struct {
	id            int64
	path          string
	defaultBranch string
	branches      map[string]string // name → head sha
	protected     map[string]bool
	mrs           []*mergeRequest
	nextIID       int64
	pipelines     []*pipeline
	poison        []PoisonRule
	createdAt     time.Time
	mergeMethod   string
}

type mergeRequest struct {
	id, iid       int64
	title         string
	description   string
	source        string
	target        string
	labels        []string
	state         string
	createdAt     time.Time
	updatedAt     time.Time
	mergedAt      *time.Time
	closedAt      *time.Time
	mergeCommit   string
	targetAtMerge string // the target's head the merge was made on (the MR's commits stay those it did not have)
	frozenSHA     string // head sha when merged/closed, or when the branch vanished
	autoMerge     bool
	autoMergeSHA  string
	mergeError    string
	removeSource  bool
	squash        bool
	mergedByHuman bool
	// forkProject is the id of the fork the MR comes from, 0 for this project's own
	// branch. A fork's branch is not in this project; frozenSHA stands for its head.
	forkProject int64
	// check is the asynchronous mergeability check in progress (Options.MergeCheckReads).
	check asyncCheck
	// rebase is the rebase in progress (PUT …/rebase), if any.
	rebase *asyncRebase
}

type pipeline struct {
	id, iid       int64
	projectID     int64
	sha, ref      string
	status        string
	failureReason string
	createdAt     time.Time
	startedAt     *time.Time
	finishedAt    *time.Time
	updatedAt     time.Time
	jobs          []*job
	planned       string // outcome decided at creation (or retry): a status
	plannedReason string
	retries       int // times its failed jobs were retried (POST …/retry)
	creating      int // reads of its MR left before it exists for the API (PipelineCreateReads)
	// child is the downstream pipeline of this pipeline's bridge job (ChildPipelines),
	// bridgeID that job's id; parent is set on the child (source parent_pipeline).
	child    *pipeline
	bridgeID int64
	parent   *pipeline
}

type job struct {
	id            int64
	name, stage   string
	retried       bool // replaced by a retry: listed only with include_retried
	status        string
	failureReason string
	createdAt     time.Time
	startedAt     *time.Time
	finishedAt    *time.Time
}

// PoisonRule fails every pipeline whose commit changes (relative to the default
// branch) a file whose path or content contains Substring.
type PoisonRule struct {
	Substring     string `json:"substring"`
	InPath        bool   `json:"in_path"`    // match paths (default when both false: both)
	InContent     bool   `json:"in_content"` // match contents
	FailureReason string `json:"failure_reason"`
	// Times, when positive, retires the rule after it has failed that many pipelines
	// (a flaky runner that fails once, then recovers). Zero: for ever.
	Times int `json:"times,omitempty"`
}

// Call is one API request the simulator answered (control calls are not recorded).
type Call struct {
	Method string    `json:"method"`
	Route  string    `json:"route"` // e.g. "POST /projects/:id/repository/commits"
	Path   string    `json:"path"`
	Status int       `json:"status"`           // 0 when the connection was dropped
	Params []string  `json:"params,omitempty"` // names of the parameters sent (query and body)
	At     time.Time `json:"at"`
	Fault  bool      `json:"fault"`
}

// New builds a simulator; call Start or StartTest (or use Handler) to serve it.
func New(opts Options) *Sim {
	if opts.Token == "" {
		opts.Token = "sim-token"
	}
	if opts.DefaultBranch == "" {
		opts.DefaultBranch = "main"
	}
	if opts.FailureReason == "" {
		opts.FailureReason = "script_failure"
	}
	if opts.Version == "" {
		opts.Version = DefaultVersion
	}
	ver, err := parseVersion(opts.Version)
	if err != nil {
		panic(err)
	}
	switch opts.MergeMethod {
	case "":
		opts.MergeMethod = MergeMethodMerge
	case MergeMethodMerge, MergeMethodFastForward, MergeMethodRebaseMerge:
	default:
		panic("gitlabsim: unknown merge method " + opts.MergeMethod)
	}
	if opts.PipelineStartStatus == "" {
		opts.PipelineStartStatus = PipelineRunning
	}
	opts.PipelineRules = slices.Clone(opts.PipelineRules)
	s := &Sim{
		opts:     opts,
		ver:      ver,
		user:     User{ID: 1, Username: "batcherd-bot", Name: "batcherd bot", Email: "batcherd-bot@example.com"},
		rng:      rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		projects: map[int64]*project{},
		byPath:   map[string]*project{},
		commits:  map[string]*commit{},
		timers:   map[*time.Timer]bool{},
	}
	for _, p := range opts.Projects {
		s.AddProject(p)
	}
	return s
}

// StartTest serves the simulator on a local httptest server closed at the end of
// the test.
func StartTest(tb testing.TB, opts Options) *Sim {
	tb.Helper()
	s := New(opts)
	s.ts = httptest.NewServer(s)
	s.mu.Lock()
	s.url = s.ts.URL
	s.mu.Unlock()
	tb.Cleanup(s.Close)
	return s
}

// Start serves the simulator on addr (":0" picks a port) until Close.
func (s *Sim) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.url = "http://" + ln.Addr().String()
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	srv := s.srv
	s.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// URL is the server's base URL (without /api/v4).
func (s *Sim) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Token is the accepted PRIVATE-TOKEN.
func (s *Sim) Token() string { return s.opts.Token }

// Close stops the server and every pending pipeline timer.
func (s *Sim) Close() {
	s.mu.Lock()
	s.closed = true
	for t := range s.timers {
		t.Stop()
	}
	s.timers = map[*time.Timer]bool{}
	srv, ts := s.srv, s.ts
	s.mu.Unlock()
	if ts != nil {
		ts.CloseClientConnections()
		ts.Close()
	}
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

func (s *Sim) now() time.Time { return time.Now().UTC() }

func (s *Sim) webBase() string {
	if s.opts.WebURL != "" {
		return strings.TrimRight(s.opts.WebURL, "/")
	}
	return s.url
}

// AddProject creates a project with an initial commit (a README) on its protected
// default branch and returns its id. Adding an existing path returns its id.
func (s *Sim) AddProject(path string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.byPath[path]; p != nil {
		return p.id
	}
	s.nextProjID++
	p := &project{
		id:            s.nextProjID,
		path:          path,
		defaultBranch: s.opts.DefaultBranch,
		branches:      map[string]string{},
		protected:     map[string]bool{s.opts.DefaultBranch: true},
		createdAt:     s.now(),
		mergeMethod:   s.opts.MergeMethod,
	}
	c := s.newCommit(nil, "Initial commit", map[string]string{"README.md": "# " + path + "\n"})
	p.branches[p.defaultBranch] = c.sha
	s.projects[p.id] = p
	s.byPath[path] = p
	return p.id
}

func (s *Sim) projectLocked(ref string) *project {
	if p := s.byPath[ref]; p != nil {
		return p
	}
	for _, p := range s.projects {
		if ref == itoa(p.id) {
			return p
		}
	}
	return nil
}

// ErrNotFound is returned by control methods for unknown projects, MRs or pipelines.
var ErrNotFound = errors.New("gitlabsim: not found")

// Files returns the files on the project's default branch.
func (s *Sim) Files(project string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return nil
	}
	return maps.Clone(s.commits[p.branches[p.defaultBranch]].files)
}

// BranchFiles returns the files on a branch (nil when it does not exist).
func (s *Sim) BranchFiles(project, branch string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return nil
	}
	sha, ok := p.branches[branch]
	if !ok {
		return nil
	}
	return maps.Clone(s.commits[sha].files)
}

// Branches returns branch name → head sha.
func (s *Sim) Branches(project string) map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return nil
	}
	return maps.Clone(p.branches)
}

// CommitCount is the number of commits on branch that are not on the default
// branch's first-parent history at the branch point, i.e. the commits an MR of that
// branch would bring (for the default branch: its whole first-parent history).
func (s *Sim) CommitCount(project, branch string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return 0
	}
	head, ok := p.branches[branch]
	if !ok {
		return 0
	}
	var onDefault map[string]bool
	if branch != p.defaultBranch {
		onDefault = s.ancestors(p.branches[p.defaultBranch])
	}
	n := 0
	for cur := head; cur != "" && !onDefault[cur]; {
		n++
		c := s.commits[cur]
		if c == nil || len(c.parents) == 0 {
			break
		}
		cur = c.parents[0]
	}
	return n
}

// HeadCommit returns the sha and message of a branch's head.
func (s *Sim) HeadCommit(project, branch string) (sha, message string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return "", "", false
	}
	sha, ok = p.branches[branch]
	if !ok {
		return "", "", false
	}
	return sha, s.commits[sha].message, true
}

// MRState is what the control API reports of an MR.
type MRState struct {
	IID                 int64    `json:"iid"`
	State               string   `json:"state"`
	SourceBranch        string   `json:"source_branch"`
	TargetBranch        string   `json:"target_branch"`
	Title               string   `json:"title"`
	Labels              []string `json:"labels"`
	SHA                 string   `json:"sha"`
	AutoMerge           bool     `json:"merge_when_pipeline_succeeds"`
	DetailedMergeStatus string   `json:"detailed_merge_status"`
	PipelineID          int64    `json:"head_pipeline_id,omitempty"`
	PipelineStatus      string   `json:"head_pipeline_status,omitempty"`
	MergeCommitSHA      string   `json:"merge_commit_sha,omitempty"`
}

func (s *Sim) mrStateLocked(p *project, m *mergeRequest) MRState {
	st := MRState{
		IID: m.iid, State: m.state, SourceBranch: m.source, TargetBranch: m.target,
		Title: m.title, Labels: slices.Clone(m.labels), SHA: s.mrSHA(p, m),
		AutoMerge: m.autoMerge, DetailedMergeStatus: s.detailedMergeStatus(p, m),
		MergeCommitSHA: m.mergeCommit,
	}
	if pl := s.headPipeline(p, m); pl != nil {
		st.PipelineID, st.PipelineStatus = pl.id, pl.status
	}
	return st
}

// MRsByBranch returns every MR of the project grouped by source branch, oldest first.
func (s *Sim) MRsByBranch(project string) map[string][]MRState {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return nil
	}
	out := map[string][]MRState{}
	for _, m := range p.mrs {
		out[m.source] = append(out[m.source], s.mrStateLocked(p, m))
	}
	return out
}

// MR returns one MR's state.
func (s *Sim) MR(project string, iid int64) (MRState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, m, err := s.mrLocked(project, iid)
	if err != nil {
		return MRState{}, false
	}
	return s.mrStateLocked(p, m), true
}

// mrLocked finds a project's MR by iid; ErrNotFound when either is unknown. s.mu is held.
func (s *Sim) mrLocked(project string, iid int64) (*project, *mergeRequest, error) {
	p := s.projectLocked(project)
	if p == nil {
		return nil, nil, ErrNotFound
	}
	m := p.mr(iid)
	if m == nil {
		return nil, nil, ErrNotFound
	}
	return p, m, nil
}

func (p *project) mr(iid int64) *mergeRequest {
	for _, m := range p.mrs {
		if m.iid == iid {
			return m
		}
	}
	return nil
}

// OpenMR opens an MR as a human would, from sourceBranch into targetBranch. fromFork
// makes it come from a fork whose branch has that name (GitLab lists such MRs with
// the target project's own, under source_project_id of the fork); otherwise both
// branches must exist here. It returns the MR's iid.
func (s *Sim) OpenMR(project, sourceBranch, targetBranch string, labels []string, fromFork bool) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return 0, errors.New("gitlabsim: no project " + project)
	}
	if _, ok := p.branches[targetBranch]; !ok {
		return 0, errors.New("gitlabsim: no branch " + targetBranch)
	}
	m := &mergeRequest{title: "opened by a human", source: sourceBranch, target: targetBranch,
		labels: dedupe(labels), state: "opened", createdAt: s.now(), updatedAt: s.now()}
	if fromFork {
		s.nextProjID++ // the fork is a project of its own
		m.forkProject = s.nextProjID
		m.frozenSHA = fmt.Sprintf("%040x", m.forkProject)
	} else if _, ok := p.branches[sourceBranch]; !ok {
		return 0, errors.New("gitlabsim: no branch " + sourceBranch)
	}
	s.nextMRID++
	p.nextIID++
	m.id, m.iid = s.nextMRID, p.nextIID
	p.mrs = append(p.mrs, m)
	return m.iid, nil
}

// LockMR puts an open MR in the state GitLab shows while it merges it (locked): it
// can neither be closed nor merged until UnlockMR ends the merge, merged or not.
func (s *Sim) LockMR(project string, iid int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, m, err := s.mrLocked(project, iid)
	if err != nil {
		return err
	}
	if m.state != "opened" {
		return errors.New("gitlabsim: merge request is " + m.state)
	}
	m.state, m.updatedAt = "locked", s.now()
	return nil
}

// UnlockMR ends the merge of a locked MR: merged, or back to open (the merge failed).
func (s *Sim) UnlockMR(project string, iid int64, merged bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, m, err := s.mrLocked(project, iid)
	if err != nil {
		return err
	}
	if m.state != "locked" {
		return errors.New("gitlabsim: merge request is " + m.state)
	}
	m.state, m.updatedAt = "opened", s.now()
	if merged {
		return s.doMerge(p, m, "", false)
	}
	return nil
}

// MergeMR merges an MR as a human would, regardless of its pipeline. It fails on
// conflicts or when the MR is not open.
func (s *Sim) MergeMR(project string, iid int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, m, err := s.mrLocked(project, iid)
	if err != nil {
		return err
	}
	if m.state != "opened" {
		return errors.New("gitlabsim: merge request is " + m.state)
	}
	if err := s.doMerge(p, m, "", true); err != nil {
		return err
	}
	return nil
}

// CloseMR closes an MR as a human would (no-op when closed or merged).
func (s *Sim) CloseMR(project string, iid int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, m, err := s.mrLocked(project, iid)
	if err != nil {
		return err
	}
	s.closeMR(p, m)
	return nil
}

// FailPipeline finishes a pipeline as failed with the failure reason now, whatever
// its state (a succeeded pipeline can be failed too, as a retried job could).
func (s *Sim) FailPipeline(project string, pipelineID int64, reason string) error {
	return s.finishByID(project, pipelineID, "failed", reason)
}

// SucceedPipeline finishes a pipeline as succeeded now.
func (s *Sim) SucceedPipeline(project string, pipelineID int64) error {
	return s.finishByID(project, pipelineID, "success", "")
}

// FailMRPipeline fails the head pipeline of an MR.
func (s *Sim) FailMRPipeline(project string, iid int64, reason string) error {
	id, err := s.headPipelineID(project, iid)
	if err != nil {
		return err
	}
	return s.FailPipeline(project, id, reason)
}

// SucceedMRPipeline succeeds the head pipeline of an MR.
func (s *Sim) SucceedMRPipeline(project string, iid int64) error {
	id, err := s.headPipelineID(project, iid)
	if err != nil {
		return err
	}
	return s.SucceedPipeline(project, id)
}

func (s *Sim) headPipelineID(project string, iid int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, m, err := s.mrLocked(project, iid)
	if err != nil {
		return 0, err
	}
	pl := s.headPipeline(p, m)
	if pl == nil {
		return 0, ErrNotFound
	}
	return pl.id, nil
}

func (s *Sim) finishByID(project string, pipelineID int64, status, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return ErrNotFound
	}
	for _, pl := range p.pipelines {
		if pl.id == pipelineID {
			if reason == "" && status == "failed" {
				reason = s.opts.FailureReason
			}
			s.finishPipeline(p, pl, status, reason)
			return nil
		}
	}
	return ErrNotFound
}

// AddPoison adds a poison rule to a project (see PoisonRule).
func (s *Sim) AddPoison(project string, rule PoisonRule) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return ErrNotFound
	}
	if rule.FailureReason == "" {
		rule.FailureReason = s.opts.FailureReason
	}
	p.poison = append(p.poison, rule)
	return nil
}

// ClearPoison removes a project's poison rules.
func (s *Sim) ClearPoison(project string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.projectLocked(project); p != nil {
		p.poison = nil
	}
}

// SetPipelineOptions changes pipeline duration, failure rate and manual mode for
// pipelines created from now on.
func (s *Sim) SetPipelineOptions(duration time.Duration, failureRate float64, manual bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.PipelineDuration = duration
	s.opts.FailureRate = failureRate
	s.opts.ManualPipelines = manual
}

// PushToDefault commits directly on the default branch, as a human with push rights
// would (content nil deletes the path). It returns the new head sha.
func (s *Sim) PushToDefault(project string, files map[string]*string, message string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return "", ErrNotFound
	}
	head := p.branches[p.defaultBranch]
	next := maps.Clone(s.commits[head].files)
	for path, content := range files {
		if content == nil {
			delete(next, path)
		} else {
			next[path] = *content
		}
	}
	if message == "" {
		message = "Direct push"
	}
	c := s.newCommit([]string{head}, message, next)
	p.branches[p.defaultBranch] = c.sha
	s.recheckBranch(p, p.defaultBranch)
	return c.sha, nil
}

// SetMergeMethod changes a project's merge method (merge, ff, rebase_merge).
func (s *Sim) SetMergeMethod(project, method string) error {
	switch method {
	case MergeMethodMerge, MergeMethodFastForward, MergeMethodRebaseMerge:
	default:
		return errors.New("gitlabsim: unknown merge method " + method)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return ErrNotFound
	}
	p.mergeMethod = method
	return nil
}

// Version is the GitLab version the simulator speaks.
func (s *Sim) Version() string { return s.opts.Version }

// Calls returns every API call answered so far.
func (s *Sim) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// CallCount counts API calls by "METHOD /route" (e.g. "POST
// /projects/:id/merge_requests"); an empty route counts every call.
func (s *Sim) CallCount(route string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.calls {
		if route == "" || c.Method+" "+c.Route == route {
			n++
		}
	}
	return n
}

// ResetCalls forgets the recorded calls.
func (s *Sim) ResetCalls() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = nil
}

// State is the dump of the whole simulator.
type State struct {
	Projects map[string]ProjectState `json:"projects"`
	Calls    map[string]int          `json:"calls"`
	Faults   []FaultState            `json:"faults"`
}

// ProjectState is one project in a State dump.
type ProjectState struct {
	ID            int64                `json:"id"`
	DefaultBranch string               `json:"default_branch"`
	Files         map[string]string    `json:"files"`
	Branches      map[string]string    `json:"branches"`
	MergeRequests map[string][]MRState `json:"merge_requests"`
	Commits       int                  `json:"commits"`
	Pipelines     int                  `json:"pipelines"`
}

// Dump returns the whole state.
func (s *Sim) Dump() State {
	s.mu.Lock()
	ids := make([]int64, 0, len(s.projects))
	for id := range s.projects {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	st := State{Projects: map[string]ProjectState{}, Calls: map[string]int{}}
	for _, id := range ids {
		p := s.projects[id]
		ps := ProjectState{
			ID: p.id, DefaultBranch: p.defaultBranch,
			Files:         maps.Clone(s.commits[p.branches[p.defaultBranch]].files),
			Branches:      maps.Clone(p.branches),
			MergeRequests: map[string][]MRState{},
			Pipelines:     len(p.pipelines),
		}
		seen := map[string]bool{}
		for _, sha := range p.branches {
			for a := range s.ancestors(sha) {
				seen[a] = true
			}
		}
		ps.Commits = len(seen)
		for _, m := range p.mrs {
			ps.MergeRequests[m.source] = append(ps.MergeRequests[m.source], s.mrStateLocked(p, m))
		}
		st.Projects[p.path] = ps
	}
	for _, c := range s.calls {
		st.Calls[c.Method+" "+c.Route]++
	}
	for _, f := range s.faults {
		st.Faults = append(st.Faults, f.state())
	}
	s.mu.Unlock()
	return st
}

func itoa(n int64) string {
	const digits = "0123456789"
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = digits[n%10]
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
