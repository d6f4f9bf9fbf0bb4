package scanner

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store"

	"github.com/batcherd/batcherd/internal/domain"
)

// The MR lists each member's requester and approver, escaped; the commit names the
// principals as trailers, bounded for a large batch.
func TestPublishNamesPrincipals(t *testing.T) {
	e := newEnv(t, gitlabsim.Options{}, repo)
	ctx := context.Background()
	// A requester name from an issuer may carry Markdown and a closing keyword; the
	// approvers are many (more than the trailer bound).
	hostile := "x` Closes #1 @root [a](http://evil.example) <b>"
	var ids []string
	for i := 0; i < 25; i++ {
		requester := "alice"
		if i == 0 {
			requester = hostile
		}
		op, _, err := e.st.OperationCreate(ctx, store.OperationCreateParams{
			OperationID: uuid.NewString(), Subject: fmt.Sprintf("user-%02d", i), Target: "db/prod",
			Repo: repo, Action: domain.ActionGrant, RequestedBy: requester,
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.OperationApproveBy(ctx, op.OperationID, fmt.Sprintf("approver-%02d", i), true); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, op.OperationID)
	}
	s := e.scanner("a", nil)
	b := e.published(s, repo)
	if b.MRIID == nil {
		t.Fatal("no MR")
	}
	desc := mrDescriptionOf(t, e, repo, *b.MRIID)
	for i, id := range ids {
		line := ""
		for l := range strings.SplitSeq(desc, "\n") {
			if strings.Contains(l, id) {
				line = l
			}
		}
		want := fmt.Sprintf("approved by `approver-%02d`", i)
		if !strings.Contains(line, want) {
			t.Errorf("member %d: %q lacks %q", i, line, want)
		}
		if i > 0 && !strings.Contains(line, "requested by `alice`") {
			t.Errorf("member %d: %q lacks its requester", i, line)
		}
	}
	// The hostile name: inside a code span whose fence is longer than its backticks,
	// with no ASCII space left for a closing keyword to match.
	if !strings.Contains(desc, "``x`\u00a0Closes\u00a0#1\u00a0@root\u00a0[a](http://evil.example)\u00a0<b>``") {
		t.Errorf("the hostile requester is not escaped:\n%s", desc)
	}
	if strings.Contains(desc, "Closes #1") {
		t.Errorf("the description carries a closing keyword GitLab would act on:\n%s", desc)
	}

	_, msg, ok := e.sim.HeadCommit(repo, e.branch(b.ID))
	if !ok {
		t.Fatal("no head commit")
	}
	paras := strings.Split(strings.TrimSpace(msg), "\n\n")
	last := paras[len(paras)-1]
	for _, want := range []string{"Batcherd-Requested-By: alice", "Batcherd-Requested-By: x__Closes__1_@root__a__http___evil.example___b_", "Batcherd-Approved-By: approver-00",
		"Batcherd-Approved-By: approver-19", "Batcherd-Principals-Omitted: 5", fmt.Sprintf("Batcherd-Batch: %d", b.ID), "Batcherd-Installation: "} {
		if !strings.Contains(last, want) {
			t.Errorf("the commit's trailer paragraph lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "Closes #1") || strings.Contains(msg, " @root") {
		t.Errorf("the commit message carries a closing keyword or a mention:\n%s", msg)
	}
	if strings.Contains(last, "approver-20") {
		t.Errorf("more approvers than the bound:\n%s", msg)
	}
}

// A batch of the largest size with the longest names still gets a description GitLab
// takes (under its 1,048,576-character limit) that names every operation id with its
// requester and approver.
func TestMRDescriptionBounded(t *testing.T) {
	long := strings.Repeat("ü", 255)
	var members []domain.Operation
	for i := 0; i < 5000; i++ {
		members = append(members, domain.Operation{
			OperationID: uuid.NewString(), Action: domain.ActionGrant, Subject: long, Target: long,
			RequestedBy: fmt.Sprintf("%s-%04d", strings.Repeat("r", 120), i%50), ApprovedBy: strings.Repeat("a", 128),
		})
	}
	desc := mrDescription(domain.Batch{ID: 7, Repo: repo}, members, nil)
	if n := len([]rune(desc)); n > 1_048_576 || len(desc) > maxDescription+64<<10 {
		t.Fatalf("description of %d characters (%d bytes)", n, len(desc))
	}
	for _, op := range members {
		if !strings.Contains(desc, op.OperationID) {
			t.Fatalf("operation %s missing", op.OperationID)
		}
	}
	if !strings.Contains(desc, "approved by `"+strings.Repeat("a", 32)+"…`") || !strings.Contains(desc, "requested by `"+strings.Repeat("r", 32)+"…`") {
		t.Fatalf("compact form lacks the principals: %.600s", desc)
	}
	// A small batch keeps the full form.
	small := mrDescription(domain.Batch{ID: 8, Repo: repo}, members[:3], nil)
	if strings.Contains(small, "compactly") || !strings.Contains(small, mr.MarkdownLiteral(long)) {
		t.Fatalf("small batch: %.300s", small)
	}
}
