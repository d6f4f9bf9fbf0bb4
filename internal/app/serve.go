package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/scanner"
	"github.com/batcherd/batcherd/internal/store"
)

// App is one running replica: store, GitLab client, scanner loops and HTTP server.
type App struct {
	cfg      *config.Config
	log      *slog.Logger
	st       *store.Store
	gl       *mr.Client
	sc       *scanner.Scanner
	reg      *prometheus.Registry
	srv      *http.Server
	ln       net.Listener
	draining chan struct{}
	// bg bounds the API's background work (the metrics' history count); Run ends it
	// after the HTTP drain, before the pool closes.
	bg     context.Context
	stopBg context.CancelFunc
}

// Serve runs one replica until ctx ends (SIGTERM/SIGINT), then stops gracefully.
func Serve(ctx context.Context, cfg *config.Config, env Env) error {
	a, err := New(ctx, cfg, env)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// logConfiguration logs the effective configuration, secrets masked, so an operator can
// see what a replica actually runs with.
func logConfiguration(log *slog.Logger, cfg *config.Config) {
	red := cfg.Redacted()
	keys := make([]string, 0, len(red))
	for k := range red {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		attrs = append(attrs, k, red[k])
	}
	log.Info("configuration", attrs...)
}

// newRegistry is the replica's own metrics registry (never the global default: tests
// run several replicas in one process) with the runtime's, the store's and build_info.
func newRegistry(version string) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(store.Collectors()...)
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "batcherd_build_info", Help: "Always 1; labels carry the version."}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	reg.MustRegister(buildInfo)
	return reg
}

// New builds a replica and binds its listener (":0" picks a free port; see Addr). It
// refuses to start on schema drift (I8) with ErrSchemaDrift.
func New(ctx context.Context, cfg *config.Config, env Env) (*App, error) {
	log := env.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("replica", cfg.ReplicaID)
	logConfiguration(log, cfg)
	if cfg.InsecureNoAuth {
		log.Warn("BATCHERD_INSECURE_NO_AUTH=true: the API accepts requests without a token; never run like this in production")
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, st, log); err != nil {
		st.Close()
		return nil, err
	}
	// Every configured repository has its pause row before this replica claims: the
	// claim orders itself against a pause by locking that row (store.RepoControlEnsure).
	if err := st.RepoControlEnsure(ctx, cfg.Repos); err != nil {
		st.Close()
		return nil, fmt.Errorf("creating the repositories' control rows: %w", err)
	}
	gl, err := mr.New(mr.Config{BaseURL: cfg.GitLabURL, Token: cfg.GitLabToken, CallTimeout: cfg.GitLabTimeout, TargetBranch: cfg.TargetBranch})
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("GitLab client: %w", err)
	}

	reg := newRegistry(env.Version)

	scfg := scannerConfig(cfg)
	if env.TuneScanner != nil {
		env.TuneScanner(&scfg)
	}
	sc := scanner.New(scfg, st, gl, log, reg)
	pctx, cancelPre := context.WithTimeout(ctx, 2*time.Minute)
	seen, err := preflight(pctx, gl, cfg.Repos, log)
	cancelPre()
	if err != nil {
		st.Close()
		return nil, err
	}
	for repo, rerr := range seen {
		sc.ObserveGitLab(repo, rerr)
	}

	a := &App{cfg: cfg, log: log, st: st, gl: gl, sc: sc, reg: reg, draining: make(chan struct{})}
	a.bg, a.stopBg = context.WithCancel(context.WithoutCancel(ctx))
	handler, err := a.handler()
	if err != nil {
		a.stopBg()
		st.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		a.stopBg()
		st.Close()
		return nil, fmt.Errorf("BATCHERD_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	a.ln = ln
	a.srv = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return a, nil
}

// scannerConfig is the scanner's part of cfg.
func scannerConfig(cfg *config.Config) scanner.Config {
	return scanner.Config{
		Repos:             cfg.Repos,
		TargetBranch:      cfg.TargetBranch,
		ClaimSchedule:     cfg.ClaimSchedule,
		MaxBatchSize:      cfg.MaxBatchSize,
		MergeMode:         scanner.MergeMode(cfg.MergeMode),
		ReplicaID:         cfg.ReplicaID,
		ReconcileInterval: cfg.ReconcileInterval,
		BatchTimeout:      cfg.BatchTimeout,
		DriftInterval:     driftOrOff(cfg.DriftInterval),
		ShutdownTimeout:   cfg.ShutdownTimeout,
		OnFailure:         scanner.FailureMode(cfg.OnFailure),
		InfraRetries:      retriesOrNone(cfg.InfraRetries),
		ConflictRetries:   retriesOrNone(cfg.ConflictRetries),
		FlakeRetries:      retriesOrNone(cfg.FlakeRetries),
		NoBisect:          !cfg.Bisect,
		MaxAttempts:       cfg.MaxAttempts,
		EventReceivers:    cfg.EventReceivers(),
		EventSecret:       cfg.EventsSecret,
		OutboxTimeout:     cfg.EventsTimeout,
		OutboxLease:       3 * cfg.EventsTimeout,
	}
}

// Addr is the address the HTTP server listens on.
func (a *App) Addr() string { return a.ln.Addr().String() }

// Store exposes the store (tests).
func (a *App) Store() *store.Store { return a.st }

// Scanner exposes the scanner (tests).
func (a *App) Scanner() *scanner.Scanner { return a.sc }

// Run serves HTTP and runs the loops until ctx ends, then shuts down: readiness fails
// first, the HTTP server stops accepting and drains, the loops finish or abandon their
// current step, all within BATCHERD_SHUTDOWN_TIMEOUT; the pool closes last.
func (a *App) Run(ctx context.Context) error {
	defer a.st.Close()
	a.log.Info("batcherd serving", "addr", a.Addr(), "repos", a.cfg.Repos, "merge_mode", a.cfg.MergeMode)
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.srv.Serve(a.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("http server: %w", err)
		}
	})
	scCtx, stopScanner := context.WithCancel(ctx)
	defer stopScanner()
	wg.Go(func() {
		if err := a.sc.Run(scCtx); err != nil && !errors.Is(err, context.Canceled) {
			errc <- fmt.Errorf("scanner: %w", err)
		}
	})

	var runErr error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout)
	case runErr = <-errc:
		a.log.Error("stopping after a fatal error", "err", runErr)
	}
	close(a.draining)
	stopScanner()
	shCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	// The HTTP drain gets half the budget: http.Server.Shutdown also waits for
	// connections that were opened but never sent a request, which must not starve the
	// loops of their time. What is still open after that is closed.
	httpCtx, cancelHTTP := context.WithTimeout(shCtx, a.cfg.ShutdownTimeout/2)
	defer cancelHTTP()
	if err := a.srv.Shutdown(httpCtx); err != nil {
		a.log.Debug("closing HTTP connections that did not drain", "err", err)
		a.srv.Close()
	}
	a.stopBg()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-shCtx.Done():
		// Both may be ready at once; only warn when the loops really are still running.
		select {
		case <-done:
		default:
			a.log.Warn("loops did not stop within the shutdown timeout; exiting anyway (every step is resumable)")
		}
	}
	a.log.Info("stopped")
	return runErr
}

// retriesOrNone maps a configured retry count to scanner.Config's convention, where
// zero takes the default and a negative count means none.
func retriesOrNone(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// driftOrOff maps BATCHERD_DRIFT_INTERVAL to scanner.Config's convention, where zero
// takes the default and a negative interval turns the drift loop off.
func driftOrOff(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
