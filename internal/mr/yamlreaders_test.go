package mr_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/batcherd/batcherd/internal/mr"
)

// hostileStrings are values (and attribute keys) that YAML 1.1 or 1.2 readers take for
// something else when written plain: merge keys, value tags, booleans, nulls, numbers in
// every base and shape, sexagesimals, timestamps, and YAML syntax.
var hostileStrings = []string{
	"=", "<<", "~", "yes", "no", "on", "off", "Yes", "NO", "On", "y", "n", "true", "False", "null", "NULL", "Null",
	"1_000", "1:20", "190:20:30", "0o17", "017", "0x1F", "0b101", "+1", "-0", "1e3", "1.5", ".5", "5.",
	".inf", "-.Inf", ".nan", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2031-05-06T06:08:09Z", "12:30:45",
	"", " ", " leading", "trailing ", "a: b", "a #c", "#c", "- x", "? x", "!tag", "!!str x", "&anchor", "*alias",
	"@x", "`x`", "%x", "|", ">", "{a: 1}", "[1, 2]", "'single'", "\"double\"", "back\\slash",
	"line\nbreak", "tab\tx", "cr\rx", "nel\u0085x", "ls\u2028x", "ps\u2029x", "bom\ufeffx", "é", "日本語", "😀",
	strings.Repeat("long value with spaces ", 12),
}

// Every binding file reads back exactly as sent — subject, target, operation id,
// expires_at and attributes, keys included — with YAML 1.2 (yaml.v3) and YAML 1.1
// (PyYAML safe_load) readers and js-yaml. Written plain, "=" made PyYAML's safe_load
// fail and "<<" was read as a merge key.
func TestBindingFilesReadBackWithEveryReader(t *testing.T) {
	expires := time.Date(2031, 5, 6, 6, 8, 9, 0, time.UTC)
	type doc = map[string]any
	var files []string
	var want []doc
	for i, h := range hostileStrings {
		attrs := map[string]any{h: h, "list": []any{h, 1.5, true, nil}, "nested": map[string]any{"<<": h, "k": 7.0}}
		raw, err := json.Marshal(attrs)
		if err != nil {
			t.Fatal(err)
		}
		subject, target := h, "db/"+h
		out, err := mr.BindingYAMLWithAttributes(subject, target, "op-"+string(rune('a'+i%26)), &expires, raw)
		if err != nil {
			t.Fatalf("%q: %v", h, err)
		}
		files = append(files, out)
		want = append(want, doc{"subject": subject, "target": target, "operation_id": "op-" + string(rune('a'+i%26)),
			"expires_at": "2031-05-06T06:08:09Z", "attributes": attrs})
	}
	check := func(reader string, got []any) {
		t.Helper()
		if got == nil {
			return // the reader is not installed (runReader said so)
		}
		if len(got) != len(want) {
			t.Fatalf("%s read %d documents, want %d", reader, len(got), len(want))
		}
		for i := range want {
			// Compare through JSON, where every reader's numbers are float64.
			w, _ := json.Marshal(want[i])
			g, err := json.Marshal(got[i])
			if err != nil {
				t.Errorf("%s, value %q: %v", reader, hostileStrings[i], err)
				continue
			}
			var wv, gv any
			_ = json.Unmarshal(w, &wv)
			_ = json.Unmarshal(g, &gv)
			if !reflect.DeepEqual(wv, gv) {
				t.Errorf("%s reads %q back differently:\n got %s\nwant %s\nfile:\n%s", reader, hostileStrings[i], g, w, files[i])
			}
		}
	}

	var v3 []any
	for _, f := range files {
		var d map[string]any
		if err := yaml.Unmarshal([]byte(f), &d); err != nil {
			t.Fatalf("yaml.v3: %v\n%s", err, f)
		}
		v3 = append(v3, d)
	}
	check("yaml.v3", v3)

	in, _ := json.Marshal(files)
	check("PyYAML safe_load", runReader(t, in, "python3", "-c", `
import json, sys, yaml
docs = json.load(sys.stdin)
json.dump([yaml.safe_load(d) for d in docs], sys.stdout)
`))
	check("js-yaml", runReader(t, in, "node", "-e", `
const yaml = require('js-yaml');
let s = '';
process.stdin.on('data', d => s += d).on('end', () => {
  process.stdout.write(JSON.stringify(JSON.parse(s).map(d => yaml.load(d))));
});
`))
}

// runReader feeds in to an external YAML reader and decodes the JSON it prints. A
// missing reader skips under a plain go test and fails when BATCHERD_REQUIRE_TOOLS is
// set (make test installs python3-yaml and node-js-yaml: scripts/test-deps.sh).
func runReader(t *testing.T, in []byte, name string, args ...string) []any {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Env = append(os.Environ(), "NODE_PATH=/usr/share/nodejs:/usr/lib/nodejs")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := name + " could not read the files: " + err.Error() + ": " + stderr.String()
		if os.Getenv("BATCHERD_REQUIRE_TOOLS") != "" {
			t.Fatal(msg)
		}
		if _, lerr := exec.LookPath(name); lerr != nil || strings.Contains(stderr.String(), "No module named") || strings.Contains(stderr.String(), "Cannot find module") {
			t.Logf("skipped (reader not installed; make test installs it): %s", msg)
			return nil
		}
		t.Fatal(msg)
	}
	var docs []any
	if err := json.Unmarshal(out, &docs); err != nil {
		t.Fatalf("%s printed %s: %v", name, out, err)
	}
	return docs
}
