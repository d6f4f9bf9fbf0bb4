package gitlabsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// apiError is an error answer in GitLab's shape: {"message": …} from the API's own
// checks, {"error": …} from parameter validation and unknown routes.
type apiError struct {
	status int
	body   map[string]any
}

func msgErr(status int, message any) *apiError {
	return &apiError{status: status, body: map[string]any{"message": message}}
}

func validationErr(text string) *apiError {
	return &apiError{status: http.StatusBadRequest, body: map[string]any{"error": text}}
}

func notFound(what string) *apiError {
	if what == "" {
		return msgErr(http.StatusNotFound, "404 Not Found")
	}
	return msgErr(http.StatusNotFound, "404 "+what+" Not Found")
}

// reply is a successful answer.
type reply struct {
	status  int
	body    any
	headers http.Header
}

// req is one parsed API request.
type req struct {
	r      *http.Request
	method string
	segs   []string // unescaped path segments after /api/v4/
	params map[string]any
	proj   *project
}

type handlerFunc func(s *Sim, q *req) (*reply, *apiError)

type route struct {
	method  string
	pattern []string // ":x" matches one segment
	name    string   // "/projects/:id/…"
	h       handlerFunc
}

var routes []route

func addRoute(method, pattern string, h handlerFunc) {
	routes = append(routes, route{method: method, pattern: strings.Split(strings.Trim(pattern, "/"), "/"), name: pattern, h: h})
}

func matchRoute(method string, segs []string) (*route, bool) {
	pathMatched := false
	for i := range routes {
		rt := &routes[i]
		if len(rt.pattern) != len(segs) {
			continue
		}
		ok := true
		for j, p := range rt.pattern {
			if !strings.HasPrefix(p, ":") && p != segs[j] {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		pathMatched = true
		if rt.method == method {
			return rt, true
		}
	}
	return nil, pathMatched
}

// ServeHTTP serves /api/v4 and the control API under /-/sim/.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	escaped := r.URL.EscapedPath()
	switch {
	case strings.HasPrefix(escaped, "/-/sim/"):
		s.serveControl(w, r, strings.TrimPrefix(escaped, "/-/sim/"))
		return
	case strings.HasPrefix(escaped, "/api/v4/"):
	default:
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "404 Not Found"}, nil)
		return
	}
	raw := strings.Split(strings.TrimPrefix(escaped, "/api/v4/"), "/")
	segs := make([]string, len(raw))
	for i, sg := range raw {
		u, err := url.PathUnescape(sg)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "invalid path"}, nil)
			return
		}
		segs[i] = u
	}
	rt, pathOK := matchRoute(r.Method, segs)
	routeName := "unknown"
	if rt != nil {
		routeName = rt.name
	}
	call := Call{Method: r.Method, Route: routeName, Path: escaped, At: time.Now()}

	if f := s.takeFault(r.Method, routeName, escaped); f != nil {
		call.Fault = true
		if f.Latency > 0 {
			select {
			case <-time.After(f.Latency):
			case <-r.Context().Done():
				s.record(call)
				return
			}
		}
		if !f.AfterWork && (f.Drop || f.Status != 0) {
			if f.Drop {
				s.record(call)
				hijackClose(w)
				return
			}
			call.Status = f.Status
			s.record(call)
			writeFault(w, f)
			return
		}
		if f.AfterWork && (f.Drop || f.Status != 0) {
			rec := httptest.NewRecorder()
			call.Params = s.serveAPI(rec, r, rt, pathOK, segs)
			if f.Drop {
				s.record(call)
				hijackClose(w)
				return
			}
			call.Status = f.Status
			s.record(call)
			writeFault(w, f)
			return
		}
	}
	sw := &statusWriter{ResponseWriter: w}
	call.Params = s.serveAPI(sw, r, rt, pathOK, segs)
	call.Status = sw.status
	s.record(call)
}

func (s *Sim) record(c Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func hijackClose(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

func writeFault(w http.ResponseWriter, f *Fault) {
	for k, v := range f.Headers {
		w.Header().Set(k, v)
	}
	body := f.Body
	if body == "" {
		b, _ := json.Marshal(map[string]any{"message": fmt.Sprintf("%d %s", f.Status, http.StatusText(f.Status))})
		body = string(b)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json")
	}
	w.WriteHeader(f.Status)
	_, _ = io.WriteString(w, body)
}

func writeJSON(w http.ResponseWriter, status int, body any, headers http.Header) {
	for k, vs := range headers {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if body != nil {
		_ = json.NewEncoder(w).Encode(body)
	}
}

// serveAPI authenticates, parses and runs one API call under the simulator's lock. It
// returns the names of the parameters the call carried (sorted), for Call.Params.
func (s *Sim) serveAPI(w http.ResponseWriter, r *http.Request, rt *route, pathOK bool, segs []string) (names []string) {
	if !s.authorized(r) {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "401 Unauthorized"}, nil)
		return nil
	}
	if rt == nil {
		if pathOK {
			writeJSON(w, http.StatusMethodNotAllowed, map[string]any{"error": "405 Not Allowed"}, nil)
			return nil
		}
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "404 Not Found"}, nil)
		return nil
	}
	params, perr := parseParams(r)
	if perr != nil {
		writeJSON(w, perr.status, perr.body, nil)
		return nil
	}
	for k := range params {
		names = append(names, k)
	}
	sort.Strings(names)
	q := &req{r: r, method: r.Method, segs: segs, params: params}
	s.mu.Lock()
	if len(segs) >= 2 && segs[0] == "projects" {
		q.proj = s.projectLocked(segs[1])
		if q.proj == nil {
			s.mu.Unlock()
			writeJSON(w, http.StatusNotFound, map[string]any{"message": "404 Project Not Found"}, nil)
			return names
		}
	}
	rep, aerr := rt.h(s, q)
	s.mu.Unlock()
	if aerr != nil {
		writeJSON(w, aerr.status, aerr.body, nil)
		return names
	}
	writeJSON(w, rep.status, rep.body, rep.headers)
	return names
}

func (s *Sim) authorized(r *http.Request) bool {
	if t := r.Header.Get("PRIVATE-TOKEN"); t != "" {
		return t == s.opts.Token
	}
	if a := r.Header.Get("Authorization"); strings.HasPrefix(a, "Bearer ") {
		return strings.TrimPrefix(a, "Bearer ") == s.opts.Token
	}
	return false
}

// parseParams merges the query string with a JSON or form body, as Grape does.
func parseParams(r *http.Request) (map[string]any, *apiError) {
	out := map[string]any{}
	for k, vs := range r.URL.Query() {
		key := strings.TrimSuffix(k, "[]")
		if len(vs) == 1 && key == k {
			out[key] = vs[0]
			continue
		}
		arr := make([]any, len(vs))
		for i, v := range vs {
			arr[i] = v
		}
		out[key] = arr
	}
	if r.Body == nil {
		return out, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 256<<20))
	if err != nil {
		return nil, validationErr("could not read body")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return out, nil
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "application/x-www-form-urlencoded":
		vals, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, validationErr("invalid form body")
		}
		for k, vs := range vals {
			out[strings.TrimSuffix(k, "[]")] = vs[0]
		}
	default:
		var m map[string]any
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return nil, &apiError{status: http.StatusBadRequest, body: map[string]any{"error": "The provided content-type 'application/json' is not supported."}}
		}
		for k, v := range m {
			out[k] = v
		}
	}
	return out, nil
}

func (q *req) str(k string) (string, bool) {
	v, ok := q.params[k]
	if !ok || v == nil {
		return "", false
	}
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return fmt.Sprint(v), true
}

func (q *req) boolean(k string) bool {
	s, ok := q.str(k)
	if !ok {
		return false
	}
	b, _ := strconv.ParseBool(s)
	return b
}

func (q *req) integer(k string, def int64) int64 {
	s, ok := q.str(k)
	if !ok {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return def
	}
	return n
}

// list reads an array parameter given as a JSON array or a comma-separated string.
func (q *req) list(k string) ([]string, bool) {
	v, ok := q.params[k]
	if !ok || v == nil {
		return nil, false
	}
	var out []string
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			out = append(out, strings.Split(fmt.Sprint(e), ",")...)
		}
	default:
		s, _ := q.str(k)
		if s == "" {
			return []string{}, true
		}
		out = strings.Split(s, ",")
	}
	clean := out[:0]
	for _, l := range out {
		if l = strings.TrimSpace(l); l != "" {
			clean = append(clean, l)
		}
	}
	return clean, true
}

// missing reports Grape's "x is missing" for required parameters.
func (q *req) missing(keys ...string) *apiError {
	var miss []string
	for _, k := range keys {
		if v, ok := q.params[k]; !ok || v == nil {
			miss = append(miss, k+" is missing")
		}
	}
	if len(miss) > 0 {
		return validationErr(strings.Join(miss, ", "))
	}
	return nil
}

// paginate cuts items into an offset page and sets GitLab's pagination headers.
func paginate[T any](q *req, items []T, withTotals bool) ([]T, http.Header) {
	per := q.integer("per_page", 20)
	if per < 1 {
		per = 20
	}
	if per > 100 {
		per = 100
	}
	page := q.integer("page", 1)
	if page < 1 {
		page = 1
	}
	total := int64(len(items))
	pages := (total + per - 1) / per
	if pages == 0 {
		pages = 1
	}
	start := (page - 1) * per
	end := min(start+per, total)
	var out []T
	if start < total {
		out = items[start:end]
	}
	h := http.Header{}
	h.Set("X-Page", strconv.FormatInt(page, 10))
	h.Set("X-Per-Page", strconv.FormatInt(per, 10))
	h.Set("X-Next-Page", "")
	h.Set("X-Prev-Page", "")
	links := []string{}
	if page > 1 {
		h.Set("X-Prev-Page", strconv.FormatInt(page-1, 10))
		links = append(links, linkTo(q, map[string]string{"page": strconv.FormatInt(page-1, 10)}, "prev"))
	}
	if end < total {
		h.Set("X-Next-Page", strconv.FormatInt(page+1, 10))
		links = append(links, linkTo(q, map[string]string{"page": strconv.FormatInt(page+1, 10)}, "next"))
	}
	links = append(links, linkTo(q, map[string]string{"page": "1"}, "first"))
	if withTotals {
		h.Set("X-Total", strconv.FormatInt(total, 10))
		h.Set("X-Total-Pages", strconv.FormatInt(pages, 10))
		links = append(links, linkTo(q, map[string]string{"page": strconv.FormatInt(pages, 10)}, "last"))
	}
	h.Set("Link", strings.Join(links, ", "))
	if out == nil {
		out = []T{}
	}
	return out, h
}

// linkTo builds a Link header entry for the same request with some query values
// replaced.
func linkTo(q *req, set map[string]string, rel string) string {
	u := *q.r.URL
	u.Scheme = "http"
	if q.r.TLS != nil {
		u.Scheme = "https"
	}
	u.Host = q.r.Host
	vals := u.Query()
	for k, v := range set {
		vals.Set(k, v)
	}
	u.RawQuery = vals.Encode()
	return "<" + u.String() + ">; rel=\"" + rel + "\""
}
