package domain

import (
	"strings"
	"testing"
)

func TestParseEventReceivers(t *testing.T) {
	rs, errs := ParseEventReceivers([]string{
		"https://user:s3cret@hooks.example.com/a?token=x=y",
		"audit=https://audit.example.com/in",
		"https://hooks.example.com/b",
	})
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	want := []struct{ name, label string }{{"", "hooks.example.com"}, {"audit", "audit"}, {"", "hooks.example.com#2"}}
	for i, w := range want {
		if rs[i].Name != w.name || rs[i].Label != w.label {
			t.Errorf("entry %d: name %q label %q, want %q %q", i, rs[i].Name, rs[i].Label, w.name, w.label)
		}
		if rs[i].ID < ReceiverIDMin {
			t.Errorf("entry %d: id %d below ReceiverIDMin", i, rs[i].ID)
		}
		if strings.Contains(rs[i].Label, "s3cret") {
			t.Errorf("label carries the credentials")
		}
	}
	if rs[0].URL != "https://user:s3cret@hooks.example.com/a?token=x=y" || rs[1].URL != "https://audit.example.com/in" {
		t.Errorf("URLs: %q %q", rs[0].URL, rs[1].URL)
	}
}

// The identity is what keeps a pending event with its receiver: it must not depend on
// the entry's position, and a named receiver keeps it when its URL changes.
func TestReceiverIdentityStable(t *testing.T) {
	a, _ := ParseEventReceivers([]string{"https://a.example/x", "ops=https://b.example/y"})
	b, _ := ParseEventReceivers([]string{"ops=https://b.example/rotated?key=2", "https://c.example", "https://a.example/x"})
	if a[0].ID != b[2].ID {
		t.Error("an unnamed receiver's identity changed with its position")
	}
	if a[1].ID != b[0].ID {
		t.Error("a named receiver's identity changed with its URL or position")
	}
	if b[1].ID == a[0].ID || b[1].ID == a[1].ID {
		t.Error("distinct receivers share an identity")
	}
	if ReceiverID("x", "") == ReceiverID("", "x") {
		t.Error("a name and a URL with the same text share an identity")
	}
}

func TestParseEventReceiversRefuses(t *testing.T) {
	secret := "https://user:hunter2@h.example/p"
	for _, tc := range []struct {
		entries []string
		want    string
	}{
		{[]string{"ftp://h.example"}, "entry 1 is not an http(s) URL"},
		{[]string{"https://a.example", "Bad Name=" + secret}, "entry 2: receiver name"},
		{[]string{secret, secret}, "entries 1 and 2 are the same receiver"},
		{[]string{"x=https://a.example", "x=" + secret}, "entries 1 and 2 are the same receiver"},
		{[]string{"x=notaurl"}, "entry 1 is not an http(s) URL"},
		{[]string{"=https://a.example"}, "entry 1: receiver name"},
	} {
		_, errs := ParseEventReceivers(tc.entries)
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("%q: errors %v, want one containing %q", tc.entries, errs, tc.want)
			continue
		}
		if strings.Contains(errs[0].Error(), "hunter2") {
			t.Errorf("%q: error quotes the credentials: %v", tc.entries, errs[0])
		}
	}
	many := make([]string, MaxEventReceivers+1)
	for i := range many {
		many[i] = "https://h.example/" + strings.Repeat("x", i)
	}
	if _, errs := ParseEventReceivers(many); len(errs) != 1 {
		t.Errorf("%d receivers: errors %v, want one", len(many), errs)
	}
}
