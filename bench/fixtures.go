package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"

	"github.com/google/uuid"
)

// Load describes rows to bulk-load with multi-row INSERTs, bypassing the store: queued
// grant operations of one repository with their waiting rows (as admission leaves
// them) and, when Bindings, their pending bindings (what settlement needs).
type Load struct {
	Repo     string
	N        int
	Bindings bool
	// OpsFirst limits the operation (and binding) rows to the first OpsFirst waiting
	// rows (0: all). A claim reads only the oldest rows, so a huge waiting set needs
	// operations only for those.
	OpsFirst int
	Workers  int // parallel connections (default 4)
	Chunk    int // rows per statement (default 1000)

	waitingOnly bool // no operation rows at all
}

// BulkLoad loads l and returns the operation ids in insertion order of their chunks.
func BulkLoad(ctx context.Context, db *sql.DB, l Load) ([]string, error) {
	if l.Workers <= 0 {
		l.Workers = 4
	}
	if l.Chunk <= 0 {
		l.Chunk = 1000
	}
	if l.waitingOnly {
		l.OpsFirst = 0
	} else if l.OpsFirst <= 0 || l.OpsFirst > l.N { // 0: all
		l.OpsFirst = l.N
	}
	// Time-ordered (version 7) ids: the fixture appends to uk_operation_id instead of
	// scattering a million random keys over a B-tree larger than the buffer pool,
	// which would measure the loader, not batcherd.
	ids := make([]string, l.N)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7()).String()
	}
	prefix := uuid.NewString()[:8]
	// The rows that get operations go first, serially, so that they are the oldest.
	if err := loadRange(ctx, db, l, ids, prefix, 0, l.OpsFirst, true, 1); err != nil {
		return nil, err
	}
	if err := loadRange(ctx, db, l, ids, prefix, l.OpsFirst, l.N, false, l.Workers); err != nil {
		return nil, err
	}
	return ids, nil
}

func loadRange(ctx context.Context, db *sql.DB, l Load, ids []string, prefix string, lo, hi int, withOps bool, workers int) error {
	chunks := make(chan [2]int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for c := range chunks {
				if err := loadChunk(ctx, db, l, ids, prefix, c[0], c[1], withOps); err != nil {
					errs <- err
					for range chunks {
					}
					return
				}
			}
		})
	}
	for i := lo; i < hi; i += l.Chunk {
		chunks <- [2]int{i, min(i+l.Chunk, hi)}
	}
	close(chunks)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func loadChunk(ctx context.Context, db *sql.DB, l Load, ids []string, prefix string, lo, hi int, withOps bool) error {
	n := hi - lo
	var q strings.Builder
	args := make([]any, 0, 6*n)
	if withOps {
		q.WriteString("INSERT INTO operation (operation_id, subject, target, repo, action, status) VALUES ")
		for i := lo; i < hi; i++ {
			if i > lo {
				q.WriteByte(',')
			}
			q.WriteString("(?,?,?,?,'grant','queued')")
			args = append(args, ids[i], fmt.Sprintf("load-%s-%d", prefix, i), "db/bench", l.Repo)
		}
		if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("load operations: %w", err)
		}
		if l.Bindings {
			q.Reset()
			args = args[:0]
			q.WriteString("INSERT INTO binding (subject, target, repo, status, operation_id) VALUES ")
			for i := lo; i < hi; i++ {
				if i > lo {
					q.WriteByte(',')
				}
				q.WriteString("(?,?,?,'pending',?)")
				args = append(args, fmt.Sprintf("load-%s-%d", prefix, i), "db/bench", l.Repo, ids[i])
			}
			if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
				return fmt.Errorf("load bindings: %w", err)
			}
		}
	}
	q.Reset()
	args = args[:0]
	q.WriteString("INSERT INTO merge_batch_request (operation_id, repo) VALUES ")
	for i := lo; i < hi; i++ {
		if i > lo {
			q.WriteByte(',')
		}
		q.WriteString("(?,?)")
		args = append(args, ids[i], l.Repo)
	}
	if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
		return fmt.Errorf("load waiting rows: %w", err)
	}
	return nil
}
