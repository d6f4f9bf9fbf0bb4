package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/scanner"
	"github.com/batcherd/batcherd/internal/store"
)

// ContentionResult is what 8 replicas racing for one repository's slot saw.
type ContentionResult struct {
	Replicas    int
	PerReplica  float64 // rounds per second each replica triggered
	Elapsed     time.Duration
	Rounds      int64 // answered rounds
	Outcomes    map[store.ClaimOutcome]int64
	Errors      int64
	FirstError  string
	Losers      Summary // every round that did not claim
	Occupied    Summary // rounds answered slot_occupied
	Winners     Summary // rounds that claimed
	Admitted    int64
	Settled     int64
	MaxBatch    int
	SettleAfter time.Duration
	// RoundTrip is the latency of a bare round trip (DO 1 on an idle connection of its
	// own) sampled 20 times a second during the run: the floor any round is measured
	// against on this machine at that moment.
	RoundTrip Summary
}

// Contention runs replicas goroutine-replicas (each its own store and pool, and a
// scanner whose RunRound is the scheduled round's code) triggering rounds at perSec on
// one repository for d, while a feeder admits admitPerSec operations into it and a
// settler settles each claimed batch settleAfter after its claim, so the slot is
// alternately held and free, as in production.
func Contention(ctx context.Context, replicas int, perSec float64, d time.Duration, admitPerSec int, settleAfter time.Duration) (ContentionResult, error) {
	res := ContentionResult{Replicas: replicas, PerReplica: perSec, Outcomes: map[store.ClaimOutcome]int64{}, SettleAfter: settleAfter, MaxBatch: 500}
	db, err := NewDB(ctx, "contention")
	if err != nil {
		return res, err
	}
	defer db.Close()
	const repo = "bench/contention"
	var scs []*scanner.Scanner
	for i := 0; i < replicas; i++ {
		st, err := db.Open(ctx, 4)
		if err != nil {
			return res, err
		}
		defer st.Close()
		scs = append(scs, scanner.New(scanner.Config{Repos: []string{repo}, MaxBatchSize: res.MaxBatch,
			ReplicaID: fmt.Sprintf("bench-%d", i)}, st, nil, nil, nil))
	}
	feeder, err := db.Open(ctx, 8)
	if err != nil {
		return res, err
	}
	defer feeder.Close()
	settler, err := db.Open(ctx, 2)
	if err != nil {
		return res, err
	}
	defer settler.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg, bg sync.WaitGroup
	claimed := make(chan int64, 1024)

	// Feeder: admissions at a steady rate, a few at a time.
	var admitted atomic.Int64
	bg.Go(func() {
		run := uuid.NewString()[:8]
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		per := max(1, admitPerSec/100)
		i := 0
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var fw sync.WaitGroup
			for range per {
				i++
				p := AdmissionParams(repo, fmt.Sprintf("c-%s-%d", run, i))
				fw.Go(func() {
					if _, _, err := feeder.OperationCreate(ctx, p); err == nil {
						admitted.Add(1)
					}
				})
			}
			fw.Wait()
		}
	})
	// Settler: settle each claimed batch as merged settleAfter after its claim.
	var settled atomic.Int64
	bg.Go(func() {
		for {
			var id int64
			select {
			case <-ctx.Done():
				return
			case id = <-claimed:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(settleAfter):
			}
			b, err := settler.BatchGet(ctx, id)
			if err == nil {
				if _, err = settler.BatchSettleSucceeded(ctx, id, b.Status, b.Version); err == nil {
					settled.Add(1)
				}
			}
		}
	})
	// The floor: a bare round trip, sampled during the run.
	var rtts []time.Duration
	pinger, err := db.Raw(1)
	if err != nil {
		return res, err
	}
	defer pinger.Close()
	bg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			t := time.Now()
			if _, err := pinger.ExecContext(ctx, "DO 1"); err == nil {
				rtts = append(rtts, time.Since(t))
			}
		}
	})
	time.Sleep(200 * time.Millisecond) // let something wait first

	type sample struct {
		outcome store.ClaimOutcome
		el      time.Duration
		err     error
	}
	results := make([][]sample, replicas)
	deadline := time.Now().Add(d)
	t0 := time.Now()
	for i, sc := range scs {
		wg.Go(func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / perSec))
			defer tick.Stop()
			for time.Now().Before(deadline) {
				<-tick.C
				ts := time.Now()
				r, err := sc.RunRound(ctx, repo)
				results[i] = append(results[i], sample{r.Outcome, time.Since(ts), err})
				if err == nil && r.Outcome == store.ClaimClaimed {
					claimed <- r.BatchID
				}
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(t0)
	cancel()
	bg.Wait()

	var losers, occupied, winners []time.Duration
	for _, rs := range results {
		for _, s := range rs {
			if s.err != nil {
				res.Errors++
				if res.FirstError == "" {
					res.FirstError = s.err.Error()
				}
				continue
			}
			res.Rounds++
			res.Outcomes[s.outcome]++
			switch s.outcome {
			case store.ClaimClaimed:
				winners = append(winners, s.el)
			case store.ClaimSlotOccupied:
				occupied = append(occupied, s.el)
				losers = append(losers, s.el)
			default:
				losers = append(losers, s.el)
			}
		}
	}
	res.Losers, res.Occupied, res.Winners = Summarize(losers), Summarize(occupied), Summarize(winners)
	res.Admitted, res.Settled = admitted.Load(), settled.Load()
	res.RoundTrip = Summarize(rtts)
	return res, nil
}
