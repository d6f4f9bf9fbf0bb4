package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode/utf8"
)

// readBody reads a request body of at most cfg.MaxBodyBytes. An empty body returns
// nil. A non-empty body must be declared JSON (415 otherwise); a larger one is 413.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	return readBodyMax(w, r, s.cfg.MaxBodyBytes)
}

// discardBody reads and drops the body of a route that takes none, whatever its type
// (an approval tool posting a form comment is not refused), bounded like readBody.
func (s *Server) discardBody(w http.ResponseWriter, r *http.Request) error {
	max := s.cfg.MaxBodyBytes
	if r.ContentLength > max {
		return errf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body is larger than %d bytes", max)
	}
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, max)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body is larger than %d bytes", max)
		}
		return errf(http.StatusBadRequest, codeInvalidRequest, "cannot read request body")
	}
	return nil
}

// readBodyMax is readBody with its own limit.
func readBodyMax(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength > max {
		return nil, errf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body is larger than %d bytes", max)
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errf(http.StatusRequestEntityTooLarge, codePayloadTooLarge, "request body is larger than %d bytes", max)
		}
		return nil, errf(http.StatusBadRequest, codeInvalidRequest, "cannot read request body")
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, nil
	}
	if !isJSON(r.Header.Get("Content-Type")) {
		return nil, errf(http.StatusUnsupportedMediaType, codeUnsupportedMediaType,
			"Content-Type must be application/json")
	}
	// encoding/json would quietly turn invalid UTF-8 into U+FFFD: a subject would then
	// be stored as something the client never sent.
	if !utf8.Valid(b) {
		return nil, errf(http.StatusBadRequest, codeInvalidJSON, "request body must be valid UTF-8")
	}
	return b, nil
}

func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")))
}

// decodeStrict decodes one JSON object into dst, refusing unknown fields and
// trailing data, and turns decoder errors into 400s that say what was wrong.
func decodeStrict(b []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errf(http.StatusBadRequest, codeInvalidJSON, "request body must be a single JSON object")
	}
	return checkJSONText(b)
}

// checkJSONText refuses what encoding/json accepts quietly but a client, proxy or
// approval UI reading the same body would read differently: a field given twice (the
// last wins here, often the first elsewhere — and request fields match without regard to
// case, so "subject" and "SUBJECT" are the same field to us and two fields to them),
// and a \u escape of half a UTF-16 surrogate pair, which would be stored as U+FFFD,
// a character the client never sent.
func checkJSONText(b []byte) error {
	if i := loneSurrogate(b); i >= 0 {
		return errf(http.StatusBadRequest, codeInvalidJSON, "malformed JSON at byte %d: \\u escape of an unpaired UTF-16 surrogate", i)
	}
	type frame struct {
		obj, wantKey bool
		keys         map[string]bool
	}
	var stack []*frame
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // io.EOF; anything else the decode before has already refused
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if key, ok := tok.(string); ok && top != nil && top.obj && top.wantKey {
			name := key
			if len(stack) == 1 { // the request's own fields
				name = strings.ToLower(key)
			}
			if top.keys[name] {
				return errf(http.StatusBadRequest, codeInvalidJSON, "field %q appears more than once (field names are matched without regard to case)", key)
			}
			top.keys[name] = true
			top.wantKey = false
			continue
		}
		if top != nil && top.obj {
			top.wantKey = true // this token is (the start of) a value
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, wantKey: true, keys: map[string]bool{}})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
	}
}

// loneSurrogate returns the offset of the first \u escape in a JSON string that is
// half of a UTF-16 surrogate pair without its other half, or -1.
func loneSurrogate(b []byte) int {
	in := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case !in:
			in = c == '"'
		case c == '"':
			in = false
		case c == '\\' && i+1 < len(b) && b[i+1] != 'u':
			i++ // a one-character escape (\" \\ \n …)
		case c == '\\':
			r := hex4(b, i+2)
			switch {
			case r >= 0xD800 && r <= 0xDBFF:
				if i+11 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					if lo := hex4(b, i+8); lo >= 0xDC00 && lo <= 0xDFFF {
						i += 11
						continue
					}
				}
				return i
			case r >= 0xDC00 && r <= 0xDFFF:
				return i
			}
			i += 5
		}
	}
	return -1
}

// hex4 reads four hex digits at b[i:], or returns -1.
func hex4(b []byte, i int) int {
	if i+4 > len(b) {
		return -1
	}
	n := 0
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			n = n*16 + int(c-'0')
		case c >= 'a' && c <= 'f':
			n = n*16 + int(c-'a'+10)
		case c >= 'A' && c <= 'F':
			n = n*16 + int(c-'A'+10)
		default:
			return -1
		}
	}
	return n
}

func decodeError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return errf(http.StatusBadRequest, codeInvalidJSON, "malformed JSON at byte %d: %v", syn.Offset, syn)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return errf(http.StatusBadRequest, codeInvalidJSON, "malformed JSON: unexpected end of input")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return errf(http.StatusBadRequest, codeInvalidJSON, "request body must be a JSON object")
		}
		return errf(http.StatusBadRequest, codeInvalidRequest, "field %q must be a %s, got %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return errf(http.StatusBadRequest, codeUnknownField, "%s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return errf(http.StatusBadRequest, codeInvalidJSON, "malformed JSON: %v", err)
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string", "ptr":
		return "string"
	case "bool":
		return "boolean"
	case "map", "struct":
		return "object"
	case "slice", "array":
		return "array"
	}
	return "number"
}
