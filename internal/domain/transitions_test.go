package domain

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// checkTable: no transition twice, none to itself, every status of the entity in the
// table (reachable or left), and nothing else.
func checkTable[S comparable](t *testing.T, name string, table []Transition[S], all []S, zero S) {
	t.Helper()
	seen := map[[2]S]bool{}
	used := map[S]bool{}
	for _, tr := range table {
		k := [2]S{tr.From, tr.To}
		if seen[k] {
			t.Errorf("%s: %v → %v listed twice", name, tr.From, tr.To)
		}
		seen[k] = true
		if tr.From == tr.To {
			t.Errorf("%s: %v → itself", name, tr.From)
		}
		if tr.By == "" {
			t.Errorf("%s: %v → %v says not what makes it", name, tr.From, tr.To)
		}
		used[tr.From], used[tr.To] = true, true
	}
	delete(used, zero)
	for _, s := range all {
		if !used[s] {
			t.Errorf("%s: status %v is in no transition", name, s)
		}
		delete(used, s)
	}
	for s := range used {
		t.Errorf("%s: unknown status %v in the table", name, s)
	}
}

func TestTransitionTablesAreWellFormed(t *testing.T) {
	checkTable(t, "operation", OpTransitions, append(append([]OpStatus{}, LiveOpStatuses...), FinishedOpStatuses...), "")
	checkTable(t, "batch", BatchTransitions, BatchStatuses, 0)
	checkTable(t, "binding", BindingTransitions, BindingStatuses, "")
}

// The slot (I1) is held by RUNNING and BLOCKED only, and a terminal batch never goes
// back to holding it: otherwise a settled repository could be blocked again.
func TestNoTransitionRetakesTheSlot(t *testing.T) {
	for _, tr := range BatchTransitions {
		if tr.From != 0 && !tr.From.Active() && tr.To.Active() {
			t.Errorf("batch %s → %s takes the slot again", tr.From, tr.To)
		}
	}
	if !Allowed(BatchTransitions, BatchFailed, BatchSucceeded) || Allowed(BatchTransitions, BatchSucceeded, BatchFailed) {
		t.Error("merged wins must move FAILED → SUCCEEDED and never the reverse")
	}
}

// Re-applying (I5) starts from the re-appliable binding states only.
func TestReapplyOnlyFromReappliable(t *testing.T) {
	for _, tr := range BindingTransitions {
		if tr.To == BindingPending && tr.From != "" && tr.From != BindingFailed && !tr.From.Reappliable() {
			t.Errorf("binding %s → pending, but %s is not re-appliable", tr.From, tr.From)
		}
	}
	for _, s := range BindingStatuses {
		if s.Reappliable() != (s == BindingRejected || s == BindingClosed) {
			t.Errorf("%s.Reappliable() = %v", s, s.Reappliable())
		}
	}
}

// The README's state lines ("Operation states: `a → b → c | d`, or `e`") are a reader's
// view of these tables: every arrow they draw must be in the table, and every status
// they name must exist.
func TestReadmeStateLinesMatchTheTables(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	check := func(prefix string, allowed func(from, to string) bool, known func(string) bool) {
		t.Helper()
		var line string
		for _, l := range strings.Split(string(readme), "\n") {
			if strings.HasPrefix(l, prefix) {
				line = l
				break
			}
		}
		if line == "" {
			t.Fatalf("README has no line starting %q", prefix)
		}
		for _, chain := range regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(line, -1) {
			steps := strings.Split(chain[1], "→")
			for i := range steps {
				for _, to := range strings.Split(steps[i], "|") {
					to = strings.TrimSpace(to)
					if !known(to) {
						t.Errorf("README %s names unknown status %q", prefix, to)
					}
					if i == 0 {
						continue
					}
					from := strings.TrimSpace(steps[i-1])
					if !allowed(from, to) {
						t.Errorf("README %s draws %s → %s, which the table does not allow", prefix, from, to)
					}
				}
			}
		}
	}
	check("Operation states:",
		func(f, to string) bool { return Allowed(OpTransitions, OpStatus(f), OpStatus(to)) },
		func(s string) bool { return hasTo(OpTransitions, OpStatus(s)) })
	check("Binding states:",
		func(f, to string) bool { return Allowed(BindingTransitions, BindingStatus(f), BindingStatus(to)) },
		func(s string) bool { return hasTo(BindingTransitions, BindingStatus(s)) })
}

func hasTo[S comparable](table []Transition[S], s S) bool {
	for _, t := range table {
		if t.To == s {
			return true
		}
	}
	return false
}

func TestParseBatchStatusInvertsString(t *testing.T) {
	for _, s := range BatchStatuses {
		if got, ok := ParseBatchStatus(s.String()); !ok || got != s {
			t.Errorf("ParseBatchStatus(%q) = %v %v", s.String(), got, ok)
		}
	}
	if _, ok := ParseBatchStatus("unknown"); ok {
		t.Error("ParseBatchStatus(unknown) accepted")
	}
}

func TestFailureClassesFinal(t *testing.T) {
	for _, c := range FailureClasses {
		if c.Final() != (c == ClassManual || c == ClassEmpty) {
			t.Errorf("%s.Final() = %v", c, c.Final())
		}
	}
}
