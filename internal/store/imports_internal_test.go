package store

import (
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// I7 (no network call inside a database transaction) starts with the store not being
// able to make one: it imports no GitLab client, no HTTP, no internal package but domain
// (the embedded migrations in sql/ are data).
func TestStoreImportsNoNetworkClient(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fs := token.NewFileSet()
	checked := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fs, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			switch {
			case strings.Contains(path, "gitlab"), path == "net/http", strings.HasPrefix(path, "net/http/"),
				strings.HasPrefix(path, "github.com/batcherd/batcherd/internal/") && path != "github.com/batcherd/batcherd/internal/domain":
				t.Errorf("%s imports %s: the store must not reach anything but MySQL", name, path)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no store source files found")
	}
}
