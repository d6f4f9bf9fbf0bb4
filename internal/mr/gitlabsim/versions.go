package gitlabsim

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// GitLab versions the simulator speaks (Options.Version). Self-managed GitLab is run
// at many versions at once, and the merge API changed under clients between them.
const (
	// Version16 is GitLab 16.11: the merge endpoint knows only
	// merge_when_pipeline_succeeds; auto_merge is an unknown parameter it drops, so a
	// call with only auto_merge is a plain merge (405 when the MR cannot merge now). Its
	// checks run in the order not allowed (405), cannot be merged (422), then the sha
	// guard (409).
	Version16 = "16.11.10"
	// Version17 is GitLab 17.11, where auto_merge arrived and merge_when_pipeline_succeeds
	// became its deprecated alias; the sha guard (409) is checked first.
	Version17 = "17.11.4"
	// Version18 is a current GitLab (the default): as 17.11.
	Version18 = "18.2.1"
	// DefaultVersion is what an Options without Version speaks.
	DefaultVersion = Version18
)

// Versions lists the versions the simulator models, oldest first (a test matrix).
var Versions = []string{Version16, Version17, Version18}

// Merge methods of a project (Options.MergeMethod), as GitLab's project setting
// merge_method names them.
const (
	MergeMethodMerge       = "merge"        // a merge commit
	MergeMethodFastForward = "ff"           // fast-forward only: the source must contain the target's head
	MergeMethodRebaseMerge = "rebase_merge" // semi-linear: a merge commit, but only on a source rebased onto the target
)

// MergeMethods lists the merge methods the simulator models (a test matrix).
var MergeMethods = []string{MergeMethodMerge, MergeMethodFastForward, MergeMethodRebaseMerge}

type version struct{ major, minor int }

func parseVersion(v string) (version, error) {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return version{}, fmt.Errorf("gitlabsim: version %q is not major.minor[.patch]", v)
	}
	maj, err1 := strconv.Atoi(parts[0])
	min, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return version{}, fmt.Errorf("gitlabsim: version %q is not major.minor[.patch]", v)
	}
	return version{maj, min}, nil
}

func (v version) atLeast(major, minor int) bool {
	return v.major > major || (v.major == major && v.minor >= minor)
}

// knowsAutoMerge: the merge endpoint takes auto_merge (17.11 and later).
func (v version) knowsAutoMerge() bool { return v.atLeast(17, 11) }

// shaFirst: the merge endpoint checks the sha guard before whether it can merge
// (current versions); older ones answer 405/422 first and check the sha last.
func (v version) shaFirst() bool { return v.atLeast(17, 11) }

func init() {
	addRoute(http.MethodGet, "/version", getVersion)
}

// getVersion is GET /version (any authenticated user may read it).
func getVersion(s *Sim, q *req) (*reply, *apiError) {
	return ok(http.StatusOK, map[string]any{
		"version":    s.opts.Version + "-ee",
		"revision":   "6a9d8b3f1c2",
		"kas":        map[string]any{"enabled": false, "externalUrl": nil, "externalK8sProxyUrl": nil, "version": nil},
		"enterprise": true,
	})
}
