package api

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/batcherd/batcherd/internal/store"
)

// dbSampleTTL bounds how often a scrape queries the database: several Prometheus
// servers (or a fast scrape interval) must not turn into a query load.
const dbSampleTTL = 5 * time.Second

type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	webhooks *prometheus.CounterVec
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
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.webhooks, newDBCollector(s)} {
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
			s.m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
			s.m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
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
// waiting set per repository. Samples are cached for dbSampleTTL.
type dbCollector struct {
	s          *Server
	opsDesc    *prometheus.Desc
	depthDesc  *prometheus.Desc
	oldestDesc *prometheus.Desc
	errDesc    *prometheus.Desc

	mu      sync.Mutex
	at      time.Time
	counts  map[store.OpStatus]int64
	waiting []store.RepoWaiting
	failed  float64 // 1 when the last sample failed
}

func newDBCollector(s *Server) *dbCollector {
	return &dbCollector{
		s:          s,
		opsDesc:    prometheus.NewDesc("batcherd_operations", "Operations by status (sampled from the database).", []string{"status"}, nil),
		depthDesc:  prometheus.NewDesc("batcherd_waiting_depth", "Operations waiting to be claimed, per repository.", []string{"repo"}, nil),
		oldestDesc: prometheus.NewDesc("batcherd_waiting_oldest_age_seconds", "Age of the oldest waiting operation per repository (database clock).", []string{"repo"}, nil),
		errDesc:    prometheus.NewDesc("batcherd_metrics_sample_failed", "1 when the last database sample for metrics failed.", nil, nil),
	}
}

func (c *dbCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.opsDesc
	ch <- c.depthDesc
	ch <- c.oldestDesc
	ch <- c.errDesc
}

func (c *dbCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > dbSampleTTL {
		c.sample()
	}
	ch <- prometheus.MustNewConstMetric(c.errDesc, prometheus.GaugeValue, c.failed)
	for st, n := range c.counts {
		ch <- prometheus.MustNewConstMetric(c.opsDesc, prometheus.GaugeValue, float64(n), string(st))
	}
	seen := map[string]bool{}
	for _, w := range c.waiting {
		seen[w.Repo] = true
		ch <- prometheus.MustNewConstMetric(c.depthDesc, prometheus.GaugeValue, float64(w.Depth), w.Repo)
		ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, w.OldestAge, w.Repo)
	}
	if c.counts == nil {
		return // never sampled successfully: no numbers rather than made-up zeros
	}
	for _, repo := range c.s.cfg.Repos { // configured repositories with nothing waiting
		if !seen[repo] {
			ch <- prometheus.MustNewConstMetric(c.depthDesc, prometheus.GaugeValue, 0, repo)
			ch <- prometheus.MustNewConstMetric(c.oldestDesc, prometheus.GaugeValue, 0, repo)
		}
	}
}

// sample refreshes the cache. On failure it drops the old numbers: stale gauges
// would hide the outage the failure metric reports.
func (c *dbCollector) sample() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.at = time.Now()
	counts, err1 := c.s.st.OperationCounts(ctx)
	waiting, err2 := c.s.st.WaitingStats(ctx)
	if err1 != nil || err2 != nil {
		c.s.log.Warn("metrics: database sample failed", "operations_err", err1, "waiting_err", err2)
		c.counts, c.waiting, c.failed = nil, nil, 1
		return
	}
	c.counts, c.waiting, c.failed = counts, waiting, 0
}
