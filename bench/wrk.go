package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
)

// WrkAvailable reports whether wrk (Debian package wrk) is installed.
func WrkAvailable() bool { _, err := exec.LookPath("wrk"); return err == nil }

// wrkScript makes every request a new admission, as APIClient.Admit does: a fresh
// subject and Idempotency-Key per request (thread id and counter after a run prefix),
// and prints one machine-readable line at the end.
const wrkScript = `
local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end
function init(args)
  prefix = args[1] .. "-" .. tid .. "-"
  n = 0
end
function request()
  n = n + 1
  local s = prefix .. n
  return wrk.format("POST", "/v1/operations",
    {["Authorization"] = "Bearer TOKEN", ["Content-Type"] = "application/json", ["Idempotency-Key"] = "k-" .. s},
    '{"subject":"' .. s .. '","target":"db/bench","action":"grant","repo":"REPO"}')
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d status=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect, e.read, e.write, e.timeout))
end
`

var wrkResult = regexp.MustCompile(`RESULT requests=(\d+) duration_us=(\d+) p50_us=(\d+) p99_us=(\d+) status=(\d+) connect=(\d+) read=(\d+) write=(\d+) timeout=(\d+)`)

// APIAdmissionWrk measures POST /v1/operations (group commit) driven by wrk, a C load
// generator in a process of its own — for the API what mariadb-slap is for the raw
// ceiling: a client that leaves more of the shared CPUs to the server side than the
// in-process Go client of APIAdmission. clients connections on 1 or 2 wrk threads,
// keep-alive, closed loop. Any non-2xx answer or socket error fails the measurement,
// and every admission answered must be in the database.
func APIAdmissionWrk(ctx context.Context, st *store.Store, clients int, dur time.Duration) (Result, error) {
	const repo = "bench/api"
	st.SetAdmitOptions(AdmitGrouped.Options(clients))
	srv, err := NewAPIServer(st, repo)
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()
	f, err := os.CreateTemp("", "batcherd-wrk-*.lua")
	if err != nil {
		return Result{}, err
	}
	defer os.Remove(f.Name())
	script := strings.NewReplacer("TOKEN", srv.Token, "REPO", repo).Replace(wrkScript)
	if _, err := f.WriteString(script); err != nil {
		f.Close()
		return Result{}, err
	}
	f.Close()

	run := "wrk-" + uuid.NewString()[:8]
	var before int64
	if err := st.DB().GetContext(ctx, &before, "SELECT COUNT(*) FROM operation WHERE repo = ?", repo); err != nil {
		return Result{}, err
	}
	threads := min(clients, 2)
	before1 := st.AdmitStats()
	self0, srv0 := cpuClock().Now()
	out, err := exec.CommandContext(ctx, "wrk", "-t", strconv.Itoa(threads), "-c", strconv.Itoa(clients),
		"-d", fmt.Sprintf("%ds", max(1, int(dur.Round(time.Second).Seconds()))), "-s", f.Name(), srv.URL, "--", run).CombinedOutput()
	self1, srv1 := cpuClock().Now()
	if err != nil {
		return Result{}, fmt.Errorf("wrk: %v: %s", err, out)
	}
	m := wrkResult.FindSubmatch(out)
	if m == nil {
		return Result{}, fmt.Errorf("wrk: no RESULT line in its output: %s", out)
	}
	n := make([]int64, len(m)-1)
	for i := range n {
		n[i], _ = strconv.ParseInt(string(m[i+1]), 10, 64)
	}
	requests, durUS, p50, p99 := n[0], n[1], n[2], n[3]
	if bad := n[4] + n[5] + n[6] + n[7] + n[8]; bad > 0 || requests == 0 {
		return Result{}, fmt.Errorf("wrk: %d requests, errors status %d connect %d read %d write %d timeout %d", requests, n[4], n[5], n[6], n[7], n[8])
	}
	var after int64
	if err := st.DB().GetContext(ctx, &after, "SELECT COUNT(*) FROM operation WHERE repo = ?", repo); err != nil {
		return Result{}, err
	}
	// wrk counts the requests answered; one still in flight when it stopped may have
	// been admitted without being counted, never the other way round.
	if got := after - before; got < requests {
		return Result{}, fmt.Errorf("wrk counted %d admissions answered 201, the database holds %d", requests, got)
	}
	r := Result{Name: "HTTP API POST /v1/operations (grouped, wrk)", Clients: clients, Ops: requests,
		Elapsed: time.Duration(durUS) * time.Microsecond,
		Lat:     Summary{N: int(requests), P50: time.Duration(p50) * time.Microsecond, P99: time.Duration(p99) * time.Microsecond},
		SelfCPU: (self1 - self0) / time.Duration(requests), ServerCPU: (srv1 - srv0) / time.Duration(requests),
		Note: groupNote(before1, st.AdmitStats())}
	return r, nil
}
