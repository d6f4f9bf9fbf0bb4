package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/sethvargo/go-envconfig"

	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/logging"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/scanner"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

const (
	aliceToken = "alice-token-for-the-status-page"
	bobToken   = "bob-admin-token-for-the-status-page"
)

// chromium finds Debian's chromium (scripts/test-deps.sh installs it): a plain go test
// skips without it, make test (BATCHERD_REQUIRE_TOOLS) fails. No browser is ever
// downloaded.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("BATCHERD_REQUIRE_TOOLS") != "" {
		t.Fatal("chromium not found; scripts/test-deps.sh installs it (Debian package chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium); make test installs it")
	return ""
}

// startReplica runs one batcherd replica (the whole app: API, status page, loops) on
// :0 against a fresh database and the GitLab simulator, and returns its base URL.
func startReplica(t *testing.T, repos ...string) (string, *gitlabsim.Sim) {
	t.Helper()
	_, dsn := storetest.New(t)
	sim := gitlabsim.New(gitlabsim.Options{Projects: repos, PipelineDuration: 100 * time.Millisecond})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	cfg, err := config.Load(context.Background(), envconfig.MapLookuper(map[string]string{
		"BATCHERD_MYSQL_DSN":          dsn,
		"BATCHERD_GITLAB_URL":         sim.URL(),
		"BATCHERD_GITLAB_TOKEN":       "sim-token",
		"BATCHERD_REPOS":              strings.Join(repos, ","),
		"BATCHERD_HTTP_ADDR":          "127.0.0.1:0",
		"BATCHERD_API_TOKENS":         "alice=" + aliceToken,
		"BATCHERD_ADMIN_TOKENS":       "bob=" + bobToken,
		"BATCHERD_CLAIM_SCHEDULE":     "@every 1s",
		"BATCHERD_RECONCILE_INTERVAL": "200ms",
		"BATCHERD_SHUTDOWN_TIMEOUT":   "5s",
		"BATCHERD_UI_SESSION_KEY":     "0123456789abcdef0123456789abcdef-test-key",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.Need{DB: true, GitLab: true, Serve: true}); err != nil {
		t.Fatal(err)
	}
	fast := func(c *scanner.Config) {
		c.PublishInterval = 200 * time.Millisecond
		c.StartJitter = 50 * time.Millisecond
		c.BackoffBase = 50 * time.Millisecond
		c.BackoffMax = 500 * time.Millisecond
	}
	a, err := app.New(context.Background(), cfg, app.Env{Log: logging.Discard(), Stdout: io.Discard, Version: "test", TuneScanner: fast})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("replica did not stop within 15s")
		}
	})
	return "http://" + a.Addr(), sim
}

func apiCall(t *testing.T, method, url, token string, body any) map[string]any {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %v", method, url, resp.StatusCode, out)
	}
	return out
}

// seed makes real history through the API: grants requested by alice and approved by
// bob (four eyes), merged through the simulator in batches; then the second repository
// is paused with a reason and one more approved grant waits there, and a last grant's
// batch stays running in the first (its pipeline waits for a person).
func seed(t *testing.T, base string, sim *gitlabsim.Sim, repos []string) (merged []string) {
	t.Helper()
	for i := range 4 {
		op := apiCall(t, "POST", base+"/v1/operations", aliceToken, map[string]any{
			"subject": fmt.Sprintf("user-%d", i), "target": "db/prod", "action": "grant", "repo": repos[0]})
		id := op["operation"].(map[string]any)["id"].(string)
		apiCall(t, "POST", base+"/v1/operations/"+id+"/approve", bobToken, nil)
		merged = append(merged, id)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range merged {
		for {
			op := apiCall(t, "GET", base+"/v1/operations/"+id, aliceToken, nil)["operation"].(map[string]any)
			if op["status"] == "merged" {
				break
			}
			if op["status"] == "failed" || time.Now().After(deadline) {
				t.Fatalf("operation %s is %v", id, op["status"])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	apiCall(t, "POST", base+"/v1/admin/repos/"+strings.ReplaceAll(repos[1], "/", "%2F")+"/pause", bobToken,
		map[string]any{"reason": "change freeze until the release is out"})
	op := apiCall(t, "POST", base+"/v1/operations", aliceToken, map[string]any{
		"subject": "carol", "target": "db/staging", "action": "grant", "repo": repos[1]})
	apiCall(t, "POST", base+"/v1/operations/"+op["operation"].(map[string]any)["id"].(string)+"/approve", bobToken, nil)
	sim.SetPipelineOptions(time.Hour, 0, true)
	op = apiCall(t, "POST", base+"/v1/operations", aliceToken, map[string]any{
		"subject": "dave", "target": "db/prod", "action": "grant", "repo": repos[0]})
	id := op["operation"].(map[string]any)["id"].(string)
	apiCall(t, "POST", base+"/v1/operations/"+id+"/approve", bobToken, nil)
	for {
		op := apiCall(t, "GET", base+"/v1/operations/"+id, aliceToken, nil)["operation"].(map[string]any)
		if op["status"] == "in_batch" && op["mr_url"] != nil && op["mr_url"] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s is %v without an MR", id, op["status"])
		}
		time.Sleep(100 * time.Millisecond)
	}
	return merged
}

// TestBrowser drives headless Chromium through the status page of a running replica:
// a wrong token is refused, a login shows the repositories, a batch leads to its
// members and a member to its timeline, and logout ends the session. It writes a
// screenshot of the repositories page (docs/status-page.png with UPDATE_SCREENSHOT=1).
func TestBrowser(t *testing.T) {
	exe := chromium(t)
	repos := []string{"platform/access", "platform/other"}
	base, sim := startReplica(t, repos...)
	seed(t, base, sim, repos)

	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 820),
	)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(alloc)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 45*time.Second)
	defer cancelT()

	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	// Not logged in: the page sends the browser to the login form.
	do("open /ui", chromedp.Navigate(base+"/ui"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); !strings.Contains(loc, "/ui/login") {
		t.Fatalf("without a session /ui went to %s", loc)
	}

	// A wrong token is refused.
	do("wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-a-token"), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#login-error")))
	if s := text("#login-error"); !strings.Contains(s, "refused") {
		t.Fatalf("login error = %q", s)
	}

	// alice logs in and sees both repositories, the pause and the waiting grant.
	do("log in", chromedp.SendKeys(chromedp.CSS("#token"), aliceToken), chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#repos")))
	if who := text("#principal"); who != "alice" {
		t.Fatalf("logged in as %q", who)
	}
	reposText := text("#repos")
	for _, want := range []string{"platform/access", "platform/other", "paused", "change freeze until the release is out", "by bob", "running", "MR !"} {
		if !strings.Contains(reposText, want) {
			t.Errorf("repositories table lacks %q:\n%s", want, reposText)
		}
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	writeScreenshot(t, shot)

	// A merged batch of the recent list leads to its members.
	do("open a batch", chromedp.Click(chromedp.CSS(`table.batches a[href="/ui/batches/1"]`)), chromedp.WaitVisible(chromedp.CSS("#members")))
	members := text("#members")
	for _, want := range []string{"user-", "db/prod", "grant", "alice", "bob", "merged"} {
		if !strings.Contains(members, want) {
			t.Errorf("members table lacks %q:\n%s", want, members)
		}
	}

	// A member leads to its timeline, which names who acted.
	do("open an operation", chromedp.Click(chromedp.CSS(`#members a[href^="/ui/operations/"]`)), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	timeline := text("#timeline")
	for _, want := range []string{"by alice", "by bob", "merged"} {
		if !strings.Contains(timeline, want) {
			t.Errorf("timeline lacks %q:\n%s", want, timeline)
		}
	}

	// Logout ends the session: the pages send the browser to the login form again.
	do("log out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#token")))
	do("after logout", chromedp.Navigate(base+"/ui/batches"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if loc, _ := chromedp.Run(ctx, chromedp.Location()); !strings.Contains(loc, "/ui/login") {
		t.Fatalf("after logout /ui/batches went to %s", loc)
	}
}

// writeScreenshot keeps the screenshot for a person to look at: in the test's output
// directory always, and as the README's docs/status-page.png with UPDATE_SCREENSHOT=1.
func writeScreenshot(t *testing.T, png []byte) {
	t.Helper()
	if len(png) < 1000 || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(png))
	}
	p := filepath.Join(os.TempDir(), "batcherd-status-page.png")
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		p = "../../docs/status-page.png"
	}
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the status page: %s", p)
}
