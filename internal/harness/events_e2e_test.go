package harness_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

// TestEventsSurviveKill9 runs three `batcherd serve` processes with an event receiver
// (a real HTTP server here, verifying the signature). Operations merge while the
// receiver is down; then it comes back (slow) and replicas are killed with SIGKILL over
// and over while they deliver — kills land mid-POST — restarting each. At the end every event the database holds reached the receiver,
// each operation's queued before its merged, each batch's opened before its
// succeeded: a crash delays an event, it never loses one or reorders an operation's.
func TestEventsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts real processes and a database (skipped under -short)")
	}
	const secret = "e2e-events-secret"
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		order   = map[string][]string{} // operation or batch → types in arrival order (first acceptance)
		refused int
		down    = true
	)
	var inFlight atomic.Int32
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		inFlight.Add(1)
		time.Sleep(150 * time.Millisecond) // slow: the SIGKILLs land while POSTs are in flight
		inFlight.Add(-1)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write(body)
		mu.Lock()
		defer mu.Unlock()
		if down {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if !hmac.Equal([]byte("sha256="+hex.EncodeToString(m.Sum(nil))), []byte(r.Header.Get("X-Batcherd-Signature"))) {
			refused++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var ev struct {
			ID        string `json:"id"`
			Type      string `json:"type"`
			Operation *struct {
				ID string `json:"id"`
			} `json:"operation"`
			Batch *struct {
				ID int64 `json:"id"`
			} `json:"batch"`
		}
		if err := json.Unmarshal(body, &ev); err != nil || ev.ID != r.Header.Get("X-Batcherd-Delivery") {
			t.Errorf("bad event %s: %v", body, err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		key := ""
		if ev.Operation != nil {
			key = ev.Operation.ID
		} else if ev.Batch != nil {
			key = fmt.Sprint("batch:", ev.Batch.ID)
		}
		seen[ev.ID]++
		if seen[ev.ID] == 1 {
			order[key] = append(order[key], ev.Type)
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer recv.Close()

	repos := []string{"ev/alpha", "ev/beta"}
	c := harness.StartT(t, harness.Options{
		Replicas:          3,
		Repos:             repos,
		DBPrefix:          "bt_events",
		Race:              raceEnabled,
		PipelineDuration:  500 * time.Millisecond,
		ClaimSchedule:     "@every 1s",
		ReconcileInterval: 300 * time.Millisecond,
		AutoApprove:       true,
		StopGrace:         5 * time.Second,
		Env: map[string]string{
			"BATCHERD_EVENTS_URL":     recv.URL + "/hook",
			"BATCHERD_EVENTS_SECRET":  secret,
			"BATCHERD_EVENTS_TIMEOUT": "1s", // lease 3 s: a killed replica's events go out again soon
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	api := c.Client()

	// Phase 1, no crash: the receiver is down (503) while 40 operations are applied and
	// merge, so their events wait in the outbox. (Kills during a publish would stall
	// the batch for the publish lease; delivery is what this test is about.)
	var ids []string
	for i := range 40 {
		op, _, err := api.Submit(ctx, harness.OperationRequest{Subject: fmt.Sprintf("ev-%02d", i), Target: "db/main",
			Action: "grant", Repo: repos[i%2]}, fmt.Sprintf("ev-key-%02d", i))
		if err != nil {
			t.Fatalf("submit %d: %v", i, err)
		}
		ids = append(ids, op.ID)
	}
	for {
		ops, err := harness.GetOperations(ctx, api, ids)
		merged := 0
		for _, op := range ops {
			if op.Status == "merged" {
				merged++
			} else if op.Status == "failed" || op.Status == "rejected" {
				t.Fatalf("operation %s is %s", op.ID, op.Status)
			}
		}
		if err == nil && merged == len(ids) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d merged before the deadline", merged, len(ids))
		}
		time.Sleep(300 * time.Millisecond)
	}
	mu.Lock()
	if len(seen) != 0 {
		t.Fatalf("the receiver was down and accepted %d events", len(seen))
	}
	down = false
	mu.Unlock()

	// Phase 2: the receiver is up (and slow). Up to three times, the moment a POST is
	// in flight, every replica is killed with SIGKILL, then all are restarted.
	stopKilling := make(chan struct{})
	killerDone := make(chan int)
	go func() {
		kills := 0
		defer func() { killerDone <- kills }()
		for kills < 3 {
			for inFlight.Load() == 0 {
				select {
				case <-stopKilling:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
			for _, r := range c.Replicas {
				if err := r.Kill(); err != nil {
					t.Errorf("kill %s: %v", r.ID, err)
					return
				}
			}
			kills++
			for _, r := range c.Replicas {
				if err := r.Restart(ctx); err != nil {
					t.Errorf("restart %s: %v", r.ID, err)
					return
				}
			}
		}
	}()
	defer func() {
		select {
		case <-stopKilling:
		default:
			close(stopKilling)
		}
	}()

	db, err := c.DB()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var total int
	for {
		var undelivered int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(DISTINCT event_id), COALESCE(SUM(delivered_at IS NULL), 0) FROM event_outbox").Scan(&total, &undelivered); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := len(seen)
		mu.Unlock()
		if undelivered == 0 && got == total {
			close(stopKilling)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d of %d events received, %d undelivered rows", got, total, undelivered)
		}
		time.Sleep(200 * time.Millisecond)
	}
	kills := <-killerDone
	if kills == 0 {
		t.Fatal("everything was delivered before a POST was in flight to kill: the crash was not exercised")
	}
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d round(s) of kill -9 mid-POST; %d events delivered, %d of them more than once (at least once), %d refused", kills, total, dups, refused)
	if refused != 0 {
		t.Fatalf("%d signatures did not verify", refused)
	}
	batches := 0
	for k, types := range order {
		got := strings.Join(types, ",")
		if strings.HasPrefix(k, "batch:") {
			batches++
			if got != "batch.opened,batch.succeeded" {
				t.Errorf("%s: %s", k, got)
			}
		}
	}
	for _, id := range ids {
		if got := strings.Join(order[id], ","); got != "operation.queued,operation.merged" {
			t.Errorf("operation %s: events %s", id, got)
		}
	}
	if batches == 0 {
		t.Fatal("no batch event received")
	}
}
