package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
)

// SimState is the simulator's dump (GET /-/sim/state).
type SimState = gitlabsim.State

// SimFault is a fault to inject (POST /-/sim/faults).
type SimFault = gitlabsim.Fault

// SimMR is one merge request in a SimState.
type SimMR = gitlabsim.MRState

// SimClient drives the GitLab simulator through its control API (/-/sim/...), which
// needs no token.
type SimClient struct {
	// URL is the simulator's base URL (without /api/v4).
	URL  string
	http *http.Client
}

// NewSimClient returns a client of the simulator at baseURL.
func NewSimClient(baseURL string) *SimClient {
	return &SimClient{URL: baseURL, http: &http.Client{Timeout: 15 * time.Second}}
}

func (s *SimClient) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+"/-/sim/"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("gitlab-sim %s /-/sim/%s: %d %s", method, path, resp.StatusCode, truncate(string(data), 300))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// State dumps the simulator: per project the files on the default branch, branches,
// and merge requests by source branch.
func (s *SimClient) State(ctx context.Context) (SimState, error) {
	var st SimState
	err := s.call(ctx, http.MethodGet, "state", nil, &st)
	return st, err
}

func mrPath(project string, iid int64, action string) string {
	return "projects/" + url.PathEscape(project) + "/merge_requests/" + strconv.FormatInt(iid, 10) + "/" + action
}

// MergeMR merges an MR as a human would.
func (s *SimClient) MergeMR(ctx context.Context, project string, iid int64) error {
	return s.call(ctx, http.MethodPost, mrPath(project, iid, "merge"), nil, nil)
}

// CloseMR closes an MR as a human would.
func (s *SimClient) CloseMR(ctx context.Context, project string, iid int64) error {
	return s.call(ctx, http.MethodPost, mrPath(project, iid, "close"), nil, nil)
}

// FailMRPipeline fails the head pipeline of an MR.
func (s *SimClient) FailMRPipeline(ctx context.Context, project string, iid int64, reason string) error {
	return s.call(ctx, http.MethodPost, mrPath(project, iid, "fail_pipeline"), map[string]string{"failure_reason": reason}, nil)
}

// SucceedMRPipeline finishes the head pipeline of an MR successfully.
func (s *SimClient) SucceedMRPipeline(ctx context.Context, project string, iid int64) error {
	return s.call(ctx, http.MethodPost, mrPath(project, iid, "succeed_pipeline"), nil, nil)
}

// SetPipelines changes how new pipelines behave.
func (s *SimClient) SetPipelines(ctx context.Context, duration time.Duration, failureRate float64, manual bool) error {
	return s.call(ctx, http.MethodPost, "pipelines", map[string]any{
		"duration_ms": duration.Milliseconds(), "failure_rate": failureRate, "manual": manual,
	}, nil)
}

// Push commits files straight to a project's default branch (a human's change; a nil
// content deletes the file). It returns the new sha.
func (s *SimClient) Push(ctx context.Context, project string, files map[string]*string, message string) (string, error) {
	var out struct {
		SHA string `json:"sha"`
	}
	err := s.call(ctx, http.MethodPost, "projects/"+url.PathEscape(project)+"/push", map[string]any{"files": files, "message": message}, &out)
	return out.SHA, err
}

// InjectFault adds a fault and returns its id.
func (s *SimClient) InjectFault(ctx context.Context, f SimFault) (int64, error) {
	var out struct {
		ID int64 `json:"id"`
	}
	err := s.call(ctx, http.MethodPost, "faults", f, &out)
	return out.ID, err
}

// ClearFaults removes every fault.
func (s *SimClient) ClearFaults(ctx context.Context) error {
	return s.call(ctx, http.MethodDelete, "faults", nil, nil)
}

// Poison makes pipelines of a project fail when a changed file's path or content
// contains substring (see gitlabsim.PoisonRule).
func (s *SimClient) Poison(ctx context.Context, project string, rule gitlabsim.PoisonRule) error {
	return s.call(ctx, http.MethodPost, "projects/"+url.PathEscape(project)+"/poison", rule, nil)
}

// ClearPoison removes a project's poison rules.
func (s *SimClient) ClearPoison(ctx context.Context, project string) error {
	return s.call(ctx, http.MethodDelete, "projects/"+url.PathEscape(project)+"/poison", nil, nil)
}
