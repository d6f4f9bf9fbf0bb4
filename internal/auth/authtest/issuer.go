// Package authtest runs a local OIDC issuer for tests: a discovery document, a JWKS
// endpoint, generated RSA and EC keys that can be rotated, and tokens signed with
// them — or signed wrongly on purpose (alg none, HS256 with the public key, a key the
// issuer does not publish).
package authtest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// Key is one signing key of the issuer.
type Key struct {
	ID   string
	Alg  jose.SignatureAlgorithm
	Priv crypto.Signer
}

// Public is the key's public half.
func (k *Key) Public() crypto.PublicKey { return k.Priv.Public() }

// NewKey generates a key for alg (RS256 or ES256).
func NewKey(t testing.TB, id string, alg jose.SignatureAlgorithm) *Key {
	t.Helper()
	var priv crypto.Signer
	var err error
	switch alg {
	case jose.ES256:
		priv, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	default:
		priv, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &Key{ID: id, Alg: alg, Priv: priv}
}

// Issuer is a running test issuer.
type Issuer struct {
	URL      string
	Audience string
	srv      *httptest.Server
	t        testing.TB

	mu        sync.Mutex
	published []*Key
	current   *Key
	n         int

	down        atomic.Bool
	JWKSFetches atomic.Int64
}

// NewIssuer starts an issuer with one RSA key; it stops when the test ends.
func NewIssuer(t testing.TB, audience string) *Issuer {
	t.Helper()
	i := &Issuer{t: t, Audience: audience}
	i.srv = httptest.NewServer(http.HandlerFunc(i.serve))
	t.Cleanup(i.srv.Close)
	i.URL = i.srv.URL
	i.Rotate(jose.RS256)
	return i
}

func (i *Issuer) serve(w http.ResponseWriter, r *http.Request) {
	if i.down.Load() {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/.well-known/openid-configuration":
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                i.URL,
			"authorization_endpoint":                i.URL + "/oauth/authorize",
			"token_endpoint":                        i.URL + "/oauth/token",
			"jwks_uri":                              i.URL + "/oauth/discovery/keys",
			"response_types_supported":              []string{"code"},
			"subject_types_supported":               []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256", "ES256"},
		})
	case "/oauth/discovery/keys":
		i.JWKSFetches.Add(1)
		i.mu.Lock()
		var set jose.JSONWebKeySet
		for _, k := range i.published {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: k.ID, Algorithm: string(k.Alg), Use: "sig"})
		}
		i.mu.Unlock()
		_ = json.NewEncoder(w).Encode(set)
	default:
		http.NotFound(w, r)
	}
}

// SetDown makes every endpoint answer 503 (true) or serve again (false).
func (i *Issuer) SetDown(down bool) { i.down.Store(down) }

// Rotate makes a new key of alg the signing key and the only published one (the
// previous keys are withdrawn, as after a rotation that retired them).
func (i *Issuer) Rotate(alg jose.SignatureAlgorithm) *Key {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.n++
	k := NewKey(i.t, fmt.Sprintf("key-%d", i.n), alg)
	i.published = []*Key{k}
	i.current = k
	return k
}

// Current is the signing key.
func (i *Issuer) Current() *Key {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.current
}

// Claims returns valid claims for subject: iss, aud, sub, iat, exp (in 10 minutes).
func (i *Issuer) Claims(sub string) map[string]any {
	now := time.Now()
	return map[string]any{
		"iss": i.URL, "aud": i.Audience, "sub": sub,
		"iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix(),
	}
}

// Token signs claims with the current key.
func (i *Issuer) Token(claims map[string]any) string { return Sign(i.t, i.Current(), claims) }

// Sign signs claims with k (kid = k.ID).
func Sign(t testing.TB, k *Key, claims map[string]any) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Alg, Key: k.Priv},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", k.ID))
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, s, claims)
}

// SignHS256WithPublicKey signs claims with HMAC-SHA256 whose secret is k's public key
// (PEM), naming k's key id: the algorithm-confusion attack on verifiers that take the
// alg from the token.
func SignHS256WithPublicKey(t testing.TB, k *Key, claims map[string]any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		t.Fatal(err)
	}
	secret := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: secret},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", k.ID))
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, s, claims)
}

// Unsigned returns claims as a JWT with alg "none" and no signature, naming kid.
func Unsigned(t testing.TB, kid string, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT", "kid": kid})
	c, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding
	return enc.EncodeToString(h) + "." + enc.EncodeToString(c) + "."
}

func sign(t testing.TB, s jose.Signer, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	out, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}
