package harness

import (
	"context"
	"testing"
)

// StartT starts a cluster for a test and closes it when the test ends. On failure
// it logs the tail of every process's log.
func StartT(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	if opts.Logf == nil {
		opts.Logf = tb.Logf
	}
	if opts.LogDir == "" {
		opts.LogDir = tb.TempDir()
	}
	c, err := Start(context.Background(), opts)
	if err != nil {
		tb.Fatalf("harness: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("process logs (tail):\n%s", c.LogTail(40))
		}
		if err := c.Close(); err != nil {
			tb.Errorf("harness close: %v", err)
		}
	})
	return c
}
