package harness

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
)

// BindingKey names a binding and the repository holding its file.
type BindingKey struct{ Repo, Subject, Target string }

// BindingPath is the repository file of a binding (a contract: README, "Files written to the repository").
func BindingPath(subject, target string) string {
	return "bindings/" + url.PathEscape(target) + "/" + url.PathEscape(subject) + ".yaml"
}

// Expect is what Audit checks beyond the always-on rules.
type Expect struct {
	// Merged are operation ids that must have status merged, each a member of exactly
	// one succeeded batch.
	Merged []string
	// Present bindings must have their file on the default branch, naming subject and
	// target; Absent ones must not.
	Present, Absent []BindingKey
	// Settled requires every batch to be finished (no running or blocked batch).
	Settled bool
	// SelfApprovalAllowed: the replicas run with BATCHERD_FOUR_EYES=false, so a merged
	// operation may have been approved by its requester.
	SelfApprovalAllowed bool
}

// AuditReport is what Audit found. Problems empty means every check passed.
type AuditReport struct {
	Operations      map[string]int // expected operations by status
	Batches         int
	BatchesByStatus map[string]int
	MRs             int
	MRsByState      map[string]int
	OneMRPerBatch   int // batches that have exactly one MR (every settled-succeeded batch must)
	Files           int // binding files on the default branches
	Problems        []string
}

// OK reports whether no problem was found.
func (r AuditReport) OK() bool { return len(r.Problems) == 0 }

func (r *AuditReport) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Summary is a few lines for a log or a failure message.
func (r AuditReport) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "operations %v; batches %d %v; MRs %d %v; batches with exactly one MR %d; binding files %d",
		r.Operations, r.Batches, r.BatchesByStatus, r.MRs, r.MRsByState, r.OneMRPerBatch, r.Files)
	if len(r.Problems) > 0 {
		fmt.Fprintf(&b, "\n%d problem(s):", len(r.Problems))
		for i, p := range r.Problems {
			if i == 30 {
				fmt.Fprintf(&b, "\n  … and %d more", len(r.Problems)-i)
				break
			}
			b.WriteString("\n  - " + p)
		}
	}
	return b.String()
}

// Audit compares what the API says with what the repository (the simulator) holds:
//
//   - every batch has at most one MR for its source branch (never a second MR for a
//     branch), a succeeded batch exactly one and it is merged (or none at all when
//     the repository already had its changes), and no MR of a failed
//     batch is merged (fencing);
//   - every batcherd MR belongs to a batch the API knows;
//   - plus whatever exp asks (operations merged, binding files present or absent,
//     no batch still active).
func (c *Cluster) Audit(ctx context.Context, client *Client, exp Expect) (AuditReport, error) {
	rep := AuditReport{Operations: map[string]int{}, BatchesByStatus: map[string]int{}, MRsByState: map[string]int{}}
	batches, err := client.Batches(ctx, "", "")
	if err != nil {
		return rep, fmt.Errorf("listing batches: %w", err)
	}
	state, err := c.Sim.State(ctx)
	if err != nil {
		return rep, fmt.Errorf("simulator state: %w", err)
	}
	rep.Batches = len(batches)
	succeededIn := map[string][]int64{}
	known := map[string]bool{} // repo + "\x00" + branch
	for _, b := range batches {
		rep.auditBatch(b, state, exp, known, succeededIn)
	}
	rep.auditRepositories(state, known)
	ops, err := getOperations(ctx, client, exp.Merged)
	if err != nil {
		return rep, err
	}
	for _, id := range exp.Merged {
		rep.auditMergedOperation(id, ops[id], succeededIn[id], exp)
	}
	rep.auditBindingFiles(state, exp)
	sort.Strings(rep.Problems)
	return rep, nil
}

// auditBatch checks one batch against its branch's MRs: at most one MR, a succeeded
// batch's MR merged (or none when the repository already had its changes), no merged
// MR of a failed batch (fencing), nothing still active when exp.Settled. It records
// the batch's branch in known and its operations in succeededIn.
func (r *AuditReport) auditBatch(b Batch, state SimState, exp Expect, known map[string]bool, succeededIn map[string][]int64) {
	r.BatchesByStatus[b.Status]++
	known[b.Repo+"\x00"+b.SourceBranch] = true
	proj, ok := state.Projects[b.Repo]
	if !ok {
		r.problem("batch %d: repository %q is not in the simulator", b.ID, b.Repo)
		return
	}
	mrs := proj.MergeRequests[b.SourceBranch]
	if len(mrs) == 1 {
		r.OneMRPerBatch++
	}
	if len(mrs) > 1 {
		r.problem("batch %d: %d MRs for branch %s (one MR per batch)", b.ID, len(mrs), b.SourceBranch)
	}
	switch b.Status {
	case "succeeded":
		for _, id := range b.OperationIDs {
			succeededIn[id] = append(succeededIn[id], b.ID)
		}
		if len(mrs) == 0 && b.MRIID == nil {
			// Succeeded without an MR: the repository already had every change (a
			// batch of revokes of files that were gone). Whether it really did is
			// the repository-versus-bindings check (auditBindingFiles).
		} else if len(mrs) != 1 || mrs[0].State != "merged" {
			r.problem("batch %d succeeded but its branch %s has %s", b.ID, b.SourceBranch, describeMRs(mrs))
		} else if b.MRIID == nil || *b.MRIID != mrs[0].IID {
			r.problem("batch %d records MR iid %v, the branch's MR is !%d", b.ID, deref(b.MRIID), mrs[0].IID)
		}
	case "failed":
		for _, m := range mrs {
			if m.State == "merged" {
				r.problem("batch %d is failed but MR !%d of its branch merged (fencing)", b.ID, m.IID)
			}
		}
	default: // running, blocked
		if exp.Settled {
			r.problem("batch %d is still %s", b.ID, b.Status)
		}
	}
}

// auditRepositories counts MRs and binding files and reports every batcherd MR whose
// branch no batch has (known holds the batches' repo + "\x00" + branch).
func (r *AuditReport) auditRepositories(state SimState, known map[string]bool) {
	for repo, proj := range state.Projects {
		for branch, mrs := range proj.MergeRequests {
			r.MRs += len(mrs)
			for _, m := range mrs {
				r.MRsByState[m.State]++
			}
			if strings.HasPrefix(branch, "batcherd/") && !known[repo+"\x00"+branch] {
				r.problem("%s: MR(s) %s for branch %s that no batch has", repo, describeMRs(mrs), branch)
			}
		}
		for path := range proj.Files {
			if strings.HasPrefix(path, "bindings/") {
				r.Files++
			}
		}
	}
}

// auditMergedOperation checks one operation exp expects merged: it is merged, a member
// of exactly one succeeded batch (succeededIn), and names its requester and approver.
func (r *AuditReport) auditMergedOperation(id string, op Operation, succeededIn []int64, exp Expect) {
	r.Operations[op.Status]++
	if op.Status != "merged" {
		msg := ""
		if op.Error != nil {
			msg = " (" + op.Error.Code + ": " + op.Error.Message + ")"
		}
		r.problem("operation %s (%s %s→%s) is %s, not merged%s", id, op.Action, op.Subject, op.Target, op.Status, msg)
		return
	}
	if n := len(succeededIn); n != 1 {
		r.problem("operation %s is merged but a member of %d succeeded batches %v", id, n, succeededIn)
	}
	// Principals: every merged operation says who applied and who approved it, and
	// with four eyes (the harness's default) they differ unless it was auto-approved.
	switch {
	case op.RequestedBy == nil || op.ApprovedBy == nil:
		r.problem("operation %s is merged but does not name its requester (%s) and approver (%s)", id, strOrNull(op.RequestedBy), strOrNull(op.ApprovedBy))
	case *op.ApprovedBy == *op.RequestedBy && !exp.SelfApprovalAllowed:
		r.problem("operation %s was approved by its requester %q (four eyes)", id, *op.RequestedBy)
	}
}

// auditBindingFiles checks that exp.Present's binding files exist and name their
// subject and target, and that exp.Absent's are gone.
func (r *AuditReport) auditBindingFiles(state SimState, exp Expect) {
	for _, k := range exp.Present {
		content, ok := state.Projects[k.Repo].Files[BindingPath(k.Subject, k.Target)]
		switch {
		case !ok:
			r.problem("%s: binding file %s is missing", k.Repo, BindingPath(k.Subject, k.Target))
		case !strings.Contains(content, k.Subject) || !strings.Contains(content, k.Target):
			r.problem("%s: binding file %s does not name its subject and target", k.Repo, BindingPath(k.Subject, k.Target))
		}
	}
	for _, k := range exp.Absent {
		if _, ok := state.Projects[k.Repo].Files[BindingPath(k.Subject, k.Target)]; ok {
			r.problem("%s: binding file %s should have been deleted", k.Repo, BindingPath(k.Subject, k.Target))
		}
	}
}

// getOperations reads operations with a few concurrent requests.
func getOperations(ctx context.Context, client *Client, ids []string) (map[string]Operation, error) {
	out := make(map[string]Operation, len(ids))
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	ch := make(chan string)
	for range 8 {
		wg.Go(func() {
			for id := range ch {
				op, err := client.Operation(ctx, id)
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("reading operation %s: %w", id, err)
				}
				out[id] = op
				mu.Unlock()
			}
		})
	}
	for _, id := range ids {
		ch <- id
	}
	close(ch)
	wg.Wait()
	return out, first
}

// GetOperations reads many operations concurrently (8 at a time).
func GetOperations(ctx context.Context, client *Client, ids []string) (map[string]Operation, error) {
	return getOperations(ctx, client, ids)
}

func describeMRs(mrs []SimMR) string {
	if len(mrs) == 0 {
		return "no MR"
	}
	parts := make([]string, len(mrs))
	for i, m := range mrs {
		parts[i] = fmt.Sprintf("!%d %s", m.IID, m.State)
	}
	return strings.Join(parts, ", ")
}

func strOrNull(p *string) string {
	if p == nil {
		return "null"
	}
	return *p
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
