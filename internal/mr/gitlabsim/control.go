package gitlabsim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The control API plays the human and the test harness over HTTP, for the demo and
// for black-box tests. It needs no token: the simulator is a test tool bound to a
// local address. Project refs are an id or a URL-encoded path, as in the API.
//
//	GET    /-/sim/state                                  dump (State)
//	GET    /-/sim/calls                                  every recorded API call
//	POST   /-/sim/projects                               {"path": "g/p"} → {"id": n}
//	POST   /-/sim/projects/:p/merge_requests/:iid/merge  merge as a human
//	POST   /-/sim/projects/:p/merge_requests/:iid/close  close as a human
//	POST   /-/sim/projects/:p/merge_requests/:iid/fail_pipeline     {"failure_reason": "…"}
//	POST   /-/sim/projects/:p/merge_requests/:iid/succeed_pipeline
//	POST   /-/sim/projects/:p/pipelines/:id/fail         {"failure_reason": "…"}
//	POST   /-/sim/projects/:p/pipelines/:id/succeed
//	POST   /-/sim/projects/:p/poison                     PoisonRule
//	DELETE /-/sim/projects/:p/poison
//	POST   /-/sim/projects/:p/push                       {"files": {"path": "content" | null}, "message": "…"}
//	POST   /-/sim/projects/:p/pipelines/:id/status       {"status": "…", "failure_reason": "…"}
//	POST   /-/sim/projects/:p/merge_method               {"merge_method": "merge" | "ff" | "rebase_merge"}
//	POST   /-/sim/pipelines                              {"duration_ms": n, "failure_rate": f, "manual": b}
//	POST   /-/sim/pipeline_rules                         PipelineRule
//	DELETE /-/sim/pipeline_rules
//	GET    /-/sim/faults                                 faults and how often they applied
//	POST   /-/sim/faults                                 Fault → {"id": n}
//	DELETE /-/sim/faults                                 clear every fault
//
// One function on purpose: one case per control operation, each a few lines; a
// table would only move the switch and the shared decode/done helpers.
func (s *Sim) serveControl(w http.ResponseWriter, r *http.Request, escaped string) {
	raw := strings.Split(strings.Trim(escaped, "/"), "/")
	segs := make([]string, len(raw))
	for i, sg := range raw {
		u, err := url.PathUnescape(sg)
		if err != nil {
			ctlErr(w, http.StatusBadRequest, "invalid path")
			return
		}
		segs[i] = u
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	decode := func(v any) bool {
		if len(strings.TrimSpace(string(body))) == 0 {
			return true
		}
		if err := json.Unmarshal(body, v); err != nil {
			ctlErr(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
			return false
		}
		return true
	}
	done := func(err error) {
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, map[string]any{"ok": true}, nil)
		case errors.Is(err, ErrNotFound):
			ctlErr(w, http.StatusNotFound, err.Error())
		default:
			ctlErr(w, http.StatusConflict, err.Error())
		}
	}
	m, n := r.Method, len(segs)
	switch {
	case m == http.MethodGet && n == 1 && segs[0] == "state":
		writeJSON(w, http.StatusOK, s.Dump(), nil)
	case m == http.MethodGet && n == 1 && segs[0] == "calls":
		writeJSON(w, http.StatusOK, s.Calls(), nil)
	case m == http.MethodPost && n == 1 && segs[0] == "projects":
		var in struct {
			Path string `json:"path"`
		}
		if !decode(&in) {
			return
		}
		if in.Path == "" {
			ctlErr(w, http.StatusBadRequest, "path is required")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": s.AddProject(in.Path)}, nil)
	case m == http.MethodPost && n == 5 && segs[0] == "projects" && segs[2] == "merge_requests":
		iid, err := strconv.ParseInt(segs[3], 10, 64)
		if err != nil {
			ctlErr(w, http.StatusBadRequest, "invalid iid")
			return
		}
		var in struct {
			FailureReason string `json:"failure_reason"`
		}
		if !decode(&in) {
			return
		}
		switch segs[4] {
		case "merge":
			done(s.MergeMR(segs[1], iid))
		case "close":
			done(s.CloseMR(segs[1], iid))
		case "fail_pipeline":
			done(s.FailMRPipeline(segs[1], iid, in.FailureReason))
		case "succeed_pipeline":
			done(s.SucceedMRPipeline(segs[1], iid))
		default:
			ctlErr(w, http.StatusNotFound, "unknown control route")
		}
	case m == http.MethodPost && n == 5 && segs[0] == "projects" && segs[2] == "pipelines":
		id, err := strconv.ParseInt(segs[3], 10, 64)
		if err != nil {
			ctlErr(w, http.StatusBadRequest, "invalid pipeline id")
			return
		}
		var in struct {
			FailureReason string `json:"failure_reason"`
			Status        string `json:"status"`
		}
		if !decode(&in) {
			return
		}
		switch segs[4] {
		case "status":
			err := s.SetPipelineStatus(segs[1], id, in.Status, in.FailureReason)
			if err != nil && !errors.Is(err, ErrNotFound) {
				ctlErr(w, http.StatusBadRequest, err.Error())
				return
			}
			done(err)
		case "fail":
			done(s.FailPipeline(segs[1], id, in.FailureReason))
		case "succeed":
			done(s.SucceedPipeline(segs[1], id))
		default:
			ctlErr(w, http.StatusNotFound, "unknown control route")
		}
	case n == 3 && segs[0] == "projects" && segs[2] == "poison" && m == http.MethodPost:
		var rule PoisonRule
		if !decode(&rule) {
			return
		}
		if rule.Substring == "" {
			ctlErr(w, http.StatusBadRequest, "substring is required")
			return
		}
		done(s.AddPoison(segs[1], rule))
	case n == 3 && segs[0] == "projects" && segs[2] == "poison" && m == http.MethodDelete:
		s.ClearPoison(segs[1])
		done(nil)
	case n == 3 && segs[0] == "projects" && segs[2] == "push" && m == http.MethodPost:
		var in struct {
			Files   map[string]*string `json:"files"`
			Message string             `json:"message"`
		}
		if !decode(&in) {
			return
		}
		sha, err := s.PushToDefault(segs[1], in.Files, in.Message)
		if err != nil {
			done(err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"sha": sha}, nil)
	case n == 3 && segs[0] == "projects" && segs[2] == "merge_method" && m == http.MethodPost:
		var in struct {
			MergeMethod string `json:"merge_method"`
		}
		if !decode(&in) {
			return
		}
		err := s.SetMergeMethod(segs[1], in.MergeMethod)
		if err != nil && !errors.Is(err, ErrNotFound) {
			ctlErr(w, http.StatusBadRequest, err.Error())
			return
		}
		done(err)
	case n == 1 && segs[0] == "pipeline_rules" && m == http.MethodPost:
		var rule PipelineRule
		if !decode(&rule) {
			return
		}
		if err := s.AddPipelineRule(rule); err != nil {
			ctlErr(w, http.StatusBadRequest, err.Error())
			return
		}
		done(nil)
	case n == 1 && segs[0] == "pipeline_rules" && m == http.MethodDelete:
		s.ClearPipelineRules()
		done(nil)
	case n == 1 && segs[0] == "pipelines" && m == http.MethodPost:
		var in struct {
			DurationMS  int64   `json:"duration_ms"`
			FailureRate float64 `json:"failure_rate"`
			Manual      bool    `json:"manual"`
		}
		if !decode(&in) {
			return
		}
		s.SetPipelineOptions(time.Duration(in.DurationMS)*time.Millisecond, in.FailureRate, in.Manual)
		done(nil)
	case n == 1 && segs[0] == "faults" && m == http.MethodGet:
		writeJSON(w, http.StatusOK, s.Dump().Faults, nil)
	case n == 1 && segs[0] == "faults" && m == http.MethodPost:
		var f Fault
		if !decode(&f) {
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": s.InjectFault(f)}, nil)
	case n == 1 && segs[0] == "faults" && m == http.MethodDelete:
		s.ClearFaults()
		done(nil)
	default:
		ctlErr(w, http.StatusNotFound, "unknown control route")
	}
}

func ctlErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": msg}, nil)
}
