package app_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/logging"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// Issue #14, lie 2: serve started with a token GitLab refuses (or a repository GitLab
// does not show), /readyz said ready, work was claimed and sat running until the batch
// timeout. serve must refuse to start, exit 2, and name what to fix.
func TestServePreflightRefusesWhatGitLabRefuses(t *testing.T) {
	sim := gitlabsim.New(gitlabsim.Options{Projects: []string{"g/p"}})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	_, dsn := storetest.New(t)
	env := app.Env{Log: logging.Discard(), Stdout: io.Discard, TuneScanner: fast}

	for _, tc := range []struct {
		name  string
		setup func() (token string, repos []string)
		say   string
	}{
		{"token refused", func() (string, []string) { return "revoked-token", []string{"g/p"} }, "BATCHERD_GITLAB_TOKEN"},
		{"repository unknown", func() (string, []string) { return "sim-token", []string{"g/p", "g/nope"} }, `"g/nope"`},
		{"repository forbidden", func() (string, []string) {
			sim.InjectFault(gitlabsim.Fault{Method: "GET", Route: "/projects/:id", PathContains: "g%2Fp", Status: 403})
			return "sim-token", []string{"g/p"}
		}, `"g/p"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer sim.ClearFaults()
			token, repos := tc.setup()
			cfg := testConfig(t, dsn, sim.URL(), repos...)
			cfg.GitLabToken = token
			a, err := app.New(context.Background(), cfg, env)
			if err == nil {
				a.Store().Close()
				t.Fatal("serve started although GitLab refuses it")
			}
			if !errors.Is(err, app.ErrPreflight) || app.ExitCode(err) != app.ExitUsage || !strings.Contains(err.Error(), tc.say) {
				t.Fatalf("err = %v (exit %d), want a preflight refusal (exit 2) naming %s", err, app.ExitCode(err), tc.say)
			}
			if strings.Contains(err.Error(), token) && token != "sim-token" {
				t.Fatalf("the error shows the token: %v", err)
			}
		})
	}
}

// GitLab unreachable at start-up is a warning, not a refusal, and /readyz does not
// depend on GitLab: admission keeps working while it is down.
func TestServeStartsAndIsReadyWithGitLabUnreachable(t *testing.T) {
	_, dsn := storetest.New(t)
	cfg := testConfig(t, dsn, "http://127.0.0.1:1", "g/p")
	a, stop := startApp(t, cfg)
	defer stop()
	if code := call(t, "GET", "http://"+a.Addr()+"/readyz", "", nil, nil); code != 200 {
		t.Fatalf("/readyz = %d with GitLab unreachable, want 200", code)
	}
	var op opEnvelope
	if code := call(t, "POST", "http://"+a.Addr()+"/v1/operations", apiToken, map[string]any{"subject": "s", "target": "t", "action": "grant"}, &op); code != 201 {
		t.Fatalf("admission with GitLab unreachable: %d", code)
	}
}
