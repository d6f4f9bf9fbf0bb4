package domain

import (
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// NormalizeName returns a subject or target in Unicode NFC. "é" sent precomposed and
// "é" sent as e + combining accent are one name to a person and to macOS's file
// system, two to git and to the database: normalising on input keeps them one binding
// and one file.
func NormalizeName(s string) string { return norm.NFC.String(s) }

// ValidateCheckoutName refuses a subject or target that a git checkout or GitLab
// refuses as a path segment (README, "Names refused"): ".git" in any letter case, also
// with trailing dots or spaces (Windows and macOS drop those, so ".git." is ".git" on
// a checkout there), its 8.3 short name "git~1", and any name ending in a dot or a
// space (Windows strips them, so two bindings would share one file). Such a name used
// to be merged: the batch's pipeline — or every clone of the repository afterwards —
// then failed. The error's text is meant for the caller.
func ValidateCheckoutName(field, v string) error {
	if strings.HasSuffix(v, ".") || strings.HasSuffix(v, " ") {
		return fmt.Errorf("%s must not end with a dot or a space: Windows checkouts drop them, so the file would collide with another", field)
	}
	base := strings.ToLower(strings.TrimRight(v, ". "))
	if base == ".git" || base == "git~1" {
		return fmt.Errorf("%s must not be %q in any letter case: git refuses that path in a checkout", field, v)
	}
	return nil
}

// MaxAttributesDepth is how deeply attributes may nest: the attributes object and the
// objects and arrays inside it, 31 levels in all. MariaDB's JSON functions (the
// JSON_VALID check on operation.attributes) refuse a document nested 32 levels deep;
// measured on 10.11: 31 nested containers are valid, 32 are not.
const MaxAttributesDepth = 31

// JSONDepth is the nesting depth of a decoded JSON value: 0 for a scalar, 1 for an
// empty object or array, 1 + the deepest element otherwise.
func JSONDepth(v any) int {
	switch x := v.(type) {
	case map[string]any:
		d := 0
		for _, e := range x {
			d = max(d, JSONDepth(e))
		}
		return d + 1
	case []any:
		d := 0
		for _, e := range x {
			d = max(d, JSONDepth(e))
		}
		return d + 1
	}
	return 0
}
