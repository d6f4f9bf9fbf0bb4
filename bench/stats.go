package bench

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"
)

// Latencies collects durations from many goroutines.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records a batch of durations (call once per goroutine, at its end).
func (l *Latencies) Add(d ...time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

// N is the number of samples.
func (l *Latencies) N() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// Summary returns the percentiles of what was recorded.
func (l *Latencies) Summary() Summary {
	l.mu.Lock()
	d := slices.Clone(l.d)
	l.mu.Unlock()
	return Summarize(d)
}

// Summary holds percentiles of a set of durations.
type Summary struct {
	N                  int
	P50, P90, P99, Max time.Duration
	Mean               time.Duration
}

// Summarize sorts d and returns its percentiles (nearest rank).
func Summarize(d []time.Duration) Summary {
	if len(d) == 0 {
		return Summary{}
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	p := func(q float64) time.Duration {
		i := int(q*float64(len(d))+0.5) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	return Summary{N: len(d), P50: p(0.50), P90: p(0.90), P99: p(0.99), Max: d[len(d)-1], Mean: sum / time.Duration(len(d))}
}

// Ms formats a duration in milliseconds with a precision that suits its size.
func Ms(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms == 0:
		return "0"
	case ms < 1:
		return fmt.Sprintf("%.3f", ms)
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}

// Median of xs (xs is reordered).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}
