package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// Documented limits (api/openapi.yaml says the same; the tests check both).
const (
	maxNameChars       = 255      // subject and target: the binding columns are VARCHAR(255)
	maxAttributesBytes = 16 << 10 // attributes: a JSON object of at most 16 KiB
	maxIdemKeyChars    = 128      // Idempotency-Key: the idempotency_key column is VARCHAR(128)
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
}

// validName enforces the documented charset of subject and target: 1–255 characters
// of valid UTF-8, each a printable character or an ASCII space, no leading or trailing
// white space, and not "." or "..". The name becomes a path segment of the file
// bindings/<target>/<subject>.yaml after url.PathEscape, which does not escape dots,
// so "." and ".." would step out of the bindings tree.
func validName(field string, p *string) (string, error) {
	if p == nil {
		return "", badRequest("%s is required", field)
	}
	v := *p
	switch {
	case v == "":
		return "", badRequest("%s must not be empty", field)
	case !utf8.ValidString(v):
		return "", badRequest("%s must be valid UTF-8", field)
	case utf8.RuneCountInString(v) > maxNameChars:
		return "", badRequest("%s must be at most %d characters", field, maxNameChars)
	case v == "." || v == "..":
		return "", badRequest("%s must not be %q", field, v)
	}
	for _, r := range v {
		if r != ' ' && !unicode.IsPrint(r) {
			return "", badRequest("%s must contain only printable characters (no control characters, tabs or line breaks)", field)
		}
	}
	if first, _ := utf8.DecodeRuneInString(v); unicode.IsSpace(first) {
		return "", badRequest("%s must not start or end with white space", field)
	}
	if last, _ := utf8.DecodeLastRuneInString(v); unicode.IsSpace(last) {
		return "", badRequest("%s must not start or end with white space", field)
	}
	return v, nil
}

// validPathSegments refuses a subject or target whose binding file cannot be checked
// out: bindings/<target>/<subject>.yaml is written URL-escaped, and each segment must fit
// a file system's name limit. Refused here, at admission, rather than by the pipeline
// of the batch it would join (which would fail every member until bisection isolated it).
func validPathSegments(subject, target string) error {
	dir, file := mr.BindingPathSegments(subject, target)
	if len(dir) > mr.MaxPathSegmentBytes {
		return badRequest("target is too long for a directory name: it takes %d bytes once URL-escaped in bindings/<target>/, "+
			"and file systems take at most %d (non-ASCII characters take 6 to 12 bytes each): shorten it", len(dir), mr.MaxPathSegmentBytes)
	}
	if len(file) > mr.MaxPathSegmentBytes {
		return badRequest("subject is too long for a file name: it takes %d bytes once URL-escaped as <subject>.yaml, "+
			"and file systems take at most %d (non-ASCII characters take 6 to 12 bytes each): shorten it", len(file), mr.MaxPathSegmentBytes)
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
	if err := checkNumbers(v); err != nil {
		return nil, badRequest("attributes: %v; send it as a string to keep it exact", err)
	}
	out, err := json.Marshal(v) // map keys are sorted by encoding/json
	if err != nil {
		return nil, badRequest("attributes must be a JSON object")
	}
	return out, nil
}

// checkNumbers refuses numbers the binding file could not carry as the same number
// (mr.CheckAttributeNumber), wherever they are in the attributes.
func checkNumbers(v any) error {
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			if err := checkNumbers(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := checkNumbers(e); err != nil {
				return err
			}
		}
	case json.Number:
		return mr.CheckAttributeNumber(x)
	}
	return nil
}

// parseExpiresAt parses an RFC 3339 time. Whether it lies in the future is decided by
// the store against the database clock (DESIGN §4: never the replica's clock).
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
	}{Subject: p.Subject, Target: p.Target, Action: string(p.Action), Repo: p.Repo, Attributes: p.Attributes}
	if p.ExpiresAt != nil {
		c.ExpiresAt = p.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
