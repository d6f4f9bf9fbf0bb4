package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// Documented limits (api/openapi.yaml says the same; the tests check both).
const (
	maxAttributesBytes = domain.MaxAttributesBytes
	maxIdemKeyChars    = 128 // Idempotency-Key: the idempotency_key column is VARCHAR(128)
)

// createRequest is the body of POST /v1/operations. Pointers tell "absent" from
// "empty"; unknown fields are refused by the decoder.
type createRequest struct {
	Subject    *string         `json:"subject"`
	Target     *string         `json:"target"`
	Action     *string         `json:"action"`
	Repo       *string         `json:"repo"`
	ExpiresAt  *string         `json:"expires_at"`
	Attributes json.RawMessage `json:"attributes"`
	Priority   *string         `json:"priority"`
}

// validName enforces the documented charset of subject and target
// (domain.ValidateName).
//
// The name is NFC-normalised first (domain.NormalizeName), and names a git checkout
// refuses are refused (domain.ValidateCheckoutName).
func validName(field string, p *string) (string, error) {
	if p == nil {
		return "", badRequest("%s is required", field)
	}
	v := domain.NormalizeName(*p)
	if err := domain.ValidateName(field, v); err != nil {
		return "", badRequest("%s", err.Error())
	}
	if err := domain.ValidateCheckoutName(field, v); err != nil {
		return "", badRequest("%s", err.Error())
	}
	return v, nil
}

// validPathSegments refuses a subject or target whose binding file cannot be checked
// out (domain.ValidatePathSegments).
func validPathSegments(subject, target string) error {
	if err := domain.ValidatePathSegments(subject, target); err != nil {
		return badRequest("%s", err.Error())
	}
	return nil
}

// validIdemKey enforces the Idempotency-Key header: 1–128 visible ASCII characters.
func validIdemKey(k string) error {
	if len(k) > maxIdemKeyChars {
		return badRequest("Idempotency-Key must be at most %d characters", maxIdemKeyChars)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return badRequest("Idempotency-Key must contain only visible ASCII characters")
		}
	}
	return nil
}

// canonicalAttributes checks attributes is a JSON object of at most 16 KiB and
// returns it re-encoded with sorted keys and no insignificant white space, so that
// two requests meaning the same thing have the same fingerprint. null means absent.
func canonicalAttributes(raw json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, nil
	}
	if len(t) > maxAttributesBytes {
		return nil, badRequest("attributes must be at most %d bytes", maxAttributesBytes)
	}
	if t[0] != '{' {
		return nil, badRequest("attributes must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber() // keep numbers exactly as sent
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		return nil, badRequest("attributes must be a JSON object")
	}
	if d := domain.JSONDepth(v); d > domain.MaxAttributesDepth {
		// The database refuses such a document (it answered 500 for it).
		return nil, badRequest("attributes are nested %d levels deep; at most %d are stored", d, domain.MaxAttributesDepth)
	}
	if err := domain.CheckAttributeNumbers(v); err != nil {
		return nil, badRequest("attributes: %v; send it as a string to keep it exact", err)
	}
	out, err := json.Marshal(v) // map keys are sorted by encoding/json
	if err != nil {
		return nil, badRequest("attributes must be a JSON object")
	}
	return out, nil
}

// parseExpiresAt parses an RFC 3339 time. Whether it lies in the future is decided by
// the store against the database clock (never the replica's clock).
func parseExpiresAt(p *string) (*time.Time, error) {
	if p == nil {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, *p)
	if err != nil {
		return nil, badRequest("expires_at must be an RFC 3339 time such as 2030-01-02T15:04:05Z")
	}
	t = t.UTC().Truncate(time.Microsecond) // DATETIME(6)
	return &t, nil
}

// fingerprint identifies a request for Idempotency-Key: sha256 of its canonical
// form (defaults applied, times normalised to UTC, attributes with sorted keys).
func fingerprint(p store.OperationCreateParams) string {
	c := struct {
		Subject    string          `json:"subject"`
		Target     string          `json:"target"`
		Action     string          `json:"action"`
		Repo       string          `json:"repo"`
		ExpiresAt  string          `json:"expires_at"`
		Attributes json.RawMessage `json:"attributes,omitempty"`
		// Only when urgent: the fingerprints of normal requests stay what they were
		// before priorities existed, so keys stored by an older version still match.
		Priority string `json:"priority,omitempty"`
	}{Subject: p.Subject, Target: p.Target, Action: string(p.Action), Repo: p.Repo, Attributes: p.Attributes}
	if p.Priority == domain.PriorityUrgent {
		c.Priority = string(p.Priority)
	}
	if p.ExpiresAt != nil {
		c.ExpiresAt = p.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
