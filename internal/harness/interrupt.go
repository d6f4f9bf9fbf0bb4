package harness

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// InterruptContext returns a context cancelled by the first SIGINT/SIGTERM, so a
// program can stop what it started in order. A second signal while it cleans up kills
// every process the harness started at once and exits 130.
func InterruptContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		KillAll()
		os.Exit(130)
	}()
	return ctx, stop
}
