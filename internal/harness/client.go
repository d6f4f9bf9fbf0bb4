package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/batcherd/batcherd/internal/wire"
)

// The API objects as a client sees them: the server's own wire types (internal/wire),
// under the names the harness's users know.
type (
	// ErrorBody is the {"code","message"} of an error response or of an object's error.
	ErrorBody = wire.Error
	// Operation is an operation object.
	Operation = wire.Operation
	// Batch is a batch object.
	Batch = wire.Batch
	// Binding is a binding object.
	Binding = wire.Binding
	// RoundResult is the answer of POST /v1/admin/rounds.
	RoundResult = wire.RoundResult
)

// OperationRequest is the body of POST /v1/operations.
type OperationRequest struct {
	Subject    string         `json:"subject"`
	Target     string         `json:"target"`
	Action     string         `json:"action"`
	Repo       string         `json:"repo,omitempty"`
	ExpiresAt  *time.Time     `json:"expires_at,omitempty"`
	Attributes map[string]any `json:"attributes,omitempty"`
	Priority   string         `json:"priority,omitempty"` // normal (default) or urgent
}

// APIError is a non-2xx answer.
type APIError struct {
	Method, Path string
	Status       int
	Code         string
	Message      string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.Status, e.Code, e.Message)
}

// IsAPIError reports whether err is an *APIError with the given status (and code, if
// not empty).
func IsAPIError(err error, status int, code string) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == status && (code == "" || ae.Code == code)
}

// Client calls the batcherd HTTP API. With several endpoints it spreads calls
// round-robin and fails over to the next endpoint when one cannot be reached — safe
// because every call here is idempotent (admission is retried only with an
// Idempotency-Key). It never retries an HTTP answer, only a failed connection.
type Client struct {
	endpoints func() []string
	token     string
	http      *http.Client
	next      atomic.Uint64
	// Failovers counts calls that moved to another endpoint after a connection error.
	Failovers atomic.Int64
}

// NewClient returns a client over fixed base URLs (http://host:port).
func NewClient(token string, baseURLs ...string) *Client {
	return newClient(token, func() []string { return baseURLs })
}

func newClient(token string, endpoints func() []string) *Client {
	return &Client{
		endpoints: endpoints,
		token:     token,
		http: &http.Client{
			Timeout: 30 * time.Second,
			Transport: &http.Transport{
				MaxIdleConnsPerHost: 32,
				IdleConnTimeout:     30 * time.Second,
				DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			},
		},
	}
}

// CloseIdle closes idle keep-alive connections.
func (c *Client) CloseIdle() { c.http.CloseIdleConnections() }

// do sends one request and decodes a 2xx body into out. retryable says whether a
// connection failure may be retried on another endpoint.
func (c *Client) do(ctx context.Context, method, path string, hdr http.Header, in, out any, retryable bool) (int, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return 0, err
		}
	}
	eps := c.endpoints()
	if len(eps) == 0 {
		return 0, errors.New("harness client: no live endpoint")
	}
	start := int(c.next.Add(1))
	var lastErr error
	for i := range eps {
		base := eps[(start+i)%len(eps)]
		req, err := c.newRequest(ctx, method, base+path, hdr, body, in != nil)
		if err != nil {
			return 0, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			lastErr = err
			if ctx.Err() != nil || !retryable || !connectionError(err) {
				return 0, err
			}
			c.Failovers.Add(1)
			continue
		}
		return resp.StatusCode, decodeResponse(resp, method, path, out)
	}
	return 0, fmt.Errorf("every endpoint failed: %w", lastErr)
}

// newRequest builds one attempt of do: hdr, the JSON content type when there is a
// body (hasBody), and the client's token unless hdr brings its own Authorization.
func (c *Client) newRequest(ctx context.Context, method, target string, hdr http.Header, body []byte, hasBody bool) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

// decodeResponse reads and closes resp's body: a non-2xx answer is an *APIError, a
// 2xx body is decoded into out.
func decodeResponse(resp *http.Response, method, path string, out any) error {
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		ae := &APIError{Method: method, Path: path, Status: resp.StatusCode}
		var eb struct {
			Error ErrorBody `json:"error"`
		}
		if json.Unmarshal(data, &eb) == nil && eb.Error.Code != "" {
			ae.Code, ae.Message = eb.Error.Code, eb.Error.Message
		} else {
			ae.Message = string(data)
		}
		return ae
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decoding %q: %w", method, path, truncate(string(data), 200), err)
		}
	}
	return nil
}

// connectionError reports failures where the request cannot have been processed, or
// the connection broke (a replica killed mid-request): worth another endpoint for
// idempotent calls.
func connectionError(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) ||
		(errors.As(err, &ne) && ne.Timeout())
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Submit applies for an operation. created is false when the Idempotency-Key was
// already seen (200: the first request's operation). An empty key sends none, and
// then a connection failure is not retried on another replica.
func (c *Client) Submit(ctx context.Context, req OperationRequest, idempotencyKey string) (op Operation, created bool, err error) {
	var hdr http.Header
	if idempotencyKey != "" {
		hdr = http.Header{"Idempotency-Key": {idempotencyKey}}
	}
	var out struct {
		Operation Operation `json:"operation"`
	}
	status, err := c.do(ctx, http.MethodPost, "/v1/operations", hdr, req, &out, idempotencyKey != "")
	return out.Operation, status == http.StatusCreated, err
}

func (c *Client) opCall(ctx context.Context, method, id, suffix string) (Operation, error) {
	var out struct {
		Operation Operation `json:"operation"`
	}
	_, err := c.do(ctx, method, "/v1/operations/"+url.PathEscape(id)+suffix, nil, nil, &out, true)
	return out.Operation, err
}

// Approve approves an operation (idempotent). A harness client approves as
// harness-approver, another principal than the requester (four eyes).
func (c *Client) Approve(ctx context.Context, id string) (Operation, error) {
	var out struct {
		Operation Operation `json:"operation"`
	}
	var hdr http.Header
	if c.token == APIToken || c.token == AdminToken {
		hdr = http.Header{"Authorization": {"Bearer " + ApproverToken}}
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/operations/"+url.PathEscape(id)+"/approve", hdr, nil, &out, true)
	return out.Operation, err
}

// Withdraw takes an operation that no batch has claimed back (idempotent).
func (c *Client) Withdraw(ctx context.Context, id string) (Operation, error) {
	return c.opCall(ctx, http.MethodPost, id, "/withdraw")
}

// Pause pauses a repository (admin token; idempotent).
func (c *Client) Pause(ctx context.Context, repo, reason string) (wire.Repo, error) {
	var out struct {
		Repo wire.Repo `json:"repo"`
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/admin/repos/"+url.PathEscape(repo)+"/pause", nil, map[string]string{"reason": reason}, &out, true)
	return out.Repo, err
}

// Resume ends a repository's pause (admin token; idempotent).
func (c *Client) Resume(ctx context.Context, repo string) (wire.Repo, error) {
	var out struct {
		Repo wire.Repo `json:"repo"`
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/admin/repos/"+url.PathEscape(repo)+"/resume", nil, nil, &out, true)
	return out.Repo, err
}

// Repos reads GET /v1/repos.
func (c *Client) Repos(ctx context.Context) ([]wire.Repo, error) {
	var out struct {
		Repos []wire.Repo `json:"repos"`
	}
	_, err := c.do(ctx, http.MethodGet, "/v1/repos", nil, nil, &out, true)
	return out.Repos, err
}

// Reject rejects an operation.
func (c *Client) Reject(ctx context.Context, id string) (Operation, error) {
	return c.opCall(ctx, http.MethodPost, id, "/reject")
}

// Retry moves a failed operation back to queued.
func (c *Client) Retry(ctx context.Context, id string) (Operation, error) {
	return c.opCall(ctx, http.MethodPost, id, "/retry")
}

// Operation reads one operation.
func (c *Client) Operation(ctx context.Context, id string) (Operation, error) {
	return c.opCall(ctx, http.MethodGet, id, "")
}

// Bindings lists bindings filtered by subject and/or target, every page of them.
func (c *Client) Bindings(ctx context.Context, subject, target string) ([]Binding, error) {
	q := url.Values{}
	if subject != "" {
		q.Set("subject", subject)
	}
	if target != "" {
		q.Set("target", target)
	}
	q.Set("limit", "1000")
	var all []Binding
	for {
		var out struct {
			Bindings   []Binding `json:"bindings"`
			NextCursor *string   `json:"next_cursor"`
		}
		if _, err := c.do(ctx, http.MethodGet, "/v1/bindings?"+q.Encode(), nil, nil, &out, true); err != nil {
			return all, err
		}
		all = append(all, out.Bindings...)
		if out.NextCursor == nil {
			return all, nil
		}
		q.Set("cursor", *out.NextCursor)
	}
}

// Batch reads one batch.
func (c *Client) Batch(ctx context.Context, id int64) (Batch, error) {
	var out struct {
		Batch Batch `json:"batch"`
	}
	_, err := c.do(ctx, http.MethodGet, "/v1/batches/"+strconv.FormatInt(id, 10), nil, nil, &out, true)
	return out.Batch, err
}

// Batches lists every batch (all pages, newest first), filtered by repo and status
// when not empty.
func (c *Client) Batches(ctx context.Context, repo, status string) ([]Batch, error) {
	var all []Batch
	cursor := ""
	for {
		q := url.Values{"limit": {"100"}}
		if repo != "" {
			q.Set("repo", repo)
		}
		if status != "" {
			q.Set("status", status)
		}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var out struct {
			Batches    []Batch `json:"batches"`
			NextCursor *string `json:"next_cursor"`
		}
		if _, err := c.do(ctx, http.MethodGet, "/v1/batches?"+q.Encode(), nil, nil, &out, true); err != nil {
			return nil, err
		}
		all = append(all, out.Batches...)
		if out.NextCursor == nil || *out.NextCursor == "" || len(out.Batches) == 0 {
			return all, nil
		}
		cursor = *out.NextCursor
	}
}

// Round runs a claim round now (admin token); repo "" means every repository.
func (c *Client) Round(ctx context.Context, repo string) (RoundResult, error) {
	var in any = struct{}{}
	if repo != "" {
		in = map[string]string{"repo": repo}
	}
	var out RoundResult
	_, err := c.do(ctx, http.MethodPost, "/v1/admin/rounds", nil, in, &out, true)
	return out, err
}

// Settle runs close-then-reread settlement of a batch now (admin token).
func (c *Client) Settle(ctx context.Context, id int64) (Batch, error) {
	var out struct {
		Batch Batch `json:"batch"`
	}
	_, err := c.do(ctx, http.MethodPost, "/v1/admin/batches/"+strconv.FormatInt(id, 10)+"/settle", nil, nil, &out, true)
	return out.Batch, err
}

// Get fetches a path and returns the status code and body without judging either
// (health, readiness, metrics).
func (c *Client) Get(ctx context.Context, path string) (int, []byte, error) {
	eps := c.endpoints()
	if len(eps) == 0 {
		return 0, nil, errors.New("harness client: no live endpoint")
	}
	base := eps[int(c.next.Add(1))%len(eps)]
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
