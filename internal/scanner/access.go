package scanner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// access follows what GitLab answers for each repository (README, "Start-up
// preflight and GitLab refusals"). A 401 or 403 — or a 404 for the project itself — is not the
// batch's fault: the token was revoked or lost its access, and an operator is about to
// fix it. Work for the repository is then held, never failed for it: the loops leave
// its batches alone except for one probe after a capped exponential backoff, the batch
// timeout does not run (store.qBatchesTimedOut reads the state from repo_state), and
// the first call GitLab answers again puts everything back in motion by itself.
//
// The state is written to repo_state on every change, so GET /v1/repos answers the same
// on every replica, and exported as batcherd_repository_gitlab_state{repo,state}.
type access struct {
	st    accessStore
	log   *slog.Logger
	gauge *prometheus.GaugeVec
	base  time.Duration
	max   time.Duration
	now   func() time.Time

	mu    sync.Mutex
	repos map[string]*repoAccess
	// writeMu serialises the repo_state writes (persist).
	writeMu sync.Mutex
}

type repoAccess struct {
	state     string
	detail    string
	written   bool
	refusals  int
	nextProbe time.Time
}

// accessStore is what access writes.
type accessStore interface {
	RepoGitLabStateSet(ctx context.Context, repo, state, detail string) error
}

func newAccess(st accessStore, log *slog.Logger, gauge *prometheus.GaugeVec, base, max time.Duration) *access {
	return &access{st: st, log: log.With("component", "gitlab_access"), gauge: gauge, base: base, max: max,
		now: time.Now, repos: map[string]*repoAccess{}}
}

// observe records what a call about repo answered (op names the call for the log).
func (a *access) observe(repo, op string, err error) {
	if a == nil || repo == "" || op == "delete_branch" {
		// Deleting a spent branch is best effort; a 403 there (a protected branch) says
		// nothing about the token's access to the repository.
		return
	}
	state := mr.AccessOf(err)
	if state == "" {
		return
	}
	a.mu.Lock()
	r := a.repos[repo]
	if r == nil {
		r = &repoAccess{}
		a.repos[repo] = r
	}
	if r.state != state {
		r.written = false
	}
	changed := !r.written
	r.state = state
	if store.GitLabRefusal(state) {
		r.refusals++
		wait := a.base << min(r.refusals-1, 16)
		if wait > a.max || wait <= 0 {
			wait = a.max
		}
		r.nextProbe = a.now().Add(wait)
	} else {
		r.refusals = 0
		r.nextProbe = time.Time{}
	}
	a.mu.Unlock()
	if !changed {
		return
	}
	for _, s := range store.GitLabStates {
		v := 0.0
		if s == state {
			v = 1
		}
		a.gauge.WithLabelValues(repo, s).Set(v)
	}
	detail := ""
	if err != nil {
		detail = err.Error()
	}
	log := a.log.With("repo", repo, "gitlab", state, "op", op)
	switch {
	case store.GitLabRefusal(state):
		log.Error("GitLab refuses batcherd this repository: its work is held (nothing fails for it) and retried with backoff until the token or its access is fixed (BATCHERD_GITLAB_TOKEN)", "err", detail)
	case state == mr.AccessUnreachable:
		log.Warn("GitLab does not answer for this repository", "err", detail)
	default:
		log.Info("GitLab answers for this repository again")
	}
	a.mu.Lock()
	r.detail = detail
	a.mu.Unlock()
	if store.GitLabRefusal(state) {
		// The timeout sweep reads the refusal from the database (it must not fail the
		// repository's batches for it): on record before the loops go on.
		a.persist(repo)
		return
	}
	// Other states only inform GET /v1/repos (and end a refusal, which the database
	// then forgets a moment later — the safe direction): written in the background, so
	// the first answer from a repository does not wait for a database write.
	go a.persist(repo)
}

// persist writes repo's current state to repo_state unless it is written already.
// Writes are serialised and each writes the state current when it runs, so a
// background write that runs late never puts back a state that has since changed. The
// write is bounded and outside any transaction; a failure leaves written false, and the
// next answer from the repository tries again.
func (a *access) persist(repo string) {
	a.writeMu.Lock()
	defer a.writeMu.Unlock()
	a.mu.Lock()
	r := a.repos[repo]
	if r == nil || r.written {
		a.mu.Unlock()
		return
	}
	state, detail := r.state, r.detail
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.st.RepoGitLabStateSet(ctx, repo, state, detail); err != nil {
		a.log.Warn("recording the repository's GitLab state failed", "repo", repo, "gitlab", state, "err", err)
		return
	}
	a.mu.Lock()
	if r.state == state {
		r.written = true
	}
	a.mu.Unlock()
}

// mayCall reports whether the loops may call GitLab for repo now: always, unless
// GitLab refuses it and the next probe is not due yet.
func (a *access) mayCall(repo string) bool {
	if a == nil {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.repos[repo]
	if r == nil || !store.GitLabRefusal(r.state) {
		return true
	}
	return !a.now().Before(r.nextProbe)
}

// held reports whether work for repo is held right now (for the loops' outcomes).
func (a *access) held(repo string) bool { return !a.mayCall(repo) }
