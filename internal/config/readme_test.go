package config

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestREADMEConfigTable keeps the README's configuration table in step with Config.
// Run with UPDATE_README=1 to rewrite the table from the struct.
func TestREADMEConfigTable(t *testing.T) {
	const path = "../../README.md"
	const begin = "<!-- config-table:begin (kept in step with internal/config by a test) -->\n"
	const end = "<!-- config-table:end -->"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the config-table markers")
	}
	var tb strings.Builder
	tb.WriteString("| variable | default | meaning |\n|---|---|---|\n")
	for _, v := range Vars() {
		def := v.Default
		if def == "" {
			def = "–"
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&tb, "| `%s` | %s | %s |\n", v.Name, def, strings.ReplaceAll(v.Desc, "|", "\\|"))
	}
	want := tb.String()
	got := doc[i+len(begin) : j]
	if got == want {
		return
	}
	if os.Getenv("UPDATE_README") == "1" {
		if err := os.WriteFile(path, []byte(doc[:i+len(begin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("README.md configuration table is out of date; run UPDATE_README=1 go test ./internal/config/ -run README\nwant:\n%s", want)
}
