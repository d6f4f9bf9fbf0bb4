// Package auth turns a request's bearer credential into a named principal: who asked,
// who approved, whose idempotency key it is (README, "Principals").
//
// Two sources, tried in this order:
//
//   - static tokens from BATCHERD_API_TOKENS / BATCHERD_ADMIN_TOKENS (entries
//     "name=token", or a bare "token" that acts as token-<first 8 hex of its sha256>).
//     Only the SHA-256 of each token is kept in memory, and a presented token is
//     compared with every stored digest in constant time (no early exit, fixed-size
//     digests), so timing tells neither which token matched nor its length;
//   - bearer JWTs of an OIDC issuer, verified with go-oidc against the issuer's published
//     keys (oidc.go).
//
// Nothing here logs or returns a token: errors name variables, entries by position
// and principals by name.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"
)

// Principal is who a request acts as.
type Principal struct {
	// Name is recorded as requested_by / approved_by / actor and scopes idempotency keys.
	Name string
	// Admin principals may call /v1/admin/* and act on others' operations where the
	// API allows an admin to.
	Admin bool
	// Source is how the principal was established: "token", "oidc" or "insecure".
	Source string
	// Expires is when the credential stops being valid (an OIDC token's exp); zero for
	// a configured token, which is valid for as long as it is configured.
	Expires time.Time
	// Credential is the SHA-256 of a configured token (zero for OIDC): what a status
	// page session is bound to, so removing or replacing the token ends its sessions
	// (TokenPrincipal). A digest, never the token; never logged.
	Credential [32]byte
}

// Reserved principal names. AutoApprover is the approved_by of an operation admitted
// by BATCHERD_AUTO_APPROVE (or by the expiry loop); Anonymous is every caller when
// BATCHERD_INSECURE_NO_AUTH is on. No configured or OIDC principal may take them, so
// the record cannot be forged by naming a principal "auto".
const (
	AutoApprover = "auto"
	Anonymous    = "anonymous"
	System       = "batcherd"
)

// MaxNameLen bounds a principal name (characters). The database columns holding names
// are VARCHAR(128); a unique key (principal, idempotency key) stays short with it.
const MaxNameLen = 128

// ErrUnauthenticated: no valid credential (HTTP 401). The wrapped message says why in
// words safe to return to the caller (never the token).
var ErrUnauthenticated = errors.New("unauthenticated")

// reserved reports whether name is one batcherd uses itself.
func reserved(name string) bool {
	switch strings.ToLower(name) {
	case AutoApprover, Anonymous, System:
		return true
	}
	return false
}

// ValidTokenName reports whether name may name a token principal: 1–64 characters of
// ASCII letters, digits, '.', '_', '-', '@', starting with a letter or digit, and not
// a reserved name. Narrow on purpose: these names appear in MR descriptions, commit
// trailers and logs, where anything richer would need escaping everywhere.
func ValidTokenName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("name must be 1 to 64 characters, got %d", len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i > 0 {
			ok = ok || c == '.' || c == '_' || c == '-' || c == '@'
		}
		if !ok {
			return fmt.Errorf("name %q: use ASCII letters, digits, '.', '_', '-' and '@', starting with a letter or digit", name)
		}
	}
	if reserved(name) {
		return fmt.Errorf("name %q is reserved by batcherd", name)
	}
	return nil
}

// BareName is the principal name of a bare token entry: token-<first 8 hex digits of
// the token's SHA-256>. It identifies the token in records without revealing it.
func BareName(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "token-" + hex.EncodeToString(sum[:4])
}

// TokenList is one configured list of entries and the variable it came from (used in
// error messages: BATCHERD_API_TOKENS or BATCHERD_API_TOKENS_FILE).
type TokenList struct {
	Var     string
	Entries []string
	Admin   bool
}

type tokenEntry struct {
	sum   [32]byte
	name  string
	admin bool
}

// Tokens is the set of static token principals. Only digests are kept.
type Tokens struct {
	entries []tokenEntry
	names   map[string]bool // lower-cased, to refuse OIDC names that would collide
}

// ParseTokens parses the entries of every list. Each problem is reported naming its
// variable and the entry's position (and the principal's name where it has one), never
// the token: a name that is invalid or used twice, an empty token, and the same token
// twice — in one list or across the API and admin lists (one token would otherwise act
// as two principals, and which one would depend on the order of the checks).
func ParseTokens(lists ...TokenList) (*Tokens, error) {
	t := &Tokens{names: map[string]bool{}}
	var errs []error
	type seen struct {
		where string
		name  string
	}
	bySum := map[[32]byte]seen{}
	byName := map[string]string{}
	for _, l := range lists {
		for i, e := range l.Entries {
			e = strings.TrimSpace(e)
			if e == "" {
				continue
			}
			where := fmt.Sprintf("%s entry %d", l.Var, i+1)
			name, tok, named := strings.Cut(e, "=")
			if !named {
				tok, name = e, BareName(e)
			} else {
				name = strings.TrimSpace(name)
				tok = strings.TrimSpace(tok)
				if err := ValidTokenName(name); err != nil {
					errs = append(errs, fmt.Errorf("%s: %v (entries are name=token or a bare token without '=')", where, err))
					continue
				}
				if tok == "" {
					errs = append(errs, fmt.Errorf("%s (principal %q): the token after '=' is empty", where, name))
					continue
				}
			}
			sum := sha256.Sum256([]byte(tok))
			if prev, dup := bySum[sum]; dup {
				errs = append(errs, fmt.Errorf("%s (principal %q) has the same token as %s (principal %q): every principal needs its own token", where, name, prev.where, prev.name))
				continue
			}
			bySum[sum] = seen{where, name}
			key := strings.ToLower(name)
			if prev, dup := byName[key]; dup {
				errs = append(errs, fmt.Errorf("%s: principal name %q is already used by %s (names are unique, regardless of case)", where, name, prev))
				continue
			}
			byName[key] = where
			t.entries = append(t.entries, tokenEntry{sum: sum, name: name, admin: l.Admin})
			t.names[key] = true
		}
	}
	return t, errors.Join(errs...)
}

// Len is how many token principals are configured.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

// lookup finds the principal of a token. It compares the token's digest with every
// stored digest and selects the match without branching on it, so the time it takes
// depends only on how many tokens are configured.
func (t *Tokens) lookup(tok string) (Principal, bool) {
	if t == nil || len(t.entries) == 0 {
		return Principal{}, false
	}
	sum := sha256.Sum256([]byte(tok))
	idx := -1
	for i := range t.entries {
		eq := subtle.ConstantTimeCompare(sum[:], t.entries[i].sum[:])
		idx = subtle.ConstantTimeSelect(eq, i, idx)
	}
	if idx < 0 {
		return Principal{}, false
	}
	return t.entries[idx].principal(), true
}

func (e tokenEntry) principal() Principal {
	return Principal{Name: e.name, Admin: e.admin, Source: "token", Credential: e.sum}
}

// byName finds the configured token principal named name (names are unique).
func (t *Tokens) byName(name string) (Principal, bool) {
	if t == nil {
		return Principal{}, false
	}
	for _, e := range t.entries {
		if e.name == name {
			return e.principal(), true
		}
	}
	return Principal{}, false
}

// Authenticator establishes the principal of a bearer credential.
type Authenticator struct {
	tokens *Tokens
	oidc   *OIDC
}

// New returns an Authenticator over static tokens and, when o is not nil, an OIDC
// issuer.
func New(tokens *Tokens, o *OIDC) *Authenticator {
	if o != nil {
		o.tokenNames = tokens
	}
	return &Authenticator{tokens: tokens, oidc: o}
}

// Configured reports whether any credential can succeed (a token or an issuer).
func (a *Authenticator) Configured() bool {
	return a != nil && (a.tokens.Len() > 0 || a.oidc != nil)
}

// Authenticate returns the principal of a bearer credential, or an error wrapping
// ErrUnauthenticated whose message is safe to show the caller.
func (a *Authenticator) Authenticate(ctx context.Context, bearer string) (Principal, error) {
	if p, ok := a.tokens.lookup(bearer); ok {
		return p, nil
	}
	if a.oidc != nil && looksLikeJWT(bearer) {
		return a.oidc.Authenticate(ctx, bearer)
	}
	return Principal{}, fmt.Errorf("%w: invalid bearer token", ErrUnauthenticated)
}

// TokenPrincipal is the configured token principal named name as configured now (its
// admin flag and Credential): a status page session opened with a token is valid only
// while the same token is configured under the same name.
func (a *Authenticator) TokenPrincipal(name string) (Principal, bool) {
	if a == nil {
		return Principal{}, false
	}
	return a.tokens.byName(name)
}

// OIDCEnabled reports whether an issuer is configured (sessions opened with an OIDC
// token end when it is removed).
func (a *Authenticator) OIDCEnabled() bool { return a != nil && a.oidc != nil }

// looksLikeJWT: three base64url segments separated by dots (JWS compact form).
func looksLikeJWT(s string) bool {
	return strings.Count(s, ".") == 2 && len(s) < 16<<10
}

// validClaimName checks a principal name taken from a token's claim: non-empty, at
// most MaxNameLen characters, valid UTF-8 without control characters, not reserved,
// and not the name of a configured token principal (an issuer's user must not be able
// to act as, or withdraw the operations of, a token principal by taking its name).
func validClaimName(name string, tokens *Tokens) error {
	switch {
	case name == "":
		return errors.New("is empty")
	case !utf8.ValidString(name):
		return errors.New("is not valid UTF-8")
	case utf8.RuneCountInString(name) > MaxNameLen:
		return fmt.Errorf("is longer than %d characters", MaxNameLen)
	case reserved(name):
		return fmt.Errorf("%q is reserved by batcherd", name)
	case strings.HasPrefix(strings.ToLower(name), "token-"):
		return fmt.Errorf("%q looks like a token principal's name", name)
	}
	for _, r := range name {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == 0x2028 || r == 0x2029 {
			return errors.New("contains a control character")
		}
	}
	if tokens != nil && tokens.names[strings.ToLower(name)] {
		return fmt.Errorf("%q is the name of a configured token principal", name)
	}
	return nil
}

// LogAttr is the principal as a log attribute (its name only).
func (p Principal) LogAttr() slog.Attr { return slog.String("principal", p.Name) }
