package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// How often a scrape reads the database. Several Prometheus servers (or a fast scrape
// interval) must not turn into a query load, and the two samples cost differently:
// the live one (operations in flight, the waiting set) reads rows bounded by the work in
// flight and is taken in the scrape; counting finished operations reads their whole
// history (0.6 s for 2M rows here), so it runs in the background once a minute with
// a longer deadline, and a scrape serves its last result instead of waiting for it.
const (
	dbSampleTTL           = 5 * time.Second
	dbSampleTimeout       = 2 * time.Second
	historySampleTTL      = time.Minute
	historySampleTimeout  = 30 * time.Second
	historyFirstSampleMax = time.Second // how long the first scrapes wait for the first count
)

type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	webhooks *prometheus.CounterVec
	db       *dbCollector
}

func newHTTPMetrics(reg prometheus.Registerer, s *Server) (*httpMetrics, error) {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_http_requests_total",
			Help: "HTTP requests by route (method and pattern) and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "batcherd_http_request_duration_seconds",
			Help:    "HTTP request duration by route.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"route"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "batcherd_webhook_events_total",
			Help: "Authenticated GitLab webhook events by result (marked_due, ignored, error).",
		}, []string{"result"}),
		db: newDBCollector(s),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.webhooks, m.db} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// statusRecorder captures the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code int
	// principal is the name of the principal the request acted as, set once it is
	// authenticated ("" for public routes and refused credentials).
	principal string
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// instrument counts and times requests under a fixed route label (the registered
// pattern, never the raw path, so label cardinality stays bounded).
func (s *Server) instrument(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w}
		defer func() {
			code := rec.code
			if code == 0 {
				code = http.StatusOK
			}
			d := time.Since(start)
			s.m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
			s.m.duration.WithLabelValues(route).Observe(d.Seconds())
			s.logRequest(r, route, code, d, rec.principal)
		}()
		h.ServeHTTP(rec, r)
	})
}

func metricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		Registry:      reg,
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// dbCollector samples the database at scrape time: operations by status and the
// waiting set per repository (see dbSampleTTL for the two clocks).
type dbCollector struct {
	s          *Server
	opsDesc    *prometheus.Desc
	depthDesc  *prometheus.Desc
	oldestDesc *prometheus.Desc
	expDesc    *prometheus.Desc
	errDesc    *prometheus.Desc
	pausedDesc *prometheus.Desc
	strayDesc  *prometheus.Desc
	// The clocks of dbSampleTTL's comment (fields so tests can run them faster).
	liveTTL, historyTTL, historyTimeout time.Duration

	mu         sync.Mutex
	at         time.Time
	live       map[domain.OpStatus]int64 // nil: the last live sample failed
	waiting    []store.RepoWaiting
	expired    int64
	paused     map[string]store.RepoControl
	liveFailed bool
	strays     []store.Stray // from the history sample; nil: none counted yet

	historyAt      time.Time                 // when the last count started
	history        map[domain.OpStatus]int64 // nil: no count yet, or the last one failed
	historyFailed  bool
	historyRunning chan struct{} // closed when the count in flight ends; nil: none
}

func newDBCollector(s *Server) *dbCollector {
	return &dbCollector{
		s:          s,
		opsDesc:    prometheus.NewDesc("batcherd_operations", "Operations by status (sampled from the database; finished statuses once a minute).", []string{"status"}, nil),
		depthDesc:  prometheus.NewDesc("batcherd_waiting_depth", "Operations waiting to be claimed, per repository.", []string{"repo"}, nil),
		oldestDesc: prometheus.NewDesc("batcherd_waiting_oldest_age_seconds", "Age of the oldest waiting operation per repository (database clock).", []string{"repo"}, nil),
		expDesc: prometheus.NewDesc("batcherd_bindings_expired_active",
			"Active bindings past their expires_at: expiry has not revoked them yet, or their revoke failed and waits for an operator.", nil, nil),
		errDesc: prometheus.NewDesc("batcherd_metrics_sample_failed", "1 when the last database sample for metrics failed.", nil, nil),
		pausedDesc: prometheus.NewDesc("batcherd_repo_paused",
			"1 while the repository is paused (a pause with an end time reads 0 once it has passed, by the database clock).", []string{"repo"}, nil),
		strayDesc: prometheus.NewDesc("batcherd_waiting_strays",
			"Waiting rows whose operation is not queued, per repository: the claim skips them; batcherd verify names them (sampled with the finished-operation counts).", []string{"repo"}, nil),
		liveTTL: dbSampleTTL, historyTTL: historySampleTTL, historyTimeout: historySampleTimeout,
	}
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.opsDesc
	ch <- c.depthDesc
	ch <- c.oldestDesc
	ch <- c.expDesc
	ch <- c.errDesc
	ch <- c.pausedDesc
	ch <- c.strayDesc
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	if first := c.refresh(); first != nil {
		select {
		case <-first:
		case <-time.After(historyFirstSampleMax):
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	failed := 0.0
	if c.liveFailed || c.historyFailed {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.errDesc, prometheus.GaugeValue, failed)
	for _, counts := range []map[domain.OpStatus]int64{c.live, c.history} {
		for st, n := range counts {
			ch <- prometheus.MustNewConstMetric(c.opsDesc, prometheus.GaugeValue, float64(n), string(st))
		}
	}
	if c.strays != nil {
		n := map[string]int{}
		for _, r := range c.s.cfg.Repos {
			n[r] = 0
		}
		for _, st := range c.strays {
			n[st.Repo]++
		}
		for repo, k := range n {
			ch <- prometheus.MustNewConstMetric(c.strayDesc, prometheus.GaugeValue, float64(k), repo)
		}
	}
	if c.live == nil {
		return // no live sample: no numbers rather than made-up zeros
	}
	for _, repo := range c.s.cfg.Repos {
		v := 0.0
		if c.paused[repo].Paused {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.pausedDesc, prometheus.GaugeValue, v, repo)
	}
	ch <- prometheus.MustNewConstMetric(c.expDesc, prometheus.GaugeValue, float64(c.expired))
	seen := map[string]bool{}
	for _, w := range c.waiting {
		seen[w.Repo] = true
		ch <- prometheus.MustNewConstMetric(c.depthDesc, prometheus.GaugeValue, float64(w.Depth), w.Repo)
		ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, w.OldestAge, w.Repo)
	}
	for _, repo := range c.s.cfg.Repos { // configured repositories with nothing waiting
		if !seen[repo] {
			ch <- prometheus.MustNewConstMetric(c.depthDesc, prometheus.GaugeValue, 0, repo)
			ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, 0, repo)
		}
	}
}

// refresh takes the live sample when it is stale and starts a count of finished
// operations when that is. It returns the count's done channel while no count has
// ever succeeded, so the first scrapes after a start show every status if the count is
// quick, and wait at most historyFirstSampleMax if it is not.
func (c *dbCollector) refresh() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > c.liveTTL {
		c.sampleLive()
	}
	if c.historyRunning == nil && time.Since(c.historyAt) > c.historyTTL {
		c.historyAt = time.Now()
		done := make(chan struct{})
		c.historyRunning = done
		go c.sampleHistory(done, c.historyTimeout)
	}
	if c.history == nil && !c.historyFailed {
		return c.historyRunning
	}
	return nil
}

// sampleLive refreshes the live numbers (c.mu held). On failure it drops the old
// ones: stale gauges would hide the outage the failure metric reports.
func (c *dbCollector) sampleLive() {
	ctx, cancel := context.WithTimeout(c.s.bg, dbSampleTimeout)
	defer cancel()
	c.at = time.Now()
	counts, err1 := c.s.st.OperationCounts(ctx, domain.LiveOpStatuses...)
	waiting, err2 := c.s.st.WaitingStats(ctx)
	expired, err3 := c.s.st.BindingsExpiredActive(ctx)
	paused, err4 := c.s.st.RepoControls(ctx, c.s.cfg.Repos)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		if c.s.bg.Err() == nil {
			c.s.log.Warn("metrics: database sample failed", "err", err)
		}
		c.live, c.waiting, c.liveFailed = nil, nil, true
		return
	}
	c.live, c.waiting, c.expired, c.paused, c.liveFailed = counts, waiting, expired, paused, false
}

// sampleHistory counts finished operations (in its own goroutine) and closes done.
func (c *dbCollector) sampleHistory(done chan struct{}, timeout time.Duration) {
	defer close(done)
	ctx, cancel := context.WithTimeout(c.s.bg, timeout)
	defer cancel()
	counts, err := c.s.st.OperationCounts(ctx, domain.FinishedOpStatuses...)
	// Strays read the whole waiting set: sampled on this slow clock, not the live one.
	strays, serr := c.s.st.WaitingStrays(ctx, 1000)
	if serr == nil && len(strays) > 0 {
		c.s.log.Warn("waiting rows whose operation is not queued: the claim skips them; delete them after checking (batcherd verify names them)",
			"count", len(strays), "first_operation", strays[0].OperationID, "first_status", strays[0].Status, "repo", strays[0].Repo)
	}
	c.mu.Lock()
	if serr == nil {
		c.strays = strays
	} else {
		c.strays = nil
	}
	defer c.mu.Unlock()
	c.historyRunning = nil
	if err != nil {
		if c.s.bg.Err() != nil {
			return // shutting down: not a failure of the database
		}
		c.s.log.Warn("metrics: counting finished operations failed; the next scrape after retry_in tries again",
			"err", err, "timeout", timeout, "retry_in", c.historyTTL)
		c.history, c.historyFailed = nil, true
		return
	}
	c.history, c.historyFailed = counts, false
}
