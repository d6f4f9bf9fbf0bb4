package mr

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The retry policy below replaces client-go's default. client-go retries a POST on
// any 5xx, which is wrong for us: a 502 from a proxy may arrive after GitLab made the
// commit, and repeating the POST would make a second commit. So the transport only
// repeats what cannot have done work twice:
//
//   - any request answered 429 (GitLab's rate limiter refuses before doing anything),
//     after waiting what Retry-After / RateLimit-Reset asks, if that fits the call's
//     remaining time budget;
//   - a GET/HEAD on 5xx or on a network error;
//   - any request whose connection failed before it was written (dial errors).
//
// Everything else surfaces as a classified error, and each layer method checks by
// reading (branch exists, head commit carries the trailer, MR exists for the branch)
// whether the work was done before reporting failure.

type captureKey struct{}

// capture collects per-call details the client-go API does not expose: GitLab's 404
// message and how many HTTP attempts a call made.
type capture struct {
	mu       sync.Mutex
	notFound string
	attempts int
}

func (c *capture) notFoundMessage() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.notFound
}

func captureFrom(ctx context.Context) *capture {
	c, _ := ctx.Value(captureKey{}).(*capture)
	return c
}

// captureTransport wraps the real transport to keep the body message of 404 answers.
type captureTransport struct{ next http.RoundTripper }

func (t captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	cap := captureFrom(req.Context())
	if cap != nil {
		cap.mu.Lock()
		cap.attempts++
		cap.mu.Unlock()
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil || cap == nil || resp.StatusCode != http.StatusNotFound {
		return resp, err
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if rerr == nil {
		var m struct {
			Message any `json:"message"`
			Error   any `json:"error"`
		}
		if json.Unmarshal(body, &m) == nil {
			msg := m.Message
			if msg == nil {
				msg = m.Error
			}
			if s, ok := msg.(string); ok {
				cap.mu.Lock()
				cap.notFound = s
				cap.mu.Unlock()
			}
		}
	}
	return resp, err
}

// checkRetry is the retryablehttp.CheckRetry described above.
func (c *Client) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		if isBeforeWrite(err) {
			return true, nil
		}
		if resp != nil && resp.Request != nil && idempotent(resp.Request.Method) {
			return true, nil
		}
		// retryablehttp passes resp == nil on transport errors, so look at the method
		// via the error's request when we can: url.Error does not carry it, hence the
		// conservative default of not retrying unknown failures of writes.
		if m, ok := ctx.Value(methodKey{}).(string); ok && idempotent(m) {
			return true, nil
		}
		return false, nil
	}
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		wait := retryAfterFromHeader(resp.Header, time.Now())
		if wait > c.cfg.MaxRetryAfter {
			return false, nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+50*time.Millisecond {
			// Waiting would outlive the call's budget: report the 429 with its
			// RetryAfter so the caller schedules the next attempt instead.
			return false, nil
		}
		return true, nil
	case resp.StatusCode >= 500 && resp.StatusCode != http.StatusNotImplemented:
		return idempotent(resp.Request.Method), nil
	}
	return false, nil
}

type methodKey struct{}

func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	return false
}

// isBeforeWrite reports whether a transport error happened before the request could
// reach GitLab, so repeating it cannot do the work twice.
func isBeforeWrite(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return !dnsErr.IsNotFound
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && strings.EqualFold(opErr.Op, "dial") {
		return true
	}
	return false
}

// backoff honours Retry-After / RateLimit-Reset on 429 (checkRetry already refused
// waits that do not fit), and otherwise backs off exponentially with jitter between
// RetryWaitMin and RetryWaitMax.
func (c *Client) backoff(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		if wait := retryAfterFromHeader(resp.Header, time.Now()); wait > 0 {
			// A little jitter after the reset keeps N replicas from arriving in the
			// same millisecond.
			return wait + time.Duration(rand.Int64N(int64(50*time.Millisecond)))
		}
	}
	d := min << uint(attempt)
	if d <= 0 || d > max {
		d = max
	}
	if half := int64(d / 2); half > 0 {
		d = time.Duration(half + rand.Int64N(half+1))
	}
	return d
}
