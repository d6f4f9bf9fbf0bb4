package model

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestProtocolModel runs spin on the protocol model (scripts/model.sh quick): the model
// must hold its properties and the mutants in the slice must be caught. The script
// fails on either; `make model` runs every property and every mutant.
func TestProtocolModel(t *testing.T) {
	if testing.Short() {
		t.Skip("model checking is not short")
	}
	for _, tool := range []string{"spin", "gcc", "bc"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("BATCHERD_REQUIRE_TOOLS") != "" {
				t.Fatalf("%s is not installed (scripts/test-deps.sh installs it)", tool)
			}
			t.Skipf("%s is not installed (scripts/test-deps.sh installs it)", tool)
		}
	}
	cmd := exec.Command("bash", "../scripts/model.sh", "quick")
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/model.sh quick:\n%s", out)
	if err != nil {
		t.Fatalf("model check failed: %v", err)
	}
	// The script says so only when every run went as required.
	if !strings.Contains(string(out), "every mutant is caught") {
		t.Fatalf("model check did not report its verdict")
	}
}
