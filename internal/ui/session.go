package ui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/batcherd/batcherd/internal/auth"
)

// A session cookie is payload "." MAC, both base64url: the payload names the principal
// and when the session ends; the MAC is HMAC-SHA256 under the session key, so only a
// holder of the key (a replica of this installation) can make or change one. The
// cookie never carries the token the session was opened with: a stolen cookie ends at
// its expiry, the token does not.
//
// Payload fields, '|'-separated: version, principal name (base64url, so no name can
// inject a separator), admin flag, expiry (Unix seconds), a random nonce that makes
// every session's CSRF token different, the credential's source ("token" or "oidc")
// and, for a token, a MAC of the token's digest: the session is valid only while that
// token is still configured under that name (Handler.session), so removing or
// replacing a token ends its sessions at once, and its admin flag is the configured
// one, not the one at login. An OIDC session ends with its token (the expiry is the
// earlier of the TTL and the token's exp) or when the issuer is unconfigured. s1
// sessions (before the credential binding) are refused: their holders log in again.
const sessionVersion = "s2"

// Session is a logged-in browser.
type Session struct {
	Name    string
	Admin   bool
	Expires time.Time
	source  string // "token" or "oidc"
	cred    string // token sessions: credentialMAC of the token's digest
	nonce   string
	payload string
}

var errBadSession = errors.New("invalid session")

type sealer struct {
	key []byte
}

func (s sealer) mac(purpose, payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(purpose))
	m.Write([]byte{0})
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// credentialMAC binds a session to a token's digest without carrying the digest: the
// cookie is readable by whoever holds it.
func (s sealer) credentialMAC(sum [32]byte) string {
	return base64.RawURLEncoding.EncodeToString(s.mac("credential", string(sum[:])))
}

// seal makes the cookie value of a new session of principal p.
func (s sealer) seal(p auth.Principal, expires time.Time) (string, Session) {
	var n [16]byte
	_, _ = rand.Read(n[:])
	a := "0"
	if p.Admin {
		a = "1"
	}
	cred := ""
	if p.Source == "token" {
		cred = s.credentialMAC(p.Credential)
	}
	nonce := hex.EncodeToString(n[:])
	payload := strings.Join([]string{sessionVersion, base64.RawURLEncoding.EncodeToString([]byte(p.Name)), a,
		strconv.FormatInt(expires.Unix(), 10), nonce, p.Source, cred}, "|")
	v := base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." +
		base64.RawURLEncoding.EncodeToString(s.mac("session", payload))
	return v, Session{Name: p.Name, Admin: p.Admin, Expires: time.Unix(expires.Unix(), 0), source: p.Source, cred: cred,
		nonce: nonce, payload: payload}
}

// open verifies a cookie value: its MAC (constant time), its shape and its expiry.
// Whether its credential is still configured is Handler.session's check.
func (s sealer) open(v string, now time.Time) (Session, error) {
	p64, m64, ok := strings.Cut(v, ".")
	if !ok || len(v) > 4096 {
		return Session{}, errBadSession
	}
	raw, err1 := base64.RawURLEncoding.DecodeString(p64)
	got, err2 := base64.RawURLEncoding.DecodeString(m64)
	if err1 != nil || err2 != nil {
		return Session{}, errBadSession
	}
	payload := string(raw)
	if !hmac.Equal(got, s.mac("session", payload)) {
		return Session{}, errBadSession
	}
	f := strings.Split(payload, "|")
	if len(f) != 7 || f[0] != sessionVersion || (f[2] != "0" && f[2] != "1") ||
		!(f[5] == "token" && f[6] != "" || f[5] == "oidc" && f[6] == "") {
		return Session{}, errBadSession
	}
	name, err := base64.RawURLEncoding.DecodeString(f[1])
	if err != nil || len(name) == 0 {
		return Session{}, errBadSession
	}
	exp, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return Session{}, errBadSession
	}
	if !now.Before(time.Unix(exp, 0)) {
		return Session{}, errBadSession
	}
	return Session{Name: string(name), Admin: f[2] == "1", Expires: time.Unix(exp, 0), source: f[5], cred: f[6],
		nonce: f[4], payload: payload}, nil
}

// csrf is the CSRF token of a session: a MAC of its payload under another purpose, so
// a page's forms carry a value that a cross-site page can neither read nor compute.
func (s sealer) csrf(sess Session) string {
	return base64.RawURLEncoding.EncodeToString(s.mac("csrf", sess.payload))
}

// checkCSRF compares a form's token with the session's in constant time.
func (s sealer) checkCSRF(sess Session, tok string) bool {
	got, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return false
	}
	return hmac.Equal(got, s.mac("csrf", sess.payload))
}

// loginToken signs a login form's nonce: the login form carries nonce "." MAC and the
// same value in a short-lived cookie (double submit), and the value must verify under
// the key, so neither a value set by another site nor one made up passes.
func (s sealer) loginToken() string {
	var n [16]byte
	_, _ = rand.Read(n[:])
	nonce := hex.EncodeToString(n[:])
	return nonce + "." + base64.RawURLEncoding.EncodeToString(s.mac("login", nonce))
}

func (s sealer) checkLoginToken(form, cookie string) bool {
	if form == "" || cookie == "" || len(form) > 256 {
		return false
	}
	if !hmac.Equal([]byte(form), []byte(cookie)) {
		return false
	}
	nonce, m64, ok := strings.Cut(form, ".")
	if !ok {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(m64)
	return err == nil && hmac.Equal(got, s.mac("login", nonce))
}
