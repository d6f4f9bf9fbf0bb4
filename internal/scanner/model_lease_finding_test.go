package scanner

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// Found by the protocol model (docs/MODEL.md, "Findings"): a publisher renews its
// reservation and is frozen past its lease; the timeout sweep of another replica fails
// the batch (no MR yet); the publisher wakes and opens the MR, and a human merges it at
// once. The publisher's record loses, lostRecord closes the MR, the close answers
// "merged", and merged wins settles the batch SUCCEEDED — but lostRecord handed
// mergedAfterFailed the batch with the MR set in memory only, so it skipped recording
// it: a SUCCEEDED batch with no MR recorded (what verify reports as a disagreement).
func TestLostRecordRecordsTheMRItSettlesMergedWith(t *testing.T) {
	e, ids, a, res := leaseFindingStart(t)
	bg := context.Background()
	paused, resume := make(chan struct{}), make(chan struct{})
	merged := int64(0)
	a.testHook = func(_ context.Context, step string, id int64) {
		switch step {
		case "publish.renewed":
			close(paused)
			<-resume
		case "publish.mr":
			// A human merges the MR the moment it exists.
			for _, m := range e.mrsOf(repo, id) {
				if m.State == "opened" {
					if err := e.sim.MergeMR(repo, m.IID); err != nil {
						t.Error(err)
					}
					merged = m.IID
				}
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.publish.runOnce(bg) }()
	<-paused

	sweeper := e.scanner("t", func(c *Config) { c.BatchTimeout = 10 * time.Millisecond })
	waitUntil(t, 10*time.Second, "the timeout sweep settles the batch", func() bool {
		_ = sweeper.timeout.runOnce(bg)
		b, _ := e.st.BatchGet(bg, res.BatchID)
		return !b.Status.Active()
	})
	if b, _ := e.st.BatchGet(bg, res.BatchID); b.Status != domain.BatchFailed || b.MRIID != nil {
		t.Fatalf("batch %s MR %v, want failed without an MR", b.Status, b.MRIID)
	}
	close(resume)
	<-done
	if merged == 0 {
		t.Fatal("the frozen publisher opened no MR")
	}
	b, _ := e.st.BatchGet(bg, res.BatchID)
	if b.Status != domain.BatchSucceeded || b.MRIID == nil || *b.MRIID != merged {
		t.Fatalf("batch %s MR %v, want succeeded naming !%d, the MR that merged", b.Status, b.MRIID, merged)
	}
	finishRetry(t, e, ids, res.BatchID)
}

// Found by the protocol model (docs/MODEL.md, "Findings"): a publisher's lease lapses
// inside EnsureMR, between its FindMR (no MR yet) and its create. Meanwhile another
// replica publishes the batch (MR 1, recorded), and the timeout sweep closes MR 1 and
// fails the batch. The create then opens MR 2 on the same branch (GitLab refuses a
// second MR only while one is open), the publisher dies before lostRecord, and a human
// merges MR 2. The failed-batch sweep re-read only the recorded MR 1 (closed), so
// merged wins never came: the batch FAILED for good with its files on the target
// branch. Now it also looks the branch up when the recorded MR did not merge.
func TestMergedWinsFindsASecondMROfTheBatch(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{ManualPipelines: true}, repo)
	ids := storetest.InsertQueuedOps(t, e.st, repo, 2)
	bg := context.Background()

	// Replica a's client holds its first MR create until the test lets it go.
	arrived, release := make(chan struct{}), make(chan struct{})
	hold := &holdCreate{next: http.DefaultTransport, arrived: arrived, release: release}
	glA, err := mr.New(mr.Config{
		BaseURL:      e.sim.URL(),
		Token:        e.sim.Token(),
		CallTimeout:  time.Minute,
		RetryWaitMin: 5 * time.Millisecond,
		RetryWaitMax: 50 * time.Millisecond,
		HTTPClient:   &http.Client{Transport: hold},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfgA := e.testConfig("a")
	cfgA.PublishLease = 100 * time.Millisecond
	a := New(cfgA, e.st, glA, testLogger(), prometheus.NewRegistry())
	res, err := a.RunRound(bg, repo)
	if err != nil || res.Outcome != store.ClaimClaimed {
		t.Fatalf("round: %+v %v", res, err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	a.testHook = func(_ context.Context, step string, _ int64) {
		if step == "publish.mr" {
			cancel() // killed right after opening its MR
		}
	}
	done := make(chan error, 1)
	go func() { done <- a.publish.runOnce(ctx) }()
	<-arrived // a found no MR and is creating one

	// a's lease lapses; replica b publishes the batch: MR 1, recorded and armed.
	b := e.scanner("b", nil)
	waitUntil(t, 10*time.Second, "replica b publishes the batch", func() bool {
		_ = b.publish.runOnce(bg)
		bt, _ := e.st.BatchGet(bg, res.BatchID)
		return bt.MRIID != nil
	})
	// The batch times out: the sweep closes MR 1 and fails the batch.
	sweeper := e.scanner("t", func(c *Config) { c.BatchTimeout = 10 * time.Millisecond })
	waitUntil(t, 10*time.Second, "the timeout sweep settles the batch", func() bool {
		_ = sweeper.timeout.runOnce(bg)
		bt, _ := e.st.BatchGet(bg, res.BatchID)
		return !bt.Status.Active()
	})
	bt, _ := e.st.BatchGet(bg, res.BatchID)
	if bt.Status != domain.BatchFailed || bt.MRIID == nil {
		t.Fatalf("batch %s MR %v, want failed with MR 1 recorded", bt.Status, bt.MRIID)
	}
	first := *bt.MRIID

	// a's create goes through now: MR 2; a dies before recording it.
	close(release)
	<-done
	var second int64
	for _, m := range e.mrsOf(repo, res.BatchID) {
		if m.IID != first && m.State == "opened" {
			second = m.IID
		}
	}
	if second == 0 {
		t.Fatalf("MRs of the batch: %+v, want a second, open one (the frozen publisher's)", e.mrsOf(repo, res.BatchID))
	}
	if err := e.sim.MergeMR(repo, second); err != nil {
		t.Fatal(err)
	}

	// The orphan sweep must let the repository win.
	for range 3 {
		if err := sweeper.orphans.runOnce(bg); err != nil {
			t.Fatalf("orphan pass: %v", err)
		}
	}
	bt, _ = e.st.BatchGet(bg, res.BatchID)
	if bt.Status != domain.BatchSucceeded {
		t.Fatalf("batch %s (%s), want succeeded: its MR !%d merged", bt.Status, bt.ErrorCode, second)
	}
	finishRetry(t, e, ids, res.BatchID)
}

// holdCreate holds the first MR create (POST …/merge_requests) until release is closed.
type holdCreate struct {
	next             http.RoundTripper
	arrived, release chan struct{}
	held             atomic.Bool
}

func (h *holdCreate) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/merge_requests") && h.held.CompareAndSwap(false, true) {
		close(h.arrived)
		select {
		case <-h.release:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return h.next.RoundTrip(r)
}

// finishRetry drives the retry round a timeout settle requeued the members into (if it
// did), and requires every member merged with its file on the target branch.
func finishRetry(t *testing.T, e *env, ids []string, failed int64) {
	t.Helper()
	bg := context.Background()
	c := e.scanner("c", nil)
	if op := e.ops(ids)[ids[0]]; op.BatchID != nil && *op.BatchID != failed {
		retry := *op.BatchID
		_ = c.publish.runOnce(bg)
		for _, m := range e.mrsOf(repo, retry) {
			if m.State == "opened" {
				if err := e.sim.SucceedMRPipeline(repo, m.IID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if b := e.drive(c, retry, 10*time.Second); b.Status != domain.BatchSucceeded {
			t.Fatalf("retry batch %d %s (%s), want succeeded", retry, b.Status, b.ErrorCode)
		}
	}
	e.requireFiles(repo, e.requireOps(ids, domain.OpMerged), true)
}
