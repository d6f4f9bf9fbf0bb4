package app_test

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/logging"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// A replica's log lines, every component's: no key twice on a line (the app and the
// scanner both add replica), durations as strings, and API requests logged with method,
// route, status, duration and principal — at info with BATCHERD_LOG_REQUESTS (probes
// excepted), and not at info without it.
func TestLogLines(t *testing.T) {
	_, dsn := storetest.New(t)
	sim := startSim(t, "g/p")

	run := func(logRequests bool) []map[string]any {
		cfg := testConfig(t, dsn, sim.URL(), "g/p")
		cfg.LogRequests = logRequests
		out := runLogged(t, cfg, "info", func(base string) {
			call(t, "GET", base+"/readyz", "", nil, nil)
			if code := call(t, "POST", base+"/v1/operations", apiToken, map[string]any{"subject": "s", "target": "t", "action": "grant"}, nil); code != 201 && code != 409 {
				t.Errorf("apply: %d", code)
			}
			call(t, "POST", base+"/v1/operations", "wrong-token", map[string]any{"subject": "s", "target": "t", "action": "grant"}, nil)
			call(t, "POST", base+"/v1/admin/rounds", adminToken, map[string]any{}, nil)
			time.Sleep(500 * time.Millisecond) // the loops log their start and a round
		})
		var lines []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if dups, err := logging.DuplicateKeys([]byte(l)); err != nil || len(dups) > 0 {
				t.Errorf("keys %v twice (%v) in: %s", dups, err, l)
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("not JSON: %s", l)
			}
			lines = append(lines, m)
		}
		return lines
	}

	lines := run(true)
	requests := map[string]map[string]any{}
	var sawScanner, sawShutdown bool
	for _, m := range lines {
		if m["component"] == "scanner" {
			sawScanner = true
		}
		if m["msg"] == "shutting down" {
			sawShutdown = true
			if m["timeout"] != "5s" {
				t.Errorf("shutdown timeout is %#v, want \"5s\"", m["timeout"])
			}
		}
		if m["msg"] != "request" {
			continue
		}
		if m["level"] != "INFO" {
			t.Errorf("request line at %v: %v", m["level"], m)
		}
		d, ok := m["duration"].(string)
		if _, err := time.ParseDuration(d); !ok || err != nil {
			t.Errorf("request duration %#v is not a duration string", m["duration"])
		}
		requests[m["route"].(string)+" "+jsonNum(m["status"])] = m
	}
	if !sawScanner || !sawShutdown {
		t.Errorf("scanner lines %v, shutdown line %v", sawScanner, sawShutdown)
	}
	for key, principal := range map[string]string{
		"POST /v1/operations 401":   "",
		"POST /v1/admin/rounds 200": "token-", // a bare token's principal: token-<8 hex of its sha256>
	} {
		m, ok := requests[key]
		if !ok {
			t.Errorf("no request line for %s; have %v", key, keys(requests))
			continue
		}
		if p, _ := m["principal"].(string); !strings.HasPrefix(p, principal) || (principal == "" && p != "") {
			t.Errorf("%s: principal %q, want %q…", key, p, principal)
		}
		if m["method"] != "POST" {
			t.Errorf("%s: method %v", key, m["method"])
		}
	}
	if _, ok := requests["POST /v1/operations 201"]; !ok {
		if _, ok := requests["POST /v1/operations 409"]; !ok {
			t.Errorf("no request line for the apply; have %v", keys(requests))
		}
	}
	if _, ok := requests["GET /readyz 200"]; ok {
		t.Error("a readiness probe was logged at info")
	}

	for _, m := range run(false) {
		if m["msg"] == "request" {
			t.Errorf("request logged at info without BATCHERD_LOG_REQUESTS: %v", m)
		}
	}
}

func jsonNum(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// startSim serves a GitLab simulator with the given projects until the test ends.
func startSim(t *testing.T, projects ...string) *gitlabsim.Sim {
	t.Helper()
	sim := gitlabsim.New(gitlabsim.Options{Projects: projects})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

// runLogged runs a replica of cfg whose JSON log at level is captured, calls drive with
// its base URL, stops it and returns the log.
func runLogged(t *testing.T, cfg *config.Config, level string, drive func(base string)) string {
	t.Helper()
	var buf syncBuffer
	log, err := logging.New(&buf, "json", level)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.New(context.Background(), cfg, app.Env{Log: log, Stdout: io.Discard, TuneScanner: fast})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	drive("http://" + a.Addr())
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return buf.String()
}
