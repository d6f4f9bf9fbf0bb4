package scanner

import (
	"context"
	"log/slog"
	"slices"

	"github.com/batcherd/batcherd/internal/store"
)

// claimConfig is the claim loop's slice of Config.
type claimConfig struct {
	repos    []string
	schedule string // robfig/cron spec; Run parses it
	maxBatch int
}

// claimLoop turns each repository's waiting operations into a batch, on the cron
// schedule and on RunRound. Both paths run claimRepo: at most one batch per repository
// is guaranteed by the store's unique slot, not by who calls, so a manual round and a
// scheduled one at the same instant make one batch.
type claimLoop struct {
	s   *Scanner
	cfg claimConfig
	log *slog.Logger
}

// runOnce runs one round over every configured repository.
func (l *claimLoop) runOnce(ctx context.Context) error {
	started, failed := 0, 0
	for _, repo := range l.cfg.repos {
		if ctx.Err() != nil || l.s.stopping() {
			break
		}
		started++
		if _, err := l.claimRepo(ctx, repo); err != nil {
			failed++
		}
	}
	return passResult(started, failed)
}

// claimRepo is one claim attempt for one repository. Every outcome (claimed,
// slot_occupied, nothing_to_claim, preempted, paused) is normal; only a store failure
// is an error.
func (l *claimLoop) claimRepo(ctx context.Context, repo string) (store.ClaimResult, error) {
	log := l.log.With("repo", repo)
	// BatchClaim begins with the lock-free precheck (anything waiting? slot held by a
	// committed batch? paused?): most rounds of most repositories have nothing waiting
	// and must not touch the slot, and a round whose slot a committed batch holds is
	// answered at once. On MariaDB the precheck and the slot attempt are one round trip,
	// so a losing round costs one (docs/ARCHITECTURE.md, "The loops"). Neither answer is
	// a decision: the slot's unique key decides every claim that gets past it (I1).
	res, err := l.s.st.BatchClaim(ctx, repo, l.cfg.maxBatch)
	if isLost(err) {
		// A deadlock or lock-wait victim while racing for the slot (docs/ARCHITECTURE.md, "Database facts") means
		// someone else holds or takes it: occupied, try next round.
		res, err = store.ClaimResult{Outcome: store.ClaimSlotOccupied}, nil
	}
	if err != nil {
		return store.ClaimResult{}, l.s.itemErr("claim", log, "claim failed", err)
	}
	l.s.m.outcomes.WithLabelValues("claim", string(res.Outcome)).Inc()
	if res.Outcome != store.ClaimClaimed {
		log.Debug("claim round", "outcome", res.Outcome)
		return res, nil
	}
	l.s.m.batchSize.Observe(float64(len(res.OperationIDs)))
	log.Info("claimed batch", "batch_id", res.BatchID, "size", len(res.OperationIDs),
		"kind", res.Kind, "group", res.Group, "depth", res.Depth)
	l.s.step(ctx, "claim.claimed", res.BatchID)
	// Publish now rather than at the next publish tick.
	kick(l.s.kickPublish)
	return res, nil
}

// followUp claims the next round of repo at once when its first waiting rows are a
// failed batch's retry or bisection half, or urgent, instead of waiting for the
// schedule: the replica that settled a batch calls it. An urgent operation that met a
// held slot (urgent work never preempts a running batch) is thus claimed as soon as
// that batch settles. The ordinary queue keeps its schedule.
// Outcomes are logged, never returned: the scheduled round is the backstop.
func (s *Scanner) followUp(ctx context.Context, repo string) {
	if s.stopping() || ctx.Err() != nil {
		return
	}
	log := s.claim.log.With("repo", repo)
	res, err := s.st.BatchClaimFollowUp(ctx, repo, s.cfg.MaxBatchSize)
	switch {
	case err != nil:
		if !isLost(err) && !isCanceled(err) {
			log.Warn("follow-up claim failed; the scheduled round will take it", "err", err)
		}
		return
	case res.Outcome != store.ClaimClaimed:
		log.Debug("follow-up claim", "outcome", res.Outcome)
		return
	}
	s.m.outcomes.WithLabelValues("claim", "follow_up").Inc()
	s.m.batchSize.Observe(float64(len(res.OperationIDs)))
	log.Info("claimed follow-up batch", "batch_id", res.BatchID, "size", len(res.OperationIDs),
		"kind", res.Kind, "group", res.Group, "depth", res.Depth)
	s.step(ctx, "claim.claimed", res.BatchID)
	kick(s.kickPublish)
}

// RunRound runs a claim round now for repo, through the same code as the scheduled
// round (the admin API's POST /v1/admin/rounds). repo "" means every configured
// repository: the result is the first claimed batch, else slot_occupied if any
// repository's slot was taken, else paused if any repository is paused, else
// nothing_to_claim (preempted is reported as slot_occupied). ErrUnknownRepo for a repository that is not configured.
func (s *Scanner) RunRound(ctx context.Context, repo string) (store.ClaimResult, error) {
	if repo != "" {
		if !slices.Contains(s.cfg.Repos, repo) {
			return store.ClaimResult{}, ErrUnknownRepo
		}
		return apiOutcome(s.claim.claimRepo(ctx, repo))
	}
	best := store.ClaimResult{Outcome: store.ClaimNothingToClaim}
	for _, r := range s.cfg.Repos {
		res, err := apiOutcome(s.claim.claimRepo(ctx, r))
		if err != nil {
			return res, err
		}
		switch {
		case res.Outcome == store.ClaimClaimed && best.Outcome != store.ClaimClaimed:
			best = res
		case res.Outcome == store.ClaimSlotOccupied && (best.Outcome == store.ClaimNothingToClaim || best.Outcome == store.ClaimPaused):
			best = res
		case res.Outcome == store.ClaimPaused && best.Outcome == store.ClaimNothingToClaim:
			best = res
		}
	}
	return best, nil
}

// apiOutcome maps preempted (another transaction took some of the rows between our
// read and our claim) to slot_occupied for RunRound's callers: the admin API promises
// claimed, slot_occupied or nothing_to_claim, and both mean "someone else is claiming
// this repository right now".
func apiOutcome(res store.ClaimResult, err error) (store.ClaimResult, error) {
	if err == nil && res.Outcome == store.ClaimPreempted {
		res.Outcome = store.ClaimSlotOccupied
	}
	return res, err
}
