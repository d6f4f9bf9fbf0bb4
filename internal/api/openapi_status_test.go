package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.yaml.in/yaml/v3"
)

// declaredStatuses reads, per "METHOD /path" of api/openapi.yaml, the statuses the
// document declares. Loaded once per test binary.
var declaredStatuses = sync.OnceValues(func() (map[string]map[int]bool, error) {
	raw, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		return nil, err
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Responses map[string]any `yaml:"responses"`
		} `yaml:"paths"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	out := map[string]map[int]bool{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			set := map[int]bool{}
			for code := range op.Responses {
				if n, err := strconv.Atoi(code); err == nil {
					set[n] = true
				}
			}
			out[strings.ToUpper(method)+" "+path] = set
		}
	}
	return out, nil
})

// answerRecorder remembers the status a handler answered.
type answerRecorder struct {
	http.ResponseWriter
	status int
}

func (r *answerRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *answerRecorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// declaredOnly is a validating proxy in front of the server every API test talks to:
// an answer whose status api/openapi.yaml does not declare for its route is reported
// (t.Errorf: it fails the test that provoked it). The document once left out 413 and
// 415 answers that the server gave; only a check of real answers finds those. Answers
// of the method-less fallbacks (405 for another method, 404 for an unknown path) are
// documented once, in the document's description, and are not per route.
func declaredOnly(t *testing.T, s *Server, report func(format string, args ...any)) http.Handler {
	decl, err := declaredStatuses()
	if err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &answerRecorder{ResponseWriter: w}
		s.ServeHTTP(rec, r)
		_, pattern := s.mux.Handler(r)
		if !strings.Contains(pattern, " ") { // a fallback, not a documented route
			return
		}
		set, ok := decl[pattern]
		if !ok {
			report("%s %s: route %q is not in api/openapi.yaml", r.Method, r.URL.Path, pattern)
			return
		}
		if st := rec.status; st != 0 && !set[st] {
			report("%s %s answered %d, which api/openapi.yaml does not declare for %s", r.Method, r.URL.Path, st, pattern)
		}
	})
}

// The proxy itself must catch an undeclared answer (a check that cannot fail proves
// nothing): a body over the limit on approve is 413, and with 413 taken out of the
// document's approve route the proxy reports it.
func TestDeclaredOnlyReportsUndeclaredStatus(t *testing.T) {
	decl, err := declaredStatuses()
	if err != nil {
		t.Fatal(err)
	}
	for route, st := range map[string]int{
		"POST /v1/admin/rounds":              http.StatusRequestEntityTooLarge,
		"POST /v1/admin/rounds ":             http.StatusUnsupportedMediaType,
		"POST /v1/operations/{id}/approve":   http.StatusRequestEntityTooLarge,
		"POST /v1/webhooks/gitlab":           http.StatusUnsupportedMediaType,
		"POST /v1/webhooks/gitlab ":          http.StatusRequestEntityTooLarge,
		"POST /v1/admin/batches/{id}/settle": http.StatusRequestEntityTooLarge,
	} {
		if !decl[strings.TrimSpace(route)][st] {
			t.Errorf("%s: %d not declared", route, st)
		}
	}
	e := newEnv(t, nil)
	id := e.mustCreate("alice", "db/x", "grant")
	saved := decl["POST /v1/operations/{id}/approve"]
	trimmed := map[int]bool{}
	for k, v := range saved {
		if k != http.StatusRequestEntityTooLarge {
			trimmed[k] = v
		}
	}
	decl["POST /v1/operations/{id}/approve"] = trimmed
	defer func() { decl["POST /v1/operations/{id}/approve"] = saved }()
	var got []string
	h := declaredOnly(t, e.api, func(f string, a ...any) { got = append(got, fmt.Sprintf(f, a...)) })
	r := httptest.NewRequest("POST", "/v1/operations/"+id+"/approve", strings.NewReader(strings.Repeat("x", DefaultMaxBodyBytes+1)))
	r.Header.Set("Authorization", "Bearer "+apiToken)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("approve with a body over the limit answered %d", w.Code)
	}
	if len(got) != 1 || !strings.Contains(got[0], "answered 413") {
		t.Fatalf("proxy reported %q", got)
	}
}
