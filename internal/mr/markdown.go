package mr

import (
	"strings"
	"unicode"
)

// MarkdownLiteral renders text taken from a request (a subject, a target, a
// principal's name) for an MR description so that GitLab shows it as the characters
// it is and nothing more: no mention (@user), reference (#1, !2, ~label, %milestone,
// group/project#3), link, image, emoji, HTML, heading or list, and no closing keyword
// that would close an issue when the MR merges.
//
// Two readers see a description, and each is defeated on its own terms:
//
//   - the Markdown renderer and GitLab's reference, mention and autolink filters: the
//     text is an inline code span, whose content is literal, and those filters skip code.
//     The fence is one backtick longer than the longest run of backticks in the text,
//     padded with a space when the text starts or ends with a backtick, so the text
//     cannot close the span early (CommonMark, "Code spans");
//   - the closing-keyword pattern, which GitLab matches on the raw description (a
//     keyword, an optional colon, one or more ASCII spaces, then a reference): every
//     ASCII space of the text becomes a no-break space (U+00A0), which reads the same
//     and cannot satisfy the pattern's spaces.
//
// Line breaks and other control characters (none pass admission's name rules, but a
// principal name from an issuer is another source) become U+FFFD, so the text can
// neither end the code span's paragraph nor start a line of its own (a quick action
// such as /merge acts only at the start of a line).
func MarkdownLiteral(text string) string {
	var b strings.Builder
	longest, run := 0, 0
	for _, r := range text {
		if r == '`' {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	fence := strings.Repeat("`", longest+1)
	b.WriteString(fence)
	pad := text == "" || strings.HasPrefix(text, "`") || strings.HasSuffix(text, "`") ||
		strings.HasPrefix(text, " ") || strings.HasSuffix(text, " ")
	if pad {
		b.WriteByte(' ')
	}
	for _, r := range text {
		switch {
		case r == ' ':
			b.WriteRune('\u00a0')
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029':
			b.WriteRune('\ufffd')
		default:
			b.WriteRune(r)
		}
	}
	if pad {
		b.WriteByte(' ')
	}
	b.WriteString(fence)
	return b.String()
}

// TrailerValue renders text taken from a request (a principal's name) as the value of
// a git trailer. GitLab renders commit messages with references and acts on closing
// keywords in commits that reach the default branch, and a trailer is one line: so only
// letters, digits, '.', '_', '-' and an '@' after the first character are kept, every
// other character becomes '_', and the value is cut at 128 characters. Token principal
// names pass unchanged; an issuer's odd name is shown exactly in the MR description.
func TrailerValue(text string) string {
	var b strings.Builder
	n := 0
	for _, r := range strings.TrimSpace(text) {
		if n == 128 {
			b.WriteRune('…')
			break
		}
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '.' || r == '_' || r == '-':
		case r == '@' && n > 0:
		default:
			r = '_'
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}
