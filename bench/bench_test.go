package bench

// Go benchmarks of the same measurements as cmd/benchrun, for `go test -bench`:
//
//	go test -run '^$' -bench . -benchtime 3s ./bench/
//
// They only run with -bench (there are no tests here, and no TestMain), so a plain
// `go test ./...` compiles this package and returns at once. Each benchmark creates
// and drops its own database; without a reachable server it is skipped.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

func benchDB(b *testing.B, what string) *DB {
	b.Helper()
	d, err := NewDB(context.Background(), what)
	if err != nil {
		b.Skipf("no database server (BATCHERD_TEST_DSN): %v", err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

// parallel splits b.N calls of fn over clients goroutines and reports ops/s.
func parallel(b *testing.B, clients int, fn func(ctx context.Context, w, i int) error) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	t0 := time.Now()
	for w := 0; w < clients; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				if err := fn(ctx, w, i); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "ops/s")
}

var benchClients = []int{1, 8, 32}

// BenchmarkRawInsert is the ceiling: single-row autocommit INSERTs of operation rows.
func BenchmarkRawInsert(b *testing.B) {
	d := benchDB(b, "gobench_raw")
	for _, c := range benchClients {
		b.Run(fmt.Sprintf("clients=%d", c), func(b *testing.B) {
			db, err := d.Raw(c)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			run := uuid.NewString()[:8]
			parallel(b, c, func(ctx context.Context, w, i int) error {
				_, err := db.ExecContext(ctx, `INSERT INTO operation (operation_id, subject, target, repo, action, status)
					VALUES (?, ?, 'db/bench', 'bench/raw', 'grant', 'queued')`, uuid.NewString(), fmt.Sprintf("raw-%s-%d", run, i))
				return err
			})
		})
	}
}

// BenchmarkAdmissionStore is OperationCreate in each admission mode.
func BenchmarkAdmissionStore(b *testing.B) {
	d := benchDB(b, "gobench_store")
	st, err := d.Open(context.Background(), 20)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for _, m := range []AdmitMode{AdmitSerial, AdmitSingle, AdmitGrouped} {
		for _, c := range benchClients {
			b.Run(fmt.Sprintf("mode=%s/clients=%d", m, c), func(b *testing.B) {
				st.SetAdmitOptions(m.Options(c))
				run := uuid.NewString()[:8]
				parallel(b, c, func(ctx context.Context, w, i int) error {
					_, _, err := m.Create(ctx, st, AdmissionParams("bench/store", fmt.Sprintf("gb-%s-%d", run, i)))
					return err
				})
			})
		}
	}
}

// BenchmarkAdmissionAPI is POST /v1/operations over loopback HTTP.
func BenchmarkAdmissionAPI(b *testing.B) {
	d := benchDB(b, "gobench_api")
	st, err := d.Open(context.Background(), 20)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for _, m := range []AdmitMode{AdmitSerial, AdmitGrouped} {
		for _, c := range benchClients {
			b.Run(fmt.Sprintf("mode=%s/clients=%d", m, c), func(b *testing.B) {
				srv, err := NewAPIServer(m.Use(st, c), "bench/api")
				if err != nil {
					b.Fatal(err)
				}
				defer srv.Close()
				cl := NewAPIClient(srv.URL, srv.Token, c)
				defer cl.Close()
				run := uuid.NewString()[:8]
				parallel(b, c, func(ctx context.Context, w, i int) error {
					_, err := cl.Admit(ctx, "bench/api", fmt.Sprintf("ga-%s-%d", run, i))
					return err
				})
			})
		}
	}
}

// BenchmarkClaim claims 1,000 out of a waiting set of 10,000 (undone after each claim)
// and reports the statements one claim sends.
func BenchmarkClaim(b *testing.B) {
	rig, err := NewClaimRig(context.Background(), 1000)
	if err != nil {
		b.Skipf("no database server (BATCHERD_TEST_DSN): %v", err)
	}
	defer rig.Close()
	ctx := context.Background()
	if _, err := rig.Grow(ctx, 10000); err != nil {
		b.Fatal(err)
	}
	var stmts Statements
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		d, s, _, err := rig.Claim(ctx, 1000)
		if err != nil {
			b.Fatal(err)
		}
		total += d
		stmts = s
	}
	b.StopTimer()
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/claim")
	b.ReportMetric(float64(stmts.Total), "statements/claim")
}

// BenchmarkSettle settles batches of 1,000 as merged and reports its statements.
func BenchmarkSettle(b *testing.B) {
	d := benchDB(b, "gobench_settle")
	ctx := context.Background()
	var total time.Duration
	var stmts int64
	for range b.N {
		r, err := Settlement(ctx, d, 1000, true) // ns/op includes loading and claiming the batch
		if err != nil {
			b.Fatal(err)
		}
		total += r.Time
		stmts = r.Statements.Total
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/settle")
	b.ReportMetric(float64(stmts), "statements/settle")
}
