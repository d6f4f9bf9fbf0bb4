package store_test

// A COMMIT whose answer never arrives: what a client of a Galera writer killed under
// load sees (measured: INSERTs answered "invalid connection" had been committed). A
// proxy between the store and the real server forwards the COMMIT and then cuts the
// connection before the server's answer reaches the driver (the commit happened), or
// cuts it instead of forwarding the COMMIT (nothing happened). Either way the store
// answers ErrCommitUnknown, and what follows must neither lose nor double anything.

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/store"
	"github.com/batcherd/batcherd/internal/store/storetest"

	"github.com/batcherd/batcherd/internal/domain"
)

const (
	cutOff          = iota
	cutAfterCommit  // forward the COMMIT, drop its answer and the connection
	cutBeforeCommit // drop the connection instead of forwarding the COMMIT
)

// commitCutter is a TCP proxy to the test server that cuts the next COMMIT it sees.
type commitCutter struct {
	ln     net.Listener
	target string
	mode   atomic.Int32
	cuts   atomic.Int32
	wg     sync.WaitGroup
}

func newCommitCutter(t *testing.T, target string) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close() })
	return p
}

// arm cuts the next COMMIT (mode cutAfterCommit or cutBeforeCommit).
func (p *commitCutter) arm(mode int32) { p.mode.Store(mode) }

func (p *commitCutter) serve(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	var muted atomic.Bool
	go func() { // server → client, unless muted
		buf := make([]byte, 32<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 && !muted.Load() {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				c.Close()
				return
			}
		}
	}()
	// client → server, packet by packet: 3-byte length, sequence, payload.
	hdr := make([]byte, 4)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(append(hdr[:3:3], 0)))
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			return
		}
		if n > 1 && payload[0] == 0x03 && isCommit(string(payload[1:])) {
			switch mode := p.mode.Load(); {
			case mode == cutBeforeCommit && p.mode.CompareAndSwap(mode, cutOff):
				p.cuts.Add(1)
				return // the server sees the connection end: it rolls back
			case mode == cutAfterCommit && p.mode.CompareAndSwap(mode, cutOff):
				p.cuts.Add(1)
				muted.Store(true)
				_, _ = s.Write(append(hdr, payload...))
				// The server commits and answers; the answer goes nowhere. Wait for it
				// to arrive before the connection ends (a connection closed first could
				// have the server roll the commit back).
				_ = s.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				time.Sleep(300 * time.Millisecond)
				return
			}
		}
		if _, err := s.Write(append(hdr, payload...)); err != nil {
			return
		}
	}
}

// isCommit: a lone COMMIT, or a compound statement that ends with one.
func isCommit(q string) bool {
	up := strings.ToUpper(strings.TrimSpace(q))
	return up == "COMMIT" || strings.Contains(up, "COMMIT;")
}

// cutStore is a store on the test database through a commitCutter.
func cutStore(t *testing.T) (*store.Store, *store.Store, *commitCutter) {
	t.Helper()
	direct, dsn := storetest.New(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Net != "tcp" {
		t.Skipf("the test server is reached over %s; the proxy needs TCP", cfg.Net)
	}
	p := newCommitCutter(t, cfg.Addr)
	cfg.Addr = p.ln.Addr().String()
	return storetest.Open(t, cfg.FormatDSN(), 4), direct, p
}

func opsOf(t *testing.T, st *store.Store, subject string) int {
	t.Helper()
	return btCount(t, st, "SELECT COUNT(*) FROM operation WHERE subject = ?", subject)
}

func grantParams(subject string) store.OperationCreateParams {
	return store.OperationCreateParams{OperationID: uuid.NewString(), Subject: subject, Target: "db/orders",
		Repo: "platform/access", Action: domain.ActionGrant}
}

// TestCommitLostAdmission: an application whose COMMIT answer is lost. With an
// Idempotency-Key the store reads the key again at once and answers the operation it
// wrote (or, when nothing was written, the caller's retry with the key creates it
// once); without a key the caller gets ErrCommitUnknown, and its retry is refused
// (binding busy) instead of becoming a second operation.
func TestCommitLostAdmission(t *testing.T) {
	ctx := context.Background()
	st, direct, p := cutStore(t)

	t.Run("key, committed", func(t *testing.T) {
		params := grantParams("commit-lost-key")
		params.IdempotencyKey, params.Fingerprint = "k-"+params.OperationID, "fp1"
		p.arm(cutAfterCommit)
		op, _, err := st.OperationCreate(ctx, params)
		if p.cuts.Load() == 0 {
			t.Fatal("the proxy never saw the admission's COMMIT")
		}
		if err != nil {
			t.Fatalf("OperationCreate after a lost COMMIT answer: %v (want the operation, read again by its key)", err)
		}
		if op.OperationID != params.OperationID {
			t.Fatalf("answered operation %s, want %s", op.OperationID, params.OperationID)
		}
		again, created, err := st.OperationCreate(ctx, params)
		if err != nil || created || again.OperationID != params.OperationID {
			t.Fatalf("retry with the key = %s created=%v err=%v, want the same operation", again.OperationID, created, err)
		}
		if n := opsOf(t, direct, params.Subject); n != 1 {
			t.Fatalf("%d operations, want 1", n)
		}
	})

	t.Run("key, not committed", func(t *testing.T) {
		params := grantParams("commit-cut-key")
		params.IdempotencyKey, params.Fingerprint = "k-"+params.OperationID, "fp1"
		before := p.cuts.Load()
		p.arm(cutBeforeCommit)
		_, _, err := st.OperationCreate(ctx, params)
		if p.cuts.Load() == before {
			t.Fatal("the proxy never saw the admission's COMMIT")
		}
		if !errors.Is(err, store.ErrCommitUnknown) {
			t.Fatalf("OperationCreate with its COMMIT cut: %v, want ErrCommitUnknown (nothing under the key)", err)
		}
		if n := opsOf(t, direct, params.Subject); n != 0 {
			t.Fatalf("%d operations after a cut COMMIT, want 0", n)
		}
		op, created, err := st.OperationCreate(ctx, params)
		if err != nil || !created || op.OperationID != params.OperationID {
			t.Fatalf("retry with the key = %s created=%v err=%v, want it created now", op.OperationID, created, err)
		}
		if n := opsOf(t, direct, params.Subject); n != 1 {
			t.Fatalf("%d operations, want 1", n)
		}
	})

	t.Run("no key", func(t *testing.T) {
		params := grantParams("commit-lost-nokey")
		before := p.cuts.Load()
		p.arm(cutAfterCommit)
		_, _, err := st.OperationCreate(ctx, params)
		if p.cuts.Load() == before {
			t.Fatal("the proxy never saw the admission's COMMIT")
		}
		if !errors.Is(err, store.ErrCommitUnknown) {
			t.Fatalf("OperationCreate without a key, COMMIT answer lost: %v, want ErrCommitUnknown", err)
		}
		retry := params
		retry.OperationID = uuid.NewString() // what a client retrying without a key sends
		if _, _, err := st.OperationCreate(ctx, retry); !errors.Is(err, store.ErrBindingBusy) {
			t.Fatalf("retry without a key: %v, want ErrBindingBusy (the first application holds the binding)", err)
		}
		if n := opsOf(t, direct, params.Subject); n != 1 {
			t.Fatalf("%d operations, want exactly the first", n)
		}
	})
}

// TestCommitLostClaimAndSettle: a claim and a settlement whose COMMIT answers are lost
// committed all the same; the state they leave is the one a replica that crashed right
// after its COMMIT leaves, and the next round reads it as such: the slot is taken by
// the claimed batch (which publish takes up like any other), and a second settlement
// loses its guard and changes nothing.
func TestCommitLostClaimAndSettle(t *testing.T) {
	ctx := context.Background()
	st, direct, p := cutStore(t)
	const repo = "platform/lost"
	ids := storetest.InsertQueuedOps(t, direct, repo, 3)

	p.arm(cutAfterCommit)
	if _, err := st.BatchClaim(ctx, repo, 10); !errors.Is(err, store.ErrCommitUnknown) {
		t.Fatalf("claim with its COMMIT answer lost: %v, want ErrCommitUnknown", err)
	}
	if n := btCount(t, direct, "SELECT COUNT(*) FROM merge_batch WHERE repo = ? AND status = 1", repo); n != 1 {
		t.Fatalf("%d running batches after the claim, want 1 (it committed)", n)
	}
	btAll(t, "status", btOpStatus(t, direct, ids), domain.OpInBatch)
	btClaim(t, st, repo, 10, store.ClaimSlotOccupied)
	var id int64
	if err := direct.DB().Get(&id, "SELECT id FROM merge_batch WHERE repo = ? AND status = 1", repo); err != nil {
		t.Fatal(err)
	}
	b, err := st.BatchGet(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.OperationIDs) != 3 {
		t.Fatalf("claimed batch has %d members, want 3", len(b.OperationIDs))
	}
	if b, err = st.BatchRecordMR(ctx, b.ID, b.Version, store.MRRecord{IID: 1, URL: "https://gitlab/mr/1", SHA: "abc"}); err != nil {
		t.Fatal(err)
	}

	p.arm(cutAfterCommit)
	if _, err := st.BatchSettleSucceeded(ctx, b.ID, domain.BatchRunning, b.Version); !errors.Is(err, store.ErrCommitUnknown) {
		t.Fatalf("settlement with its COMMIT answer lost: %v, want ErrCommitUnknown", err)
	}
	after, err := st.BatchGet(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if after.Status != domain.BatchSucceeded {
		t.Fatalf("batch status %s after the settlement, want succeeded (it committed)", after.Status)
	}
	btAll(t, "status", btOpStatus(t, direct, ids), domain.OpMerged)
	// A settler that did not learn the outcome and tries again from what it read: its
	// guard (status and version) loses.
	if _, err := st.BatchSettleSucceeded(ctx, b.ID, domain.BatchRunning, b.Version); !errors.Is(err, store.ErrLostRace) {
		t.Fatalf("second settlement: %v, want ErrLostRace", err)
	}
	btAll(t, "status", btOpStatus(t, direct, ids), domain.OpMerged)
}

// TestPingPlainServer: readiness on the test server, which runs without wsrep (a
// MariaDB built with it shows its status variables all the same: Disconnected, OFF).
func TestPingPlainServer(t *testing.T) {
	st, _ := storetest.New(t)
	if err := st.Ping(context.Background()); err != nil {
		t.Fatalf("Ping on a server without Galera: %v", err)
	}
}

// TestOpenLeavesPlainServerSyncWait: Open sets wsrep_sync_wait only on a Galera node
// (`make ha` proves that side on a real cluster); on the test server, which runs
// without wsrep, the session keeps the server's value.
func TestOpenLeavesPlainServerSyncWait(t *testing.T) {
	st, _ := storetest.New(t)
	var on, wait string
	row := st.DB().QueryRow("SELECT @@SESSION.wsrep_on, @@SESSION.wsrep_sync_wait")
	if err := row.Scan(&on, &wait); err != nil {
		t.Skipf("the server has no wsrep variables: %v", err)
	}
	if on != "0" || wait != "0" {
		t.Fatalf("plain server: wsrep_on=%s wsrep_sync_wait=%s, want 0 and 0 (left alone)", on, wait)
	}
}
