package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// SigningAlgs are the JWS algorithms an OIDC token may be signed with: asymmetric
// only. "none" is never accepted, and neither is any HS* algorithm — a verifier that
// accepted HS256 could be fooled by a token "signed" with the issuer's public key as
// the HMAC secret.
var SigningAlgs = []string{
	oidc.RS256, oidc.RS384, oidc.RS512,
	oidc.PS256, oidc.PS384, oidc.PS512,
	oidc.ES256, oidc.ES384, oidc.ES512,
	oidc.EdDSA,
}

// OIDCConfig configures bearer JWTs from one OIDC issuer.
type OIDCConfig struct {
	// Issuer is the issuer URL exactly as the tokens' iss claim and the discovery
	// document's issuer say it (e.g. https://gitlab.example.com).
	Issuer string
	// Audience is the aud a token must carry (for GitLab: the OAuth application id).
	Audience string
	// UsernameClaim names the claim whose value is the principal's name (default sub).
	UsernameClaim string
	// GroupsClaim names the claim listing the user's groups (default groups; GitLab's
	// ID token carries groups_direct).
	GroupsClaim string
	// AdminGroups: a token whose groups include one of these is an admin principal.
	AdminGroups []string
	// HTTPClient fetches the discovery document and the keys (default: 10 s timeout).
	HTTPClient *http.Client
	// Log receives warnings (issuer unreachable) and refusals at debug; never tokens.
	Log *slog.Logger
	// RetryEvery is the least time between two discovery attempts while the issuer is
	// unreachable (default 10 s), so a stream of tokens does not become a stream of
	// requests to a dead issuer.
	RetryEvery time.Duration
	// RefetchEvery is the least time between two fetches of the issuer's keys (default
	// 5 s; negative: no limit). go-oidc fetches them again for every token naming a key
	// id it does not hold, so without a bound anyone could make batcherd hammer the
	// issuer with made-up key ids. A token signed with a freshly rotated key within
	// this time of another fetch is refused (401) and accepted on a retry.
	RefetchEvery time.Duration
}

// OIDC verifies bearer JWTs of one issuer. Discovery (the issuer's
// /.well-known/openid-configuration, which names its JWKS) is tried at start; when the
// issuer cannot be reached then, batcherd starts anyway with a warning and tries again
// when a token arrives. Keys come from go-oidc's remote key set, which fetches the JWKS
// again whenever a token names a key id it does not hold: a rotation at the issuer is
// picked up by the first token signed with the new key.
type OIDC struct {
	cfg        OIDCConfig
	log        *slog.Logger
	tokenNames *Tokens

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
	lastTry  time.Time
	lastErr  error
	now      func() time.Time
}

// NewOIDC checks the configuration and starts discovery in the background (an issuer
// that does not answer must not hold up a replica's start by the client's timeout). An
// unreachable issuer is a warning in the log, not an error: admission must not depend
// on the issuer being up at the moment a replica starts, and static tokens keep working
// meanwhile. Tokens arriving while discovery runs wait for it.
func NewOIDC(ctx context.Context, cfg OIDCConfig) (*OIDC, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("OIDC needs an issuer and an audience")
	}
	if cfg.UsernameClaim == "" {
		cfg.UsernameClaim = "sub"
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.RefetchEvery == 0 {
		cfg.RefetchEvery = 5 * time.Second
	}
	if cfg.RefetchEvery > 0 {
		c := *cfg.HTTPClient
		base := c.Transport
		if base == nil {
			base = http.DefaultTransport
		}
		c.Transport = &throttle{base: base, every: cfg.RefetchEvery,
			discovery: strings.TrimSuffix(cfg.Issuer, "/") + "/.well-known/openid-configuration"}
		cfg.HTTPClient = &c
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = 10 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	o := &OIDC{cfg: cfg, log: log.With("component", "oidc", "issuer", cfg.Issuer), now: time.Now}
	o.mu.Lock() // held until the first discovery ends: early tokens wait for it
	go func() {
		defer o.mu.Unlock()
		if _, err := o.discoverLocked(); err != nil {
			o.log.Warn("the OIDC issuer could not be reached; OIDC tokens are refused until it can be (static tokens work meanwhile)", "err", err)
		}
	}()
	return o, nil
}

// getVerifier returns the verifier, running discovery if it has not succeeded yet (at
// most once per RetryEvery).
func (o *OIDC) getVerifier(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.discoverLocked()
}

// discoverLocked is getVerifier with o.mu held.
func (o *OIDC) discoverLocked() (*oidc.IDTokenVerifier, error) {
	if o.verifier != nil {
		return o.verifier, nil
	}
	if !o.lastTry.IsZero() && o.now().Sub(o.lastTry) < o.cfg.RetryEvery {
		return nil, o.lastErr
	}
	o.lastTry = o.now()
	// Discovery is bounded by the client's timeout, not the request's context: the
	// answer serves every later request too.
	dctx := oidc.ClientContext(context.Background(), o.cfg.HTTPClient)
	p, err := oidc.NewProvider(dctx, o.cfg.Issuer)
	if err != nil {
		o.lastErr = fmt.Errorf("OIDC discovery at %s: %w", o.cfg.Issuer, err)
		return nil, o.lastErr
	}
	// The key set's fetches (at first use and whenever a token names an unknown key
	// id) use a background context carrying our client: a request's would end with it.
	o.verifier = p.VerifierContext(oidc.ClientContext(context.Background(), o.cfg.HTTPClient), &oidc.Config{
		ClientID:             o.cfg.Audience,
		SupportedSigningAlgs: SigningAlgs,
	})
	o.lastErr = nil
	o.log.Info("OIDC issuer discovered")
	return o.verifier, nil
}

// Authenticate verifies a bearer JWT (signature with the issuer's keys, alg in
// SigningAlgs, iss, aud, exp, nbf) and returns its principal. Every refusal wraps
// ErrUnauthenticated; its message says what was wrong in words that carry nothing of
// the token.
func (o *OIDC) Authenticate(ctx context.Context, raw string) (Principal, error) {
	v, err := o.getVerifier(ctx)
	if err != nil {
		o.log.Warn("OIDC token refused: the issuer's keys are not available", "err", err)
		return Principal{}, fmt.Errorf("%w: the OIDC issuer cannot be reached to verify the token", ErrUnauthenticated)
	}
	tok, err := v.Verify(ctx, raw)
	if err != nil {
		var exp *oidc.TokenExpiredError
		if errors.As(err, &exp) {
			return Principal{}, fmt.Errorf("%w: the token has expired", ErrUnauthenticated)
		}
		o.log.Debug("OIDC token refused", "err", err)
		return Principal{}, fmt.Errorf("%w: the token could not be verified", ErrUnauthenticated)
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return Principal{}, fmt.Errorf("%w: the token's claims cannot be read", ErrUnauthenticated)
	}
	name, ok := claimString(claims[o.cfg.UsernameClaim])
	if !ok {
		return Principal{}, fmt.Errorf("%w: the token has no string claim %q to name its principal", ErrUnauthenticated, o.cfg.UsernameClaim)
	}
	if err := validClaimName(name, o.tokenNames); err != nil {
		return Principal{}, fmt.Errorf("%w: the token's %q claim %v", ErrUnauthenticated, o.cfg.UsernameClaim, err)
	}
	return Principal{Name: name, Admin: o.inAdminGroup(claims[o.cfg.GroupsClaim]), Source: "oidc", Expires: tok.Expiry}, nil
}

func (o *OIDC) inAdminGroup(v any) bool {
	if len(o.cfg.AdminGroups) == 0 {
		return false
	}
	var groups []string
	switch g := v.(type) {
	case []any:
		for _, x := range g {
			if s, ok := x.(string); ok {
				groups = append(groups, s)
			}
		}
	case string: // some issuers send a single group as a string
		groups = []string{g}
	}
	for _, g := range groups {
		for _, want := range o.cfg.AdminGroups {
			if g == want {
				return true
			}
		}
	}
	return false
}

// claimString reads a claim as a name: a string, or an integer (some issuers send
// numeric subjects).
func claimString(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return strings.TrimSpace(x), strings.TrimSpace(x) != ""
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return strconv.FormatInt(int64(x), 10), true
		}
	}
	return "", false
}

// errThrottled answers a key fetch asked for too soon after the previous one.
var errThrottled = errors.New("the issuer's keys were fetched moments ago; not again yet")

// throttle lets at most one request other than discovery (the key set's fetches)
// through per interval; discovery has its own bound (RetryEvery).
type throttle struct {
	base      http.RoundTripper
	every     time.Duration
	discovery string

	mu   sync.Mutex
	last time.Time
}

func (t *throttle) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.String() != t.discovery {
		t.mu.Lock()
		now := time.Now()
		if !t.last.IsZero() && now.Sub(t.last) < t.every {
			t.mu.Unlock()
			return nil, errThrottled
		}
		t.last = now
		t.mu.Unlock()
	}
	return t.base.RoundTrip(r)
}
