package scanner

import (
	"context"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

// A publish that meets a transient GitLab error holds its batch only for a short
// backoff (or GitLab's Retry-After), not for the whole publish lease; a permanent error
// keeps the lease. Once GitLab answers again, the batch publishes and merges.
func TestPublishErrorHold(t *testing.T) {
	const lease = 30 * time.Second
	cases := []struct {
		name     string
		fault    gitlabsim.Fault
		min, max time.Duration // the hold the batch is left with, by the database clock
	}{
		{"502 holds for the short backoff", gitlabsim.Fault{Status: 502}, 0, publishRetry},
		{"dropped connection holds for the short backoff", gitlabsim.Fault{Drop: true}, 0, publishRetry},
		{"429 with a long Retry-After holds for it", gitlabsim.Fault{Status: 429, Headers: map[string]string{"Retry-After": "20"}},
			15 * time.Second, 20 * time.Second},
		{"403 keeps the publish lease", gitlabsim.Fault{Status: 403}, lease - 5*time.Second, lease},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, gitlabsim.Options{PipelineDuration: 50 * time.Millisecond}, repo)
			ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
			s := e.scanner("a", func(c *Config) { c.PublishLease = lease })
			bg := context.Background()
			res, err := s.RunRound(bg, repo)
			if err != nil || res.Outcome != store.ClaimClaimed {
				t.Fatalf("round: %+v %v", res, err)
			}
			f := c.fault
			f.Method, f.Route = "POST", "/projects/:id/repository/commits"
			e.sim.InjectFault(f)
			if err := s.publish.runOnce(bg); err == nil {
				t.Fatal("publish with GitLab refusing the commit reported no error")
			}
			var hold time.Duration
			var us int64
			if err := e.st.DB().GetContext(bg, &us,
				"SELECT TIMESTAMPDIFF(MICROSECOND, CURRENT_TIMESTAMP(6), next_check_at) FROM merge_batch WHERE id = ?", res.BatchID); err != nil {
				t.Fatal(err)
			}
			hold = time.Duration(us) * time.Microsecond
			if hold < c.min || hold > c.max {
				t.Fatalf("batch held for %v after the failed publish, want between %v and %v", hold, c.min, c.max)
			}
			if c.max > publishRetry {
				return // the long holds are what this case checks; waiting them out adds nothing
			}
			e.sim.ClearFaults()
			b := e.drive(s, res.BatchID, 15*time.Second)
			if b.Status != domain.BatchSucceeded {
				t.Fatalf("batch %s (%s: %s), want succeeded once GitLab answers", b.Status, b.ErrorCode, b.ErrorMessage)
			}
			e.requireOps(ids, domain.OpMerged)
			made := 0 // the faults here answer before doing the work: count the commits answered 201
			for _, call := range e.sim.Calls() {
				if call.Method == "POST" && call.Route == f.Route && call.Status == 201 {
					made++
				}
			}
			if made != 1 {
				t.Errorf("%d commits made, want 1", made)
			}
		})
	}
}
