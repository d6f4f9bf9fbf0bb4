package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpListsEverySubcommandAndVariable(t *testing.T) {
	for _, args := range [][]string{{"help"}, {"--help"}} {
		code, out, _ := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d", args, code)
		}
		for _, c := range commands {
			if !strings.Contains(out, c.name) {
				t.Errorf("help misses subcommand %s", c.name)
			}
		}
		for _, v := range config.Vars() {
			if !strings.Contains(out, v.Name) {
				t.Errorf("help misses %s", v.Name)
			}
		}
	}
	code, out, _ := runCLI(t, "serve", "-h")
	if code != 0 || !strings.Contains(out, "BATCHERD_MERGE_MODE") || !strings.Contains(out, "@every 30s") {
		t.Fatalf("serve -h: exit %d\n%s", code, out)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	if code, _, errs := runCLI(t); code != 2 || !strings.Contains(errs, "Usage") {
		t.Fatalf("no args: exit %d, %q", code, errs)
	}
	if code, _, errs := runCLI(t, "frobnicate"); code != 2 || !strings.Contains(errs, "unknown subcommand") {
		t.Fatalf("unknown: exit %d, %q", code, errs)
	}
	if code, _, _ := runCLI(t, "migrate", "extra"); code != 2 {
		t.Fatalf("extra args: exit %d", code)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := runCLI(t, "version")
	if code != 0 || !strings.HasPrefix(out, "batcherd ") {
		t.Fatalf("version: %d %q", code, out)
	}
}

func TestInvalidConfigNamesVariableAndExits2(t *testing.T) {
	t.Setenv("BATCHERD_MYSQL_DSN", "")
	t.Setenv("BATCHERD_MERGE_MODE", "sometimes")
	code, _, errs := runCLI(t, "serve")
	if code != 2 || !strings.Contains(errs, "BATCHERD_MYSQL_DSN") || !strings.Contains(errs, "BATCHERD_MERGE_MODE") {
		t.Fatalf("exit %d, stderr:\n%s", code, errs)
	}
}

func TestMigrateCheckSchemaVerify(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	t.Setenv("BATCHERD_MYSQL_DSN", dsn)
	t.Setenv("BATCHERD_LOG_FORMAT", "json")
	if code, out, errs := runCLI(t, "check-schema"); code != 3 {
		t.Fatalf("check-schema on an empty database: exit %d (want 3)\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "migrate"); code != 0 {
		t.Fatalf("second migrate must be a no-op: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "check-schema"); code != 0 {
		t.Fatalf("check-schema: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := runCLI(t, "verify"); code != 0 || !strings.Contains(out, "no violations") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errs)
	}
	if strings.Contains(dsn, ":batcherd@") {
		// The DSN password must never reach the output.
		_, out, errs := runCLI(t, "check-schema")
		if strings.Contains(out+errs, "batcherd@tcp") {
			t.Fatalf("DSN leaked into output:\n%s%s", out, errs)
		}
	}
}
