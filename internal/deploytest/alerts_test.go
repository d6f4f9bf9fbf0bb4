package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The alerting rules are code: deploy/prometheus/batcherd-rules.yaml is checked and
// unit-tested by promtool (Debian's prometheus package ships it; the test command installs
// it), the PrometheusRule in deploy/kubernetes/monitoring carries exactly the same groups,
// every alert is explained in the README, and every metric an alert reads is one batcherd
// exports.

const (
	rulesFile      = "deploy/prometheus/batcherd-rules.yaml"
	rulesTestFile  = "deploy/prometheus/batcherd-rules.test.yaml"
	prometheusRule = "deploy/kubernetes/monitoring/prometheusrule.yaml"
)

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadRules(t *testing.T) ruleGroups {
	t.Helper()
	var g ruleGroups
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(repoRoot(t), rulesFile))), &g); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	if len(g.Groups) == 0 {
		t.Fatalf("%s has no rule groups", rulesFile)
	}
	return g
}

// promtool returns the promtool binary. The test command (make test) installs it and sets
// BATCHERD_REQUIRE_TOOLS, so there a missing promtool fails; a plain `go test` elsewhere skips.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("BATCHERD_REQUIRE_TOOLS") != "" {
			t.Fatal("promtool not found; scripts/test-deps.sh installs it (Debian package prometheus)")
		}
		t.Skip("promtool not found (apt-get install prometheus); make test installs it")
	}
	return p
}

func TestAlertRulesPromtool(t *testing.T) {
	bin := promtool(t)
	dir := filepath.Join(repoRoot(t), "deploy", "prometheus")
	for _, args := range [][]string{
		{"check", "rules", filepath.Base(rulesFile)},
		{"test", "rules", filepath.Base(rulesTestFile)},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	root := repoRoot(t)
	var file, cr struct {
		Groups any `yaml:"groups"`
		Kind   string
		Spec   struct {
			Groups any `yaml:"groups"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(root, rulesFile))), &file); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(root, prometheusRule))), &cr); err != nil {
		t.Fatal(err)
	}
	if cr.Kind != "PrometheusRule" {
		t.Fatalf("%s: kind %q, want PrometheusRule", prometheusRule, cr.Kind)
	}
	if file.Groups == nil || !reflect.DeepEqual(file.Groups, cr.Spec.Groups) {
		t.Fatalf("%s spec.groups differ from %s: copy the groups over (indented under spec:)", prometheusRule, rulesFile)
	}
}

func TestREADMEExplainsEveryAlert(t *testing.T) {
	readme := readFile(t, filepath.Join(repoRoot(t), "README.md"))
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !strings.Contains(readme, "`"+r.Alert+"`") {
				t.Errorf("README.md does not explain alert %s (name it in backquotes in Metrics and alerts)", r.Alert)
			}
		}
	}
}

// TestAlertMetricsExist catches a renamed or removed metric that would leave an alert
// silently reading nothing.
func TestAlertMetricsExist(t *testing.T) {
	root := repoRoot(t)
	var src strings.Builder
	err := filepath.WalkDir(filepath.Join(root, "internal"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		src.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`batcherd_[a-z_]+`)
	var missing []string
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			for _, m := range name.FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")
				if !strings.Contains(src.String(), `"`+base+`"`) && !slices.Contains(missing, m) {
					missing = append(missing, m)
				}
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("alerts read metrics no code under internal/ registers: %v", missing)
	}
}
