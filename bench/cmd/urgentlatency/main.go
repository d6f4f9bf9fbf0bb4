// Command urgentlatency measures how soon an urgent operation is claimed after its
// approval, through the HTTP API of two in-process replicas on the local MariaDB and
// the GitLab simulator (the figure README.md's queue-control section quotes):
//
//   - free slot: an urgent grant is approved on replica B while a normal waiting set
//     sits in the queue; the time from the approval's audit event to the urgent
//     operation's claim (its member row), both by the database clock, and the
//     approval call as the client sees it;
//   - slot held: the urgent grant is approved while a batch runs; the time from that
//     batch's settlement to the urgent operation's claim (database clock).
//
// Usage: go run ./bench/cmd/urgentlatency [-n 50] [-held 20]
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/sethvargo/go-envconfig"

	"github.com/batcherd/batcherd/bench"
	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/logging"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/scanner"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

const (
	repo       = "bench/urgent"
	apiToken   = "bench-api-token"
	approver   = "bench-approver-token" // four eyes: another principal approves
	adminToken = "bench-admin-token"
)

func main() {
	n := flag.Int("n", 50, "trials with the slot free")
	held := flag.Int("held", 20, "trials with the slot held by a running batch")
	waiting := flag.Int("waiting", 2000, "normal operations waiting behind the urgent ones")
	flag.Parse()
	if err := run(*n, *held, *waiting); err != nil {
		fmt.Fprintln(os.Stderr, "urgentlatency:", err)
		os.Exit(1)
	}
}

func run(n, held, waiting int) error {
	ctx := context.Background()
	d, err := bench.NewDB(ctx, "urgent")
	if err != nil {
		return err
	}
	defer d.Close()
	sim := gitlabsim.New(gitlabsim.Options{Projects: []string{repo}, PipelineDuration: 300 * time.Millisecond})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		return err
	}
	defer sim.Close()
	var bases []string
	for range 2 {
		cfg, err := config.Load(ctx, envconfig.MapLookuper(map[string]string{
			"BATCHERD_MYSQL_DSN": d.DSN, "BATCHERD_GITLAB_URL": sim.URL(), "BATCHERD_GITLAB_TOKEN": "sim-token",
			"BATCHERD_REPOS": repo, "BATCHERD_HTTP_ADDR": "127.0.0.1:0",
			"BATCHERD_API_TOKENS": "requester=" + apiToken + ",approver=" + approver, "BATCHERD_ADMIN_TOKENS": "oncall=" + adminToken,
			"BATCHERD_AUTO_APPROVE": "false", "BATCHERD_CLAIM_SCHEDULE": "@every 1h",
			"BATCHERD_RECONCILE_INTERVAL": "100ms", "BATCHERD_MAX_BATCH_SIZE": "20",
		}))
		if err != nil {
			return err
		}
		if err := cfg.Validate(config.Need{DB: true, GitLab: true, Serve: true}); err != nil {
			return err
		}
		log, err := logging.New(os.Stderr, "text", os.Getenv("URGENT_LOG_LEVEL"))
		if err != nil {
			return err
		}
		a, err := app.New(ctx, cfg, app.Env{Log: log, Stdout: io.Discard, Version: "bench",
			TuneScanner: func(c *scanner.Config) {
				c.PublishInterval = 100 * time.Millisecond
				c.StartJitter = 10 * time.Millisecond
			}})
		if err != nil {
			return err
		}
		rctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go a.Run(rctx)
		bases = append(bases, "http://"+a.Addr())
	}
	st, err := d.Open(ctx, 8)
	if err != nil {
		return err
	}
	defer st.Close()
	// The normal waiting set: it stays behind the urgent operations (each urgent round
	// fills its batch with the oldest of them, so it shrinks by 19 a trial).
	for i := range waiting {
		if _, _, err := st.OperationCreate(ctx, store.OperationCreateParams{OperationID: uuid.NewString(),
			Subject: fmt.Sprintf("normal-%d", i), Target: "db", Repo: repo, Action: domain.ActionGrant, AutoApprove: true}); err != nil {
			return err
		}
	}

	var claimLag, approveCall, heldLag []time.Duration
	freed := 0
	for i := range n {
		id, err := create(bases[0], fmt.Sprintf("urgent-%d", i))
		if err != nil {
			return err
		}
		start := time.Now()
		op, err := post(bases[1], "/v1/operations/"+id+"/approve")
		approveCall = append(approveCall, time.Since(start))
		if err != nil {
			return err
		}
		if op.Status != "in_batch" {
			return fmt.Errorf("trial %d: urgent approval answered %s, want in_batch (slot free)", i, op.Status)
		}
		var lag float64
		if err := st.DB().GetContext(ctx, &lag, `SELECT TIMESTAMPDIFF(MICROSECOND, e.created_at, m.created_at)
			FROM audit_event e JOIN merge_batch_member m ON m.operation_id = e.operation_id
			WHERE e.operation_id = ? AND e.code = 'approved'`, id); err != nil {
			return err
		}
		claimLag = append(claimLag, time.Duration(lag)*time.Microsecond)
		if err := waitSettled(ctx, st, *op.BatchID); err != nil {
			return err
		}
	}
	for i := range held {
		// A normal batch runs (a pipeline of 300ms) when the urgent approval arrives.
		nid, err := create(bases[0], fmt.Sprintf("held-normal-%d", i))
		if err != nil {
			return err
		}
		if _, err := post(bases[0], "/v1/operations/"+nid+"/approve"); err != nil {
			return err
		}
		if err := round(bases[0]); err != nil {
			return err
		}
		id, err := create(bases[1], fmt.Sprintf("held-urgent-%d", i))
		if err != nil {
			return err
		}
		op, err := post(bases[1], "/v1/operations/"+id+"/approve")
		if err != nil {
			return err
		}
		if op.Status != "queued" {
			// The running batch settled before the approval arrived (a loaded machine):
			// not a held-slot trial. Counted, left out of the figure.
			freed++
			if op.BatchID != nil {
				if err := waitSettled(ctx, st, *op.BatchID); err != nil {
					return err
				}
			}
			continue
		}
		var lag float64
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := st.DB().GetContext(ctx, &lag, `SELECT TIMESTAMPDIFF(MICROSECOND, prev.finished_at, m.created_at)
				FROM merge_batch_member m JOIN merge_batch b ON b.id = m.batch_id
				JOIN merge_batch prev ON prev.repo = b.repo AND prev.id = (SELECT MAX(id) FROM merge_batch p WHERE p.repo = b.repo AND p.id < b.id AND p.status = 2)
				WHERE m.operation_id = ?`, id)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("held trial %d: urgent operation not claimed within 30s: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		heldLag = append(heldLag, time.Duration(lag)*time.Microsecond)
		var bid int64
		if err := st.DB().GetContext(ctx, &bid, "SELECT batch_id FROM merge_batch_member WHERE operation_id = ?", id); err != nil {
			return err
		}
		if err := waitSettled(ctx, st, bid); err != nil {
			return err
		}
	}
	show := func(name string, d []time.Duration) {
		s := bench.Summarize(d) // sorts d
		p95 := time.Duration(0)
		if len(d) > 0 {
			p95 = d[max(0, int(0.95*float64(len(d))+0.5)-1)] // nearest rank, as Summarize
		}
		fmt.Printf("%-62s n=%-3d p50=%-9s p90=%-9s p95=%-9s max=%s\n", name, s.N, ms(s.P50), ms(s.P90), ms(p95), ms(s.Max))
	}
	fmt.Printf("urgent lane, 2 replicas in one process, MariaDB on 127.0.0.1, batch size 20, %d normal operations waiting\n", waiting)
	show("slot free: approval event → claim (DB clock)", claimLag)
	show("slot free: approve call, client side (claim included)", approveCall)
	show("slot held: running batch settled → urgent claimed (DB clock)", heldLag)
	if freed > 0 {
		fmt.Printf("(%d held-slot trials left out: the running batch had settled before the urgent approval arrived)\n", freed)
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

type opObj struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	BatchID *int64 `json:"batch_id"`
}

func do(method, url, token string, body any) (opObj, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return opObj{}, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return opObj{}, fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	var env struct {
		Operation opObj `json:"operation"`
	}
	_ = json.Unmarshal(raw, &env)
	return env.Operation, nil
}

func create(base, subject string) (string, error) {
	op, err := do("POST", base+"/v1/operations", apiToken, map[string]any{"subject": subject, "target": "db", "action": "grant", "priority": urgentOf(subject)})
	return op.ID, err
}

func urgentOf(subject string) string {
	if strings.Contains(subject, "normal") {
		return "normal"
	}
	return "urgent"
}

func post(base, path string) (opObj, error) { return do("POST", base+path, approver, nil) }

func round(base string) error {
	_, err := do("POST", base+"/v1/admin/rounds", adminToken, map[string]any{"repo": repo})
	return err
}

// waitSettled waits until batch id is no longer active.
func waitSettled(ctx context.Context, st *store.Store, id int64) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := st.BatchGet(ctx, id)
		if err != nil {
			return err
		}
		if !b.Status.Active() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("batch %d still %s after 30s", id, b.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
