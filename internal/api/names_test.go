package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// Names a git checkout refuses are refused at admission (400): ".git" in any case or
// with trailing dots or spaces, "git~1", a name ending in a dot or a space. Such names
// used to be accepted and merged, and the repository's clones then failed.
func TestAdmissionRefusesNamesACheckoutRefuses(t *testing.T) {
	e := newEnv(t, nil)
	for _, bad := range []string{".git", ".GIT", ".Git", ".git.", ".git ", ".git. .", "git~1", "GIT~1", "git~1.", "alice.", "alice ", "db/prod."} {
		for _, field := range []string{"subject", "target"} {
			subject, target := "alice", "db/prod"
			if field == "subject" {
				subject = bad
			} else {
				target = bad
			}
			if r := e.create(subject, target, "grant"); r.status != 400 || r.errCode() != "invalid_request" || !strings.Contains(string(r.raw), field) {
				t.Errorf("%s %q: %d %s, want 400 naming %s", field, bad, r.status, r.raw, field)
			}
		}
	}
	for _, ok := range []string{".gitignore", "git", "a.git", "git~2", ".github"} {
		if r := e.create(ok, "t-"+ok, "grant"); r.status != 201 {
			t.Errorf("%q refused: %d %s", ok, r.status, r.raw)
		}
	}
}

// Subjects and targets are NFC-normalised: "é" precomposed and "e" + combining accent
// are one binding, stored precomposed.
func TestAdmissionNormalisesNamesToNFC(t *testing.T) {
	e := newEnv(t, nil)
	r := e.create("jose\u0301", "caf\u0065\u0301/db", "grant")
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.raw)
	}
	if op := r.op(); op["subject"] != "jos\u00e9" || op["target"] != "caf\u00e9/db" {
		t.Fatalf("stored %q → %q, want NFC", op["subject"], op["target"])
	}
	if r := e.create("jos\u00e9", "caf\u00e9/db", "grant"); r.status != 409 || r.errCode() != "binding_busy" {
		t.Fatalf("the same name in NFC: %d %s, want 409 binding_busy (one binding)", r.status, r.raw)
	}
}

// A grant whose file differs from an active binding's file only by letter case is
// refused with 409 case_collision: on a case-insensitive checkout they are one file.
func TestAdmissionRefusesCaseOnlyCollisions(t *testing.T) {
	e := newEnv(t, nil)
	e.mustCreate("alice", "db/prod", "grant")
	e.exec("UPDATE binding SET status = 'active'")
	for _, c := range [][2]string{{"Alice", "db/prod"}, {"alice", "DB/Prod"}, {"ALICE", "DB/PROD"}} {
		r := e.create(c[0], c[1], "grant")
		if r.status != 409 || r.errCode() != "case_collision" || !strings.Contains(string(r.raw), "alice") {
			t.Errorf("%s → %s: %d %s, want 409 case_collision naming alice", c[0], c[1], r.status, r.raw)
		}
	}
	// Another repository's folder, or another name, is no collision.
	if r := e.do(req{method: "POST", path: "/v1/operations", token: apiToken,
		body: fmt.Sprintf(`{"subject":"Alice","target":"db/prod","action":"grant","repo":%q}`, repoB)}); r.status != 201 {
		t.Errorf("same name in another repository: %d %s", r.status, r.raw)
	}
	if r := e.create("alicia", "db/prod", "grant"); r.status != 201 {
		t.Errorf("another name: %d %s", r.status, r.raw)
	}
}

// Attributes nested deeper than the database stores are refused with 400 (they
// answered 500: MariaDB's JSON check refuses 32 levels).
func TestAdmissionRefusesAttributesTooDeep(t *testing.T) {
	e := newEnv(t, nil)
	nest := func(levels int) string { // levels objects, the attributes object included
		return strings.Repeat(`{"a":`, levels) + "1" + strings.Repeat("}", levels)
	}
	for levels, want := range map[int]int{31: 201, 32: 400, 40: 400} {
		body, _ := json.Marshal(map[string]any{"subject": fmt.Sprintf("s%d", levels), "target": "t", "action": "grant", "attributes": json.RawMessage(nest(levels))})
		r := e.do(req{method: "POST", path: "/v1/operations", token: apiToken, body: string(body)})
		if r.status != want {
			t.Errorf("attributes nested %d deep: %d %s, want %d", levels, r.status, r.raw, want)
		}
	}
}
