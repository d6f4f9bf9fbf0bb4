package scanner

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/batcherd/batcherd/internal/drift"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// EventMergeVerifyMiss is the audit event of a merged member whose change the target
// branch did not hold when read right after the merge.
const EventMergeVerifyMiss = "merge_verify_miss"

// maxDriftLogLines bounds the per-file lines one drift check logs.
const maxDriftLogLines = 20

// verifyMerged reads the target branch right after batch b merged and checks every
// member: a grant's file with its operation id, no file for a revoke. A miss is
// drift — reported (event, metric, log), never silently accepted, and never repaired
// here: the batch merged, and what to do is an operator's decision. GitLab trouble
// leaves the check to the drift loop.
func (s *Scanner) verifyMerged(ctx context.Context, b domain.Batch, log *slog.Logger) {
	members, err := s.st.BatchMembers(ctx, b.ID)
	if err != nil {
		log.Warn("post-merge check: reading the members failed; the drift loop will look", "err", err)
		return
	}
	ms := make([]drift.Member, 0, len(members))
	for _, op := range members {
		m := drift.Member{OperationID: op.OperationID, Subject: op.Subject, Target: op.Target, Grant: op.Action == domain.ActionGrant}
		if m.Grant {
			m.Content, _ = bindingFile(op)
		}
		ms = append(ms, m)
	}
	misses, err := drift.CheckMerged(ctx, s.gl, b.Repo, s.cfg.TargetBranch, ms)
	if err != nil {
		if !isCanceled(err) {
			log.Warn("post-merge check: reading the target branch failed; the drift loop will look", "err", err)
		}
		return
	}
	for _, f := range misses {
		s.m.mergeDrift.WithLabelValues(b.Repo, f.Kind).Inc()
		log.Error("post-merge check: the target branch does not hold a merged member's change (drift; see the README's runbook)",
			"path", f.Path, "kind", f.Kind, "detail", f.Detail)
		id := b.ID
		if _, err := s.st.EventRecord(ctx, store.Event{
			DedupeKey: fmt.Sprintf("merge-verify:%d:%s", b.ID, f.Path),
			BatchID:   &id,
			Code:      EventMergeVerifyMiss,
			Detail:    truncate(f.String(), 1024),
		}); err != nil {
			log.Warn("recording the post-merge miss failed", "err", err)
		}
	}
}

// driftConfig is the drift loop's slice of Config.
type driftConfig struct {
	interval time.Duration
	repos    []string
	target   string
}

// driftLoop compares each repository's bindings/ tree with the active bindings every
// interval (fetch → tryLock: one replica per repository per interval, through
// repo_state.drift_next_at) and records the result in the database, so every replica
// answers GET /v1/repos alike. Detection only.
type driftLoop struct {
	s   *Scanner
	cfg driftConfig
	log *slog.Logger
}

func (l *driftLoop) runOnce(ctx context.Context) error {
	started, failed := 0, 0
	for _, repo := range l.cfg.repos {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		if l.s.access.held(repo) {
			continue // GitLab refuses it: the other loops probe it
		}
		log := l.log.With("repo", repo)
		taken, err := l.s.st.RepoDriftReserve(ctx, repo, l.cfg.interval)
		if err != nil {
			started++
			failed++
			l.s.itemErr("drift", log, "reserving the drift check failed", err)
			continue
		}
		if !taken {
			continue // another replica checked it within the interval
		}
		l.s.m.outcomes.WithLabelValues("drift", "taken").Inc()
		started++
		if err := l.check(ctx, repo, log); err != nil {
			failed++
			l.s.itemErr("drift", log, "drift check failed", err)
		}
	}
	return passResult(started, failed)
}

func (l *driftLoop) check(ctx context.Context, repo string, log *slog.Logger) error {
	rep, err := drift.Check(ctx, l.s.gl, l.s.st, repo, l.cfg.target)
	if err != nil {
		return err
	}
	c := rep.Counts()
	if err := l.s.st.RepoDriftRecord(ctx, repo, c); err != nil {
		return err
	}
	l.s.m.drift.WithLabelValues(repo, drift.Unexpected).Set(float64(c.Unexpected))
	l.s.m.drift.WithLabelValues(repo, drift.Missing).Set(float64(c.Missing))
	l.s.m.drift.WithLabelValues(repo, drift.Modified).Set(float64(c.Modified))
	if len(rep.Files) == 0 {
		l.s.m.outcomes.WithLabelValues("drift", "clean").Inc()
		log.Debug("drift check: the repository holds what the database says")
		return nil
	}
	l.s.m.outcomes.WithLabelValues("drift", "drift").Inc()
	log.Error("drift: the repository's bindings/ tree differs from the active bindings (detection only; see the README's runbook)",
		"unexpected", c.Unexpected, "missing", c.Missing, "modified", c.Modified)
	for i, f := range rep.Files {
		if i == maxDriftLogLines {
			log.Warn("drift: more files differ; batcherd verify lists them all", "more", len(rep.Files)-i)
			break
		}
		log.Warn("drift", "path", f.Path, "kind", f.Kind, "detail", f.Detail)
	}
	return nil
}
