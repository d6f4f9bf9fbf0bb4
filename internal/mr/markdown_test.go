package mr

import (
	"regexp"
	"strings"
	"testing"
)

// closing is GitLab's default closing pattern in its essentials (a keyword, an optional
// colon, ASCII spaces, an issue reference), matched on raw text.
var closing = regexp.MustCompile(`(?i)\b(?:close[sd]?|closing|fix(?:e[sd]|ing)?|resolve[sd]?|resolving|implement(?:s|ed|ing)?):? +#\d+`)

func TestMarkdownLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"alice":          "`alice`",
		"a b":            "`a\u00a0b`",
		"x`y":            "``x`y``",
		"`x":             "`` `x ``",
		"a``b":           "```a``b```",
		"":               "`  `",
		"line\nbreak":    "`line\ufffdbreak`",
		"Closes #1":      "`Closes\u00a0#1`",
		"@root [l](u) <": "`@root\u00a0[l](u)\u00a0<`",
	} {
		got := MarkdownLiteral(in)
		if got != want {
			t.Errorf("MarkdownLiteral(%q) = %q, want %q", in, got, want)
		}
		if closing.MatchString(got) {
			t.Errorf("MarkdownLiteral(%q) = %q matches a closing pattern", in, got)
		}
		if strings.ContainsAny(got, "\n\r") {
			t.Errorf("MarkdownLiteral(%q) = %q has a line break", in, got)
		}
	}
}

func TestTrailerValue(t *testing.T) {
	for in, want := range map[string]string{
		"alice":                "alice",
		"token-0a1b2c3d":       "token-0a1b2c3d",
		"alice@example.com":    "alice@example.com",
		"@root":                "_root",
		"fixes #12":            "fixes__12",
		"x\nBatcherd-Batch: 9": "x_Batcherd-Batch__9",
		"Jürgen":               "Jürgen",
	} {
		if got := TrailerValue(in); got != want {
			t.Errorf("TrailerValue(%q) = %q, want %q", in, got, want)
		}
	}
	if got := TrailerValue(strings.Repeat("a", 300)); len([]rune(got)) != 129 {
		t.Errorf("long value: %d runes", len([]rune(got)))
	}
}
