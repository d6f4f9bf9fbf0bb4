package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTestDepsScript runs scripts/test-deps.sh (what `make test` runs before the suite)
// in its dry-run mode: with a C compiler that does not exist it must name gcc and
// libc6-dev (what -race needs on a fresh Debian), and on this machine, which runs the
// suite under -race, it must find nothing missing and say nothing.
func TestTestDepsScript(t *testing.T) {
	root := repoRoot(t)
	run := func(env ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(root, "scripts", "test-deps.sh"))
		cmd.Dir = root
		cmd.Env = append(append(os.Environ(), "TEST_DEPS_DRY_RUN=1"), env...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("scripts/test-deps.sh: %v", err)
		}
		return string(out), code
	}

	out, code := run()
	if code != 0 || strings.TrimSpace(out) != "" {
		t.Errorf("on this machine: exit %d, output %q; want exit 0 and no output", code, out)
	}

	out, code = run("CC=/nonexistent/cc")
	if code != 3 {
		t.Errorf("without a C compiler: exit %d, want 3 (dry run, something missing); output:\n%s", code, out)
	}
	if !strings.Contains(out, "would install: gcc libc6-dev\n") {
		t.Errorf("without a C compiler: output does not name gcc and libc6-dev once each:\n%s", out)
	}
	if !strings.Contains(out, "-race") {
		t.Errorf("without a C compiler: output does not say why (-race):\n%s", out)
	}
}
