package app_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/app"
	"github.com/batcherd/batcherd/internal/logging"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// batcherd verify compares each repository's bindings/ tree with the database when
// GitLab is configured: one line per file that differs, and a non-zero exit. Without
// GitLab it says that drift was not checked.
func TestVerifyReportsDrift(t *testing.T) {
	sim := gitlabsim.New(gitlabsim.Options{Projects: []string{"g/p"}})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	_, dsn := storetest.New(t)
	cfg := testConfig(t, dsn, sim.URL(), "g/p")
	run := func() (string, error) {
		var out bytes.Buffer
		err := app.Verify(context.Background(), cfg, app.Env{Log: logging.Discard(), Stdout: &out})
		return out.String(), err
	}
	if out, err := run(); err != nil || !strings.Contains(out, "[drift] g/p (main): 0 unexpected, 0 missing, 0 modified") {
		t.Fatalf("clean: %v\n%s", err, out)
	}
	stray := "subject: nobody\n"
	if _, err := sim.PushToDefault("g/p", map[string]*string{"bindings/db/nobody.yaml": &stray}, "by hand"); err != nil {
		t.Fatal(err)
	}
	out, err := run()
	if !errors.Is(err, app.ErrViolations) || app.ExitCode(err) == 0 || !strings.Contains(out, "[drift] g/p: unexpected bindings/db/nobody.yaml") {
		t.Fatalf("with a stray file: %v (exit %d)\n%s", err, app.ExitCode(err), out)
	}
	cfg.GitLabURL, cfg.GitLabToken = "", ""
	if out, err := run(); err != nil || !strings.Contains(out, "[drift] not checked") {
		t.Fatalf("without GitLab: %v\n%s", err, out)
	}
}
