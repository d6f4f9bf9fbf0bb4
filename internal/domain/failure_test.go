package domain

import (
	"slices"
	"strings"
	"testing"
)

func TestSplitParts(t *testing.T) {
	for _, c := range []struct {
		n    int
		want []int
	}{
		{0, nil}, {1, nil},
		{2, []int{1, 1}},
		{3, []int{2, 1}},
		{5, []int{3, 1, 1}},
		{7, []int{4, 2, 1}},
		{8, []int{4, 2, 1, 1}},
		{64, []int{32, 16, 8, 4, 2, 1, 1}},
		{100, []int{50, 25, 13, 6, 3, 2, 1}},
	} {
		got := SplitParts(c.n)
		if !slices.Equal(got, c.want) {
			t.Errorf("SplitParts(%d) = %v, want %v", c.n, got, c.want)
		}
		sum := 0
		for _, s := range got {
			sum += s
		}
		if c.n >= 2 && sum != c.n {
			t.Errorf("SplitParts(%d) adds up to %d", c.n, sum)
		}
	}
	// Each part is the first half (rounded up) of what the earlier parts left, so a
	// passing part leaves the rest known to hold the culprit, already split.
	for n := 2; n <= 5000; n++ {
		left := n
		for i, s := range SplitParts(n) {
			if want := (left + 1) / 2; s != want && !(left == 1 && s == 1) {
				t.Fatalf("SplitParts(%d)[%d] = %d of %d left", n, i, s, left)
			}
			left -= s
		}
	}
}

func TestSearchGroupNames(t *testing.T) {
	for _, c := range []struct {
		name string
		want SearchGroup
		ok   bool
	}{
		{PartGroup(7, 9, 2), SearchGroup{Root: 7, Parent: 9, Part: 2}, true},
		{RestGroup(7), SearchGroup{Root: 7}, true},
		{PartGroup(9223372036854775807, 9223372036854775807, 14), SearchGroup{Root: 9223372036854775807, Parent: 9223372036854775807, Part: 14}, true},
		{"", SearchGroup{}, false},
		{"b9.1", SearchGroup{}, false}, // an older release's half
		{"b9.r", SearchGroup{}, false}, // a retry of a batch outside any search
		{"s7", SearchGroup{}, false},
		{"s7.9", SearchGroup{}, false},
		{"s7.9.0", SearchGroup{}, false},
		{"s7.0.1", SearchGroup{}, false},
		{"s-7.rest", SearchGroup{}, false},
		{"s7.9.2.1", SearchGroup{}, false},
		{"s7.rests", SearchGroup{}, false},
	} {
		got, ok := ParseSearchGroup(c.name)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseSearchGroup(%q) = %+v, %v; want %+v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	if g, _ := ParseSearchGroup(RestGroup(7)); !g.Rest() {
		t.Error("RestGroup is not Rest")
	}
	// The sibling prefix matches every part of its parent and nothing else: not another
	// parent whose id starts with the same digits, not the remainder.
	p := SiblingPrefix(7, 9)
	for _, g := range []string{PartGroup(7, 9, 1), PartGroup(7, 9, 12)} {
		if !strings.HasPrefix(g, p) {
			t.Errorf("%q does not start with %q", g, p)
		}
	}
	for _, g := range []string{PartGroup(7, 91, 1), PartGroup(7, 8, 1), RestGroup(7), PartGroup(70, 9, 1)} {
		if strings.HasPrefix(g, p) {
			t.Errorf("%q starts with %q", g, p)
		}
	}
	if len(PartGroup(9223372036854775807, 9223372036854775807, 99)) > 64 {
		t.Error("a part group can be longer than merge_batch_request.grp")
	}
}

func TestResume(t *testing.T) {
	for _, c := range []struct {
		name   string
		merged SearchGroup
		qGroup string
		parent int64
		first  int
		ok     bool
	}{
		{"q was part 1 of 9", SearchGroup{Root: 7, Parent: 12, Part: 3}, PartGroup(7, 9, 1), 9, 2, true},
		{"q was part 4 of 9", SearchGroup{Root: 7, Parent: 12, Part: 1}, PartGroup(7, 9, 4), 9, 5, true},
		{"q was the search's first batch", SearchGroup{Root: 7, Parent: 7, Part: 2}, "", 0, 0, false},
		{"q was the remainder", SearchGroup{Root: 7, Parent: 12, Part: 2}, RestGroup(7), 0, 0, false},
		{"q was an older release's half", SearchGroup{Root: 7, Parent: 12, Part: 2}, "b9.1", 0, 0, false},
		{"q in another search", SearchGroup{Root: 7, Parent: 12, Part: 2}, PartGroup(8, 9, 1), 0, 0, false},
		{"a remainder merged", SearchGroup{Root: 7}, PartGroup(7, 9, 1), 0, 0, false},
	} {
		parent, first, ok := Resume(c.merged, c.qGroup)
		if parent != c.parent || first != c.first || ok != c.ok {
			t.Errorf("%s: Resume = %d, %d, %v; want %d, %d, %v", c.name, parent, first, ok, c.parent, c.first, c.ok)
		}
	}
	if got := ResumeParts(1); !slices.Equal(got, []int{1}) {
		t.Errorf("ResumeParts(1) = %v", got)
	}
	if got := ResumeParts(4); !slices.Equal(got, []int{2, 1, 1}) {
		t.Errorf("ResumeParts(4) = %v", got)
	}
}
