package mr

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// classify turns whatever client-go returned for one call into the layer's single
// *Error, or nil. It is the only place that decides what is transient, permanent or
// not found, so callers never inspect HTTP details themselves.
func (c *Client) classify(ctx context.Context, op string, resp *gitlab.Response, err error) error {
	if err == nil {
		return nil
	}
	e := &Error{Op: op, Err: err}
	status := 0
	var er *gitlab.ErrorResponse
	switch {
	case errors.As(err, &er) && er.Response != nil:
		status = er.Response.StatusCode
		e.Message = gitlabMessage(er.Body, er.Message)
		if e.Message == "" {
			e.Message = http.StatusText(status)
		}
		e.RetryAfter = retryAfterFromHeader(er.Response.Header, time.Now())
	case errors.Is(err, gitlab.ErrNotFound):
		status = http.StatusNotFound
		// client-go drops the body of a 404; the capturing transport kept GitLab's
		// message ("404 Branch Not Found", "404 Project Not Found", …) because which
		// thing is missing matters to the caller.
		e.Message = "404 Not Found"
		if cap := captureFrom(ctx); cap != nil {
			if m := cap.notFoundMessage(); m != "" {
				e.Message = m
			}
		}
	case resp != nil && resp.StatusCode >= 400:
		status = resp.StatusCode
		e.Message = http.StatusText(status)
		e.RetryAfter = retryAfterFromHeader(resp.Header, time.Now())
	}
	e.Status = status
	switch {
	case status == http.StatusNotFound:
		e.Class = ClassNotFound
	case status == http.StatusTooManyRequests || status == http.StatusRequestTimeout:
		e.Class = ClassTransient
	case status >= 500 && status != http.StatusNotImplemented:
		e.Class = ClassTransient
	case status >= 400:
		e.Class = ClassPermanent
	default:
		// No HTTP status: a network failure, a timeout, a cancelled context, or a body
		// that could not be decoded (a proxy's HTML page, a truncated answer). All of
		// them may succeed when tried again later.
		e.Class = ClassTransient
		e.Message = networkMessage(err)
	}
	e.Message = c.redact(e.Message)
	e.Err = redactedError{msg: c.redact(err.Error()), err: err}
	return e
}

// gitlabMessage extracts GitLab's own words from an error body: {"message": "…"},
// {"message": ["…", …]} (model validation), {"message": {"field": ["…"]}}, or
// {"error": "…"} (parameter validation). client-go's rendering of the same body
// ("{message: …}") is the fallback.
func gitlabMessage(body []byte, fallback string) string {
	var m map[string]any
	if json.Unmarshal(body, &m) != nil {
		return fallback
	}
	v, ok := m["message"]
	if !ok {
		v, ok = m["error"]
	}
	if !ok {
		return fallback
	}
	if s := flattenMessage(v); s != "" {
		return s
	}
	return fallback
}

func flattenMessage(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []any:
		parts := make([]string, 0, len(x))
		for _, e := range x {
			if s := flattenMessage(e); s != "" {
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, "; ")
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			if s := flattenMessage(x[k]); s != "" {
				parts = append(parts, k+" "+s)
			}
		}
		return strings.Join(parts, "; ")
	}
	return ""
}

// networkMessage names a transport failure without the request URL's query, which is
// noise in logs.
func networkMessage(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout: " + err.Error()
	case errors.Is(err, context.Canceled):
		return "cancelled: " + err.Error()
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed before the answer: " + err.Error()
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset: " + err.Error()
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: " + err.Error()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout: " + err.Error()
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + " " + ue.URL + ": " + ue.Err.Error()
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "undecodable answer: " + err.Error()
	}
	return err.Error()
}

// redactedError keeps the wrapped chain (errors.Is on context.DeadlineExceeded still
// works) while its text never shows the token.
type redactedError struct {
	msg string
	err error
}

func (r redactedError) Error() string { return r.msg }
func (r redactedError) Unwrap() error { return r.err }

func (c *Client) redact(s string) string {
	if c == nil || c.cfg.Token == "" || !strings.Contains(s, c.cfg.Token) {
		return s
	}
	return strings.ReplaceAll(s, c.cfg.Token, "[REDACTED]")
}

// retryAfterFromHeader reads how long GitLab asks us to wait: Retry-After (seconds or
// an HTTP date), else RateLimit-Reset (a Unix time). Zero when neither is present.
func retryAfterFromHeader(h http.Header, now time.Time) time.Duration {
	if h == nil {
		return 0
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
			if secs < 0 {
				return 0
			}
			return time.Duration(secs) * time.Second
		}
		if t, err := http.ParseTime(v); err == nil {
			if d := t.Sub(now); d > 0 {
				return d
			}
			return 0
		}
	}
	if v := strings.TrimSpace(h.Get("RateLimit-Reset")); v != "" {
		if reset, err := strconv.ParseInt(v, 10, 64); err == nil && reset > 0 {
			if d := time.Unix(reset, 0).Sub(now); d > 0 {
				return d
			}
		}
	}
	return 0
}

// isStatus reports whether err is a layer error with the given HTTP status.
func isStatus(err error, status int) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == status
}

// messageContains reports whether err is a layer error whose GitLab message contains
// sub (case-insensitive).
func messageContains(err error, sub string) bool {
	var e *Error
	return errors.As(err, &e) && strings.Contains(strings.ToLower(e.Message), strings.ToLower(sub))
}
