package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The same key added by two components (the app and the scanner both add replica; the
// app and the API both add component) and again on the record is written once, with
// the latest value; a group keeps its own keys apart; durations are strings.
func TestOneKeyOnceAndDurationsAsStrings(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "json", "debug")
	if err != nil {
		t.Fatal(err)
	}
	l := log.With("replica", "r1", "component", "api").With("component", "scanner", "replica", "r1")
	l.Info("m", "replica", "r2", "wait", 20*time.Second, "n", 1)
	l.WithGroup("g").With("replica", "inner").Info("grouped", "replica", "inner2")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 lines, got:\n%s", buf.String())
	}
	for _, line := range lines {
		if dups, err := DuplicateKeys([]byte(line)); err != nil || len(dups) > 0 {
			t.Errorf("keys twice %v (%v): %s", dups, err, line)
		}
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	if first["replica"] != "r2" || first["component"] != "scanner" || first["wait"] != "20s" || first["n"] != float64(1) {
		t.Errorf("first line: %s", lines[0])
	}
	var second struct {
		Replica string            `json:"replica"`
		G       map[string]string `json:"g"`
	}
	if err := json.Unmarshal([]byte(lines[1]), &second); err != nil {
		t.Fatal(err)
	}
	if second.Replica != "r1" || second.G["replica"] != "inner2" {
		t.Errorf("grouped line: %s", lines[1])
	}

	buf.Reset()
	text, err := New(&buf, "text", "info")
	if err != nil {
		t.Fatal(err)
	}
	text.With("replica", "r1").With("replica", "r1").Info("m", "wait", 1500*time.Millisecond)
	if out := buf.String(); strings.Count(out, "replica=") != 1 || !strings.Contains(out, "wait=1.5s") {
		t.Errorf("text line: %q", out)
	}
}

func TestDuplicateKeys(t *testing.T) {
	for line, want := range map[string]string{
		`{"a":1,"b":{"a":2,"c":[{"d":1,"d":2}]}}`: "d",
		`{"a":1,"a":2}`:       "a",
		`{"a":1,"b":{"a":2}}`: "",
	} {
		dups, err := DuplicateKeys([]byte(line))
		if err != nil || strings.Join(dups, ",") != want {
			t.Errorf("DuplicateKeys(%s) = %v, %v; want %q", line, dups, err, want)
		}
	}
}
