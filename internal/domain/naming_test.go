package domain

import (
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	for v, ok := range map[string]bool{
		"alice": true, "db/prod": true, "a b": true, "é": true, strings.Repeat("x", MaxNameChars): true,
		"": false, ".": false, "..": false, " a": false, "a ": false, "a\tb": false, "a\nb": false,
		"\xff": false, strings.Repeat("x", MaxNameChars+1): false,
	} {
		if err := ValidateName("subject", v); (err == nil) != ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", v, err, ok)
		}
	}
}

func TestBindingPathEscapesEachSegment(t *testing.T) {
	if got := BindingPath("a/b", "db/prod"); got != "bindings/db%2Fprod/a%2Fb.yaml" {
		t.Errorf("BindingPath = %q", got)
	}
	// é escapes to 6 bytes: 40 of them and ".yaml" fit 255 bytes, 42 do not.
	if err := ValidatePathSegments(strings.Repeat("é", 40), "t"); err != nil {
		t.Errorf("40 é: %v", err)
	}
	if err := ValidatePathSegments(strings.Repeat("é", 42), "t"); err == nil {
		t.Error("42 é accepted as a file name")
	}
	if err := ValidatePathSegments("s", strings.Repeat("é", 43)); err == nil {
		t.Error("43 é accepted as a directory name")
	}
}
