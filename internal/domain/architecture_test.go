package domain

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// docs/ARCHITECTURE.md draws the transition tables for readers; they must be these
// tables, row for row, in each entity's section.
func TestArchitectureDocMatchesTheTables(t *testing.T) {
	raw, err := os.ReadFile("../../docs/ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	section := func(heading string) string {
		i := strings.Index(doc, heading)
		if i < 0 {
			t.Fatalf("docs/ARCHITECTURE.md has no section %q", heading)
		}
		rest := doc[i+len(heading):]
		if j := strings.Index(rest, "\n#"); j >= 0 {
			rest = rest[:j]
		}
		return rest
	}
	check := func(heading string, rows []string) {
		t.Helper()
		sec := section(heading)
		drawn := 0
		for _, l := range strings.Split(sec, "\n") {
			if strings.HasPrefix(l, "| `") || strings.HasPrefix(l, "| — |") {
				drawn++
			}
		}
		for _, r := range rows {
			if !strings.Contains(sec, r) {
				t.Errorf("%s: the doc lacks the row %s", heading, r)
			}
		}
		if drawn != len(rows) {
			t.Errorf("%s: the doc draws %d transitions, the table has %d", heading, drawn, len(rows))
		}
	}
	row := func(from, to, by string) string {
		f := "—"
		if from != "" {
			f = "`" + from + "`"
		}
		return fmt.Sprintf("| %s | `%s` | %s |", f, to, by)
	}
	var ops, batches, bindings []string
	for _, tr := range OpTransitions {
		ops = append(ops, row(string(tr.From), string(tr.To), tr.By))
	}
	for _, tr := range BatchTransitions {
		from := ""
		if tr.From != 0 {
			from = tr.From.String()
		}
		batches = append(batches, row(from, tr.To.String(), tr.By))
	}
	for _, tr := range BindingTransitions {
		bindings = append(bindings, row(string(tr.From), string(tr.To), tr.By))
	}
	check("### Operation", ops)
	check("### Batch", batches)
	check("### Binding", bindings)
}
