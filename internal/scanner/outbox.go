package scanner

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// outboxConfig is the outbox loop's slice of Config.
type outboxConfig struct {
	receivers   []domain.EventReceiver
	secret      []byte
	interval    time.Duration
	lease       time.Duration
	timeout     time.Duration
	backoffBase time.Duration
	backoffMax  time.Duration
	retention   time.Duration
	purgeEvery  time.Duration
	chunk       int
	limit       int
	workers     int
}

// outboxLoop delivers the event outbox (README.md, "Events"), fetch →
// tryLock like every loop: read due rows without locks (OutboxDue: per receiver, only
// the earliest undelivered event of each operation), take each with a guarded UPDATE
// that counts the attempt and pushes its next_attempt_at past the lease (the
// reservation), POST it outside any transaction, then record the delivery or the next
// try. A replica that dies mid-POST leaves the row reserved until the lease ends; then
// any replica sends it again with the same X-Batcherd-Delivery (at least once).
type outboxLoop struct {
	s      *Scanner
	cfg    outboxConfig
	log    *slog.Logger
	client *http.Client
	// ids are the receiver identities this replica reads due rows for: each
	// receiver's identity and, for rows written before identities (schema v12), its
	// position in the list; index maps either to the receiver's index in cfg.receivers.
	ids   []int64
	index map[int64]int

	mu        sync.Mutex
	lastPurge time.Time
	lastStats time.Time
}

// errDeliveryFailed: the receiver did not answer 2xx (counted and retried, not logged
// as the loop's error: a receiver that is down is the receiver's problem, the alert's
// business, and must not flood the log).
var errDeliveryFailed = errors.New("event delivery failed")

func newOutboxLoop(s *Scanner, cfg outboxConfig, log *slog.Logger) *outboxLoop {
	l := &outboxLoop{s: s, cfg: cfg, log: log}
	l.client = &http.Client{
		Timeout: cfg.timeout,
		// A redirect is not a delivery: it is retried like any other non-2xx, and the
		// signed body never follows it to a host nobody configured.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	l.index = map[int64]int{}
	for i, r := range cfg.receivers {
		l.index[r.ID] = i
		l.index[int64(i)] = i // a row written before identities: its position (migration 00012)
	}
	for id := range l.index {
		l.ids = append(l.ids, id)
	}
	slices.Sort(l.ids)
	return l
}

func (l *outboxLoop) runOnce(ctx context.Context) error {
	rows, err := l.s.st.OutboxDue(ctx, l.ids, l.cfg.limit)
	if err != nil {
		return err
	}
	// Replicas read the same due rows in the same order; each takes them in its own
	// random order, so racing dispatchers mostly reserve different rows instead of all
	// losing the same races. (Order within an operation does not depend on it: only
	// each operation's earliest undelivered event is ever due.)
	rand.Shuffle(len(rows), func(i, j int) { rows[i], rows[j] = rows[j], rows[i] })
	started, failed := forEach(ctx, l.s, l.cfg.workers, rows, l.deliver)
	l.housekeeping(ctx)
	if len(rows) == l.cfg.limit {
		kick(l.s.kickOutbox) // more are due: the next pass starts at once
	}
	return passResult(started, failed)
}

// deliver takes one row and POSTs it; nil unless the receiver refused or failed.
func (l *outboxLoop) deliver(ctx context.Context, r store.OutboxRow) error {
	if err := l.s.st.OutboxReserve(ctx, r, l.cfg.lease); err != nil {
		return l.s.itemErr("outbox", l.log, "reserve event", err)
	}
	l.s.step(ctx, "outbox_reserved", r.ID)
	rc := l.cfg.receivers[l.index[r.Receiver]] // OutboxDue read only identities in index
	label := rc.Label
	why := l.post(ctx, rc.URL, r)
	if why == "" {
		// The POST was answered 2xx: record it. A crash right here sends the event again
		// after the lease (the receiver drops it by id).
		l.s.step(ctx, "outbox_posted", r.ID)
		if _, err := l.s.st.OutboxDelivered(ctx, r.ID); err != nil {
			return l.s.itemErr("outbox", l.log, "record delivery", err)
		}
		l.s.m.eventsDelivered.WithLabelValues(label).Inc()
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err() // shutdown: the lease hands the row on
	}
	l.s.m.eventFailures.WithLabelValues(label).Inc()
	wait := backoff(l.cfg.backoffBase, l.cfg.backoffMax, r.Attempts+1)
	l.log.Debug("event delivery failed; retrying", "receiver", label, "event_id", r.EventID,
		"type", r.Type, "attempt", r.Attempts+1, "why", why, "retry_in", wait)
	if err := l.s.st.OutboxRetryAt(ctx, r, wait, why); err != nil {
		return l.s.itemErr("outbox", l.log, "record failed delivery", err)
	}
	return errDeliveryFailed
}

// post sends r to its receiver and returns "" on a 2xx, else why not — in words that
// never hold the URL (a *url.Error quotes it, with any credentials in it).
func (l *outboxLoop) post(ctx context.Context, to string, r store.OutboxRow) string {
	body := r.Body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, to, bytes.NewReader(body))
	if err != nil {
		return "bad receiver URL"
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "batcherd")
	req.Header.Set("X-Batcherd-Event", r.Type)
	req.Header.Set("X-Batcherd-Delivery", r.EventID)
	req.Header.Set("X-Batcherd-Signature", Sign(l.cfg.secret, body))
	resp, err := l.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if errors.Is(err, context.DeadlineExceeded) || (ue != nil && ue.Timeout()) {
			return "timeout"
		}
		return "request failed: " + err.Error()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		return ""
	}
	return "HTTP " + resp.Status
}

// Sign is the X-Batcherd-Signature value of body: sha256=<hex HMAC-SHA256 with secret>.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// housekeeping purges delivered rows (bounded chunks, at most every purgeEvery) and
// samples the backlog gauges (at most every 10 s: every replica samples, and the
// alert reads the max over replicas).
func (l *outboxLoop) housekeeping(ctx context.Context) {
	l.mu.Lock()
	now := time.Now()
	purge := now.Sub(l.lastPurge) >= l.cfg.purgeEvery
	stats := now.Sub(l.lastStats) >= 10*time.Second
	if purge {
		l.lastPurge = now
	}
	if stats {
		l.lastStats = now
	}
	l.mu.Unlock()
	if purge {
		var total int64
		for range maxChunksPerPass {
			if ctx.Err() != nil || l.s.stopping() {
				break
			}
			n, err := l.s.st.OutboxPurge(ctx, l.cfg.retention, l.cfg.chunk)
			total += n
			if err != nil {
				_ = l.s.itemErr("outbox", l.log, "purge delivered events", err)
				break
			}
			if n < int64(l.cfg.chunk) {
				break
			}
		}
		if total > 0 {
			l.s.m.outcomes.WithLabelValues("outbox", "events_purged").Add(float64(total))
		}
	}
	if stats {
		l.sample(ctx)
	}
}

// sample sets the depth and oldest-age gauges of every configured receiver (0 when
// nothing waits for it).
func (l *outboxLoop) sample(ctx context.Context) {
	st, err := l.s.st.OutboxStats(ctx)
	if err != nil {
		_ = l.s.itemErr("outbox", l.log, "sample outbox", err)
		return
	}
	n := len(l.cfg.receivers)
	depth, age := make([]float64, n), make([]float64, n)
	var unrouted float64
	for _, r := range st {
		i, ok := l.index[r.Receiver]
		if !ok {
			unrouted += float64(r.Depth)
			continue
		}
		depth[i] += float64(r.Depth)
		age[i] = max(age[i], r.OldestAge)
	}
	l.s.m.outboxUnrouted.Set(unrouted)
	for i, rc := range l.cfg.receivers {
		l.s.m.outboxDepth.WithLabelValues(rc.Label).Set(depth[i])
		l.s.m.outboxOldest.WithLabelValues(rc.Label).Set(age[i])
	}
}

// describeReceivers names the receivers for the start-up log: label and host only.
func describeReceivers(rs []domain.EventReceiver) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		host := "?"
		if u, err := url.Parse(r.URL); err == nil {
			host = u.Host
		}
		out[i] = r.Label + "=" + host
	}
	return out
}
