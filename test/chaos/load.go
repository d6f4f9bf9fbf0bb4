package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batcherd/batcherd/internal/harness"
)

// relation is one (subject, target) of one repository, with what the load last
// applied for and got accepted, to choose grants and revokes that have a chance.
type relation struct {
	repo, subject, target string
	last                  string // action of the last accepted application
	lastAt                time.Time
}

// answer is one HTTP answer to POST /v1/operations.
type answer struct {
	sent, recv time.Time
	status     int // 0: no answer (connection failed, timeout): outcome unknown
	code       string
	opID       string
	created    bool
	err        string
}

// keyRec is one Idempotency-Key: one logical application, sent once or many times.
type keyRec struct {
	key     string
	req     harness.OperationRequest
	rel     *relation
	kind    string // single, duplicate, retried
	answers []answer
	opID    string    // operation of the first 2xx answer
	firstOK time.Time // when that answer arrived
}

// opRec is one operation an answer named.
type opRec struct {
	id, key  string
	rel      *relation
	action   string
	decision string // approve or reject
	decided  bool   // a definitive answer to the decision arrived
	accepted bool   // approved (or retried by the operator): must end merged or failed
	retried  int    // operator retries
}

// load submits applications and records every answer.
type load struct {
	r       *run
	rels    []*relation
	clients []*harness.Client // one per replica, no failover

	mu   sync.Mutex
	keys map[string]*keyRec
	ops  map[string]*opRec
	seq  int
	wg   sync.WaitGroup // delayed exact retries

	requests, unknown           int            // POST /v1/operations sent; answered 5xx or not at all
	refused                     map[string]int // definitive 4xx by error code
	dupGroups, dupRequests      int
	exactRetries                int
	approves, rejects           int // definitive
	decisionUnknown             int // decision calls without a definitive answer (retried)
	expiring                    int // grants with expires_at
	resolvedKeys, resolvedDecis int // outcomes learnt after the chaos
}

func newLoad(r *run) *load {
	l := &load{r: r, keys: map[string]*keyRec{}, ops: map[string]*opRec{}, refused: map[string]int{}}
	for _, rep := range r.c.Replicas {
		l.clients = append(l.clients, rep.Client())
	}
	for _, repo := range repos {
		subjects, targets := relationsOf(repo)
		for _, t := range targets {
			for _, s := range subjects {
				l.rels = append(l.rels, &relation{repo: repo, subject: s, target: t})
			}
		}
	}
	return l
}

// run drives the submitters until chaosCtx ends, then waits for what is in flight.
// Calls in flight finish on the run's context, not the chaos one: cutting them off
// would only turn answers into unknown outcomes.
func (l *load) run(chaosCtx context.Context) {
	ctx := l.r.ctx
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * float64(l.r.cfg.Workers) / l.r.cfg.Rate)
	for range l.r.cfg.Workers {
		wg.Go(func() {
			for sleep(chaosCtx, l.r.rnd.Around(interval)) {
				l.one(ctx)
			}
		})
	}
	wg.Wait()
	l.wg.Wait()
}

// one submits one application (alone, as concurrent duplicates, or followed by exact
// retries) and decides it.
func (l *load) one(ctx context.Context) {
	rnd := l.r.rnd
	rel := l.rels[rnd.IntN(len(l.rels))]
	l.mu.Lock()
	last, lastAt := rel.last, rel.lastAt
	l.mu.Unlock()
	action := "grant"
	switch {
	case last == "grant" && time.Since(lastAt) > 3*time.Second && rnd.Float64() < 0.8:
		action = "revoke"
	case last == "grant" && rnd.Float64() < 0.1:
		action = "revoke" // probably too early: a 409 is the expected answer
	case last != "grant" && rnd.Float64() < 0.05:
		action = "revoke" // not active: 409
	}
	req := harness.OperationRequest{Subject: rel.subject, Target: rel.target, Action: action, Repo: rel.repo}
	// Grants that expire during the run: the expiry loop revokes them. Only early on,
	// so that every expiry falls inside the run.
	if action == "grant" && time.Since(l.r.start) < l.r.cfg.Duration/2 && rnd.Float64() < 0.08 {
		exp := time.Now().Add(rnd.Dur(10*time.Second, 25*time.Second)).UTC().Truncate(time.Second)
		req.ExpiresAt = &exp
		l.mu.Lock()
		l.expiring++
		l.mu.Unlock()
	}
	kind := "single"
	switch p := rnd.Float64(); {
	case p < 0.15:
		kind = "duplicate"
	case p < 0.35:
		kind = "retried"
	}
	l.mu.Lock()
	l.seq++
	k := &keyRec{key: fmt.Sprintf("chaos-%d-%06d", l.r.cfg.Seed%1_000_000, l.seq), req: req, rel: rel, kind: kind}
	l.keys[k.key] = k
	l.mu.Unlock()

	deadline := time.Now().Add(15 * time.Second)
	switch kind {
	case "duplicate":
		n := 2 + rnd.IntN(3)
		// Half the groups go to one replica, where concurrent admissions share one
		// group transaction; the others are spread over every replica.
		cl := l.r.api
		if rnd.Float64() < 0.5 {
			cl = l.clients[rnd.IntN(len(l.clients))]
		}
		l.mu.Lock()
		l.dupGroups++
		l.dupRequests += n
		l.mu.Unlock()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { l.submit(ctx, k, deadline, cl) })
		}
		wg.Wait()
	default:
		l.submit(ctx, k, deadline, l.r.api)
	}
	if kind == "retried" {
		l.wg.Go(func() {
			for range 1 + rnd.IntN(2) {
				if !sleep(ctx, rnd.Dur(100*time.Millisecond, 3*time.Second)) {
					return
				}
				l.mu.Lock()
				l.exactRetries++
				l.mu.Unlock()
				l.submit(ctx, k, time.Now().Add(15*time.Second), l.r.api)
			}
			l.adopt(ctx, k)
		})
	}
	l.adopt(ctx, k)
}

// submit sends k's request through cl until an answer is definitive (2xx or 4xx) or
// deadline; a retry after an unknown outcome goes through the cluster client, which
// fails over. It reports whether an answer was definitive.
func (l *load) submit(ctx context.Context, k *keyRec, deadline time.Time, cl *harness.Client) bool {
	wait := 200 * time.Millisecond
	for {
		a := l.send(ctx, k, cl)
		cl = l.r.api
		if a.status != 0 && a.status < 500 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		if !sleep(ctx, l.r.rnd.Dur(wait/2, wait)) {
			return false
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// send sends k's request once and records the answer.
func (l *load) send(ctx context.Context, k *keyRec, cl *harness.Client) answer {
	a := answer{sent: time.Now()}
	op, created, err := cl.Submit(ctx, k.req, k.key)
	a.recv = time.Now()
	var ae *harness.APIError
	switch {
	case err == nil:
		a.status, a.opID, a.created = 200, op.ID, created
		if created {
			a.status = 201
		}
	case errors.As(err, &ae):
		a.status, a.code, a.err = ae.Status, ae.Code, ae.Message
	default:
		a.err = err.Error()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests++
	k.answers = append(k.answers, a)
	switch {
	case a.status/100 == 2:
		if k.opID == "" {
			k.opID, k.firstOK = a.opID, a.recv
			k.rel.last, k.rel.lastAt = k.req.Action, a.recv
		}
	case a.status == 0 || a.status >= 500:
		l.unknown++
	default:
		l.refused[fmt.Sprintf("%d %s", a.status, a.code)]++
		if a.status == 400 {
			l.r.event("key %s: 400 %s: %s", k.key, a.code, a.err)
		}
	}
	return a
}

// adopt records the operation k's answers named (once) and decides it: approve, or
// now and then reject.
func (l *load) adopt(ctx context.Context, k *keyRec) {
	l.mu.Lock()
	if k.opID == "" || l.ops[k.opID] != nil {
		l.mu.Unlock()
		return
	}
	o := &opRec{id: k.opID, key: k.key, rel: k.rel, action: k.req.Action, decision: "approve"}
	if l.r.rnd.Float64() < 0.06 {
		o.decision = "reject"
	}
	l.ops[o.id] = o
	l.mu.Unlock()
	l.decide(ctx, o, time.Now().Add(15*time.Second))
}

// decide sends o's decision until an answer is definitive or deadline.
func (l *load) decide(ctx context.Context, o *opRec, deadline time.Time) bool {
	wait := 200 * time.Millisecond
	for {
		var (
			op  harness.Operation
			err error
		)
		if o.decision == "approve" {
			op, err = l.r.api.Approve(ctx, o.id)
		} else {
			op, err = l.r.api.Reject(ctx, o.id)
		}
		var ae *harness.APIError
		switch {
		case err == nil:
			l.mu.Lock()
			o.decided = true
			if o.decision == "approve" {
				o.accepted = true
				l.approves++
			} else {
				l.rejects++
			}
			l.mu.Unlock()
			_ = op
			return true
		case errors.As(err, &ae) && ae.Status < 500:
			// Our own pending operation: nobody else decides it, and a repeat of the same
			// decision is a no-op. Any refusal is wrong.
			l.mu.Lock()
			o.decided = true
			l.mu.Unlock()
			l.r.violation("%s of operation %s (%s %s→%s) answered %d %s: %s", o.decision, o.id, o.action, o.rel.subject, o.rel.target, ae.Status, ae.Code, ae.Message)
			return true
		}
		l.mu.Lock()
		l.decisionUnknown++
		l.mu.Unlock()
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		if !sleep(ctx, l.r.rnd.Dur(wait/2, wait)) {
			return false
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// resolve learns, after the chaos, the outcome of every application and decision
// whose answers were all unknown: the application is sent again with its key (the
// first request's operation comes back, or it is created now), the decision again.
func (l *load) resolve(ctx context.Context, deadline time.Time) error {
	l.mu.Lock()
	var keys []*keyRec
	for _, k := range l.keys {
		definitive := false
		for _, a := range k.answers {
			definitive = definitive || (a.status != 0 && a.status < 500)
		}
		if !definitive {
			keys = append(keys, k)
		}
	}
	l.mu.Unlock()
	for _, k := range keys {
		if !l.submit(ctx, k, deadline, l.r.api) {
			return fmt.Errorf("application %s: no definitive answer by the deadline (last: %+v)", k.key, k.answers[len(k.answers)-1])
		}
		l.mu.Lock()
		l.resolvedKeys++
		l.mu.Unlock()
	}
	l.mu.Lock()
	all := make([]*keyRec, 0, len(l.keys))
	for _, k := range l.keys {
		all = append(all, k)
	}
	l.mu.Unlock()
	for _, k := range all {
		l.adopt(ctx, k)
	}
	l.mu.Lock()
	var open []*opRec
	for _, o := range l.ops {
		if !o.decided {
			open = append(open, o)
		}
	}
	l.mu.Unlock()
	for _, o := range open {
		if !l.decide(ctx, o, deadline) {
			return fmt.Errorf("decision %s of %s: no definitive answer by the deadline", o.decision, o.id)
		}
		l.mu.Lock()
		l.resolvedDecis++
		l.mu.Unlock()
	}
	return nil
}
