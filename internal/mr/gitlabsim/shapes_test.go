package gitlabsim_test

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
)

// jsonKind names a decoded JSON value's type; null matches any kind.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64, json.Number:
		return "number"
	case bool:
		return "boolean"
	}
	return fmt.Sprintf("%T", v)
}

// sameShape reports every field of want (a documented example) that got lacks or
// holds with another JSON type, recursively, except the paths in skip.
func sameShape(path string, want, got any, skip map[string]string, out *[]string) {
	if _, skipped := skip[path]; skipped {
		return
	}
	wk, gk := jsonKind(want), jsonKind(got)
	if wk == "null" || gk == "null" {
		return
	}
	if wk != gk {
		*out = append(*out, fmt.Sprintf("%s: documented %s, simulator %s", path, wk, gk))
		return
	}
	switch w := want.(type) {
	case map[string]any:
		g := got.(map[string]any)
		keys := make([]string, 0, len(w))
		for k := range w {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := strings.TrimPrefix(path+"."+k, ".")
			if _, skipped := skip[p]; skipped {
				continue
			}
			gv, ok := g[k]
			if !ok {
				*out = append(*out, p+": documented, missing from the simulator")
				continue
			}
			sameShape(p, w[k], gv, skip, out)
		}
	case []any:
		g := got.([]any)
		if len(w) > 0 && len(g) > 0 {
			sameShape(path+"[]", w[0], g[0], skip, out)
		}
	}
}

func fixture(t *testing.T, name string) any {
	t.Helper()
	raw, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func decode(t *testing.T, raw []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// The simulator's answers have the shape of GitLab's documented examples
// (testdata/README.md says where each comes from): every documented field, with the
// documented JSON type. What it does not model is listed here, with why.
func TestShapesMatchGitLabDocs(t *testing.T) {
	sim := gitlabsim.StartTest(t, gitlabsim.Options{Projects: []string{proj},
		PipelineRules: []gitlabsim.PipelineRule{{RefPrefix: "b1", Status: "failed", FailureReason: "script_failure"}}})
	iid, _ := openMR(t, sim, "b1", "dir/a.yaml", "a")
	m := getMR(t, sim, iid)
	hp := m["head_pipeline"].(map[string]any)
	pipelineID := int64(hp["id"].(float64))
	jobs := call(t, sim, "GET", api(fmt.Sprintf("/pipelines/%d/jobs", pipelineID)), nil).list(t)
	mrHook, err := sim.MergeRequestEvent(proj, iid, "open")
	must(t, err)
	plHook, err := sim.PipelineEvent(proj, pipelineID)
	must(t, err)

	notModelled := map[string]string{
		// merge request: batcherd assigns nobody, sets no milestone, counts no divergence
		"assignee":               "no assignees are modelled",
		"milestone":              "no milestones are modelled",
		"diverged_commits_count": "only with include_diverged_commits_count, which batcherd never sends",
		// webhooks: no approval rules, milestones or other upstream pipelines
		"object_attributes.milestone_id":      "no milestones are modelled",
		"object_attributes.assignee_ids[]":    "no assignees are modelled",
		"object_attributes.reviewer_ids[]":    "no reviewers are modelled",
		"changes.merge_status":                "changes are not tracked",
		"object_attributes.variables[]":       "no pipeline variables are modelled",
		"object_attributes.labels[].group_id": "labels are project labels (group_id null)",
		"labels[].group_id":                   "labels are project labels (group_id null)",
	}
	for _, tc := range []struct {
		fixture string
		got     any
	}{
		{"merge_request.json", m},
		{"pipeline.json", call(t, sim, "GET", api(fmt.Sprintf("/pipelines/%d", pipelineID)), nil).body},
		{"job.json", jobs[0]},
		{"branch.json", call(t, sim, "GET", api("/repository/branches/main"), nil).body},
		{"tree.json", call(t, sim, "GET", api("/repository/tree"), nil).body},
		{"webhook_merge_request.json", decode(t, mrHook)},
		{"webhook_pipeline.json", decode(t, plHook)},
	} {
		var diffs []string
		sameShape("", fixture(t, tc.fixture), tc.got, notModelled, &diffs)
		if len(diffs) > 0 {
			t.Errorf("%s:\n  %s", tc.fixture, strings.Join(diffs, "\n  "))
		}
	}
	// The shape check itself must see a difference (a check that cannot fail proves
	// nothing).
	var diffs []string
	sameShape("", fixture(t, "pipeline.json"), map[string]any{"id": "61"}, nil, &diffs)
	if len(diffs) < 2 {
		t.Fatalf("shape check missed a wrong type and missing fields: %v", diffs)
	}
}
