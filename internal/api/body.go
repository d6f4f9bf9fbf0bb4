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
	return nil
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
