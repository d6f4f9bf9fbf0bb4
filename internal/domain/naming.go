package domain

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// BindingPath is the repository path of a binding's file (a contract, see README
// "Files written to the repository"): bindings/<PathEscape(target)>/<PathEscape(subject)>.yaml.
func BindingPath(subject, target string) string {
	dir, file := BindingPathSegments(subject, target)
	return "bindings/" + dir + "/" + file
}

// MaxPathSegmentBytes is the longest file or directory name the file systems a
// repository is checked out on take (ext4, XFS, APFS, NTFS: 255). GitLab stores a longer
// one, but no clone can write it, so the pipeline of its batch fails.
const MaxPathSegmentBytes = 255

// BindingPathSegments returns the directory and file name of a binding's file as they
// appear in BindingPath: PathEscape(target) and PathEscape(subject) + ".yaml". Each must
// fit MaxPathSegmentBytes; escaping makes them longer than the names (a non-ASCII
// character takes 3 bytes per UTF-8 byte).
func BindingPathSegments(subject, target string) (dir, file string) {
	return url.PathEscape(target), url.PathEscape(subject) + ".yaml"
}

// Documented limits of an application (api/openapi.yaml says the same; the API tests
// check both).
const (
	MaxNameChars       = 255      // subject and target: the binding columns are VARCHAR(255)
	MaxAttributesBytes = 16 << 10 // attributes: a JSON object of at most 16 KiB
)

// ValidateName enforces the documented charset of a subject or target (field names
// which, for the message): 1–255 characters of valid UTF-8, each a printable character
// or an ASCII space, no leading or trailing white space, and not "." or "..". The name
// becomes a path segment of the file bindings/<target>/<subject>.yaml after
// url.PathEscape, which does not escape dots, so "." and ".." would step out of the
// bindings tree. The error's text is meant for the caller.
func ValidateName(field, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%s must not be empty", field)
	case !utf8.ValidString(v):
		return fmt.Errorf("%s must be valid UTF-8", field)
	case utf8.RuneCountInString(v) > MaxNameChars:
		return fmt.Errorf("%s must be at most %d characters", field, MaxNameChars)
	case v == "." || v == "..":
		return fmt.Errorf("%s must not be %q", field, v)
	}
	for _, r := range v {
		if r != ' ' && !unicode.IsPrint(r) {
			return fmt.Errorf("%s must contain only printable characters (no control characters, tabs or line breaks)", field)
		}
	}
	if first, _ := utf8.DecodeRuneInString(v); unicode.IsSpace(first) {
		return fmt.Errorf("%s must not start or end with white space", field)
	}
	if last, _ := utf8.DecodeLastRuneInString(v); unicode.IsSpace(last) {
		return fmt.Errorf("%s must not start or end with white space", field)
	}
	return nil
}

// ValidatePathSegments refuses a subject or target whose binding file cannot be
// checked out: bindings/<target>/<subject>.yaml is written URL-escaped, and each
// segment must fit a file system's name limit. Refused at admission rather than by the
// pipeline of the batch it would join (which would fail every member until bisection
// isolated it). The error's text is meant for the caller.
func ValidatePathSegments(subject, target string) error {
	dir, file := BindingPathSegments(subject, target)
	if len(dir) > MaxPathSegmentBytes {
		return fmt.Errorf("target is too long for a directory name: it takes %d bytes once URL-escaped in bindings/<target>/, "+
			"and file systems take at most %d (non-ASCII characters take 6 to 12 bytes each): shorten it", len(dir), MaxPathSegmentBytes)
	}
	if len(file) > MaxPathSegmentBytes {
		return fmt.Errorf("subject is too long for a file name: it takes %d bytes once URL-escaped as <subject>.yaml, "+
			"and file systems take at most %d (non-ASCII characters take 6 to 12 bytes each): shorten it", len(file), MaxPathSegmentBytes)
	}
	return nil
}

// CheckAttributeNumber says whether a number in an operation's attributes can be
// written to its binding file as the same number for every reader: an integer that
// fits 64 bits, or another number a 64-bit float holds (not 1e999). The API refuses
// the others when the operation is created.
func CheckAttributeNumber(n json.Number) error {
	s := string(n)
	if IsJSONInteger(s) {
		if _, err := strconv.ParseInt(s, 10, 64); err != nil {
			return fmt.Errorf("the integer %s does not fit in 64 bits", s)
		}
		return nil
	}
	if _, err := strconv.ParseFloat(s, 64); err != nil {
		return fmt.Errorf("the number %s is out of a 64-bit float's range", s)
	}
	return nil
}

// CheckAttributeNumbers applies CheckAttributeNumber to every number of a decoded JSON
// value (decoded with UseNumber).
func CheckAttributeNumbers(v any) error {
	switch x := v.(type) {
	case map[string]any:
		for _, e := range x {
			if err := CheckAttributeNumbers(e); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := CheckAttributeNumbers(e); err != nil {
				return err
			}
		}
	case json.Number:
		return CheckAttributeNumber(x)
	}
	return nil
}

// IsJSONInteger reports whether a JSON number has neither a fraction nor an exponent.
func IsJSONInteger(n string) bool {
	return !strings.ContainsAny(n, ".eE")
}
