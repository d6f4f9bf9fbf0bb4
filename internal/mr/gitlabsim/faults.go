package gitlabsim

import (
	"strings"
	"time"
)

// Fault makes matching API calls misbehave. A call matches when Method (empty: any),
// Route (the route template without /api/v4, e.g. "/projects/:id/merge_requests";
// empty: any) and PathContains (a substring of the escaped request path; empty: any)
// all match.
//
// What happens to a matching call, in order: wait Latency; then, without AfterWork,
// answer Status (with Headers and Body) or drop the connection (Drop) instead of
// doing the work; with AfterWork, do the work first and then answer Status or drop
// the connection, so the client never learns the work was done. A fault with only
// Latency delays the call and lets it through.
type Fault struct {
	Method       string            `json:"method,omitempty"`
	Route        string            `json:"route,omitempty"`
	PathContains string            `json:"path_contains,omitempty"`
	Status       int               `json:"status,omitempty"`
	Body         string            `json:"body,omitempty"` // default {"message":"<status> <text>"}
	Headers      map[string]string `json:"headers,omitempty"`
	Latency      time.Duration     `json:"-"`
	LatencyMS    int64             `json:"latency_ms,omitempty"`
	AfterWork    bool              `json:"after_work,omitempty"`
	Drop         bool              `json:"drop,omitempty"`
	// Skip lets this many matching calls through before the fault applies.
	Skip int `json:"skip,omitempty"`
	// Count is how many calls the fault applies to; 0 means every matching call
	// until ClearFaults.
	Count int `json:"count,omitempty"`
}

type fault struct {
	id      int64
	f       Fault
	seen    int // matching calls seen
	applied int
}

// FaultState reports a fault and how often it applied.
type FaultState struct {
	ID      int64 `json:"id"`
	Fault   Fault `json:"fault"`
	Applied int   `json:"applied"`
}

func (f *fault) state() FaultState {
	fs := f.f
	fs.LatencyMS = fs.Latency.Milliseconds()
	return FaultState{ID: f.id, Fault: fs, Applied: f.applied}
}

func (f *fault) matches(method, route, path string) bool {
	if f.f.Method != "" && !strings.EqualFold(f.f.Method, method) {
		return false
	}
	if f.f.Route != "" && f.f.Route != route {
		return false
	}
	if f.f.PathContains != "" && !strings.Contains(path, f.f.PathContains) {
		return false
	}
	return true
}

// InjectFault adds a fault and returns its id.
func (s *Sim) InjectFault(f Fault) int64 {
	if f.Latency == 0 && f.LatencyMS > 0 {
		f.Latency = time.Duration(f.LatencyMS) * time.Millisecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextFault++
	s.faults = append(s.faults, &fault{id: s.nextFault, f: f})
	return s.nextFault
}

// ClearFaults removes every fault.
func (s *Sim) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// FaultApplied is how many calls fault id affected.
func (s *Sim) FaultApplied(id int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		if f.id == id {
			return f.applied
		}
	}
	return 0
}

// takeFault returns the fault that applies to this call, consuming one use of it.
func (s *Sim) takeFault(method, route, path string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		if !f.matches(method, route, path) {
			continue
		}
		if f.f.Count > 0 && f.applied >= f.f.Count {
			continue
		}
		f.seen++
		if f.seen <= f.f.Skip {
			continue
		}
		f.applied++
		cp := f.f
		return &cp
	}
	return nil
}
