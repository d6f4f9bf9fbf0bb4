// Package drift compares what a repository's bindings/ tree holds with what the
// database says it holds (README, "Drift: does the repository hold what the database says?"). It only detects: repairing
// drift (a re-grant, a revoke) is an operator's decision. The scanner's drift loop,
// the post-merge check and `batcherd verify` share it.
package drift

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/mr"
	"github.com/batcherd/batcherd/internal/store"
)

// Kinds of drift.
const (
	// Unexpected: a file under bindings/ that no active binding explains.
	Unexpected = "unexpected"
	// Missing: an active binding without its file.
	Missing = "missing"
	// Modified: a file whose subject, target or operation_id differ from what batcherd
	// wrote for the binding.
	Modified = "modified"
)

// Kinds lists the kinds in the order reports and metrics use.
var Kinds = []string{Unexpected, Missing, Modified}

// Root is the directory batcherd owns in a repository.
const Root = "bindings"

// GitLab is what a drift check reads; *mr.Client has it.
type GitLab interface {
	ListBlobs(ctx context.Context, project, ref, dir string) ([]mr.Blob, error)
	ReadFile(ctx context.Context, project, ref, filePath string) (content string, found bool, err error)
}

// Store is what a drift check reads; *store.Store has it.
type Store interface {
	BindingFiles(ctx context.Context, repo string) ([]store.BindingFile, error)
}

// File is one file that drifted.
type File struct {
	Path   string
	Kind   string
	Detail string
}

func (f File) String() string { return f.Kind + " " + f.Path + ": " + f.Detail }

// Report is the result of one check of one repository.
type Report struct {
	Repo  string
	Ref   string
	Files []File
}

// Counts returns the files by kind.
func (r Report) Counts() store.DriftCounts {
	var c store.DriftCounts
	for _, f := range r.Files {
		switch f.Kind {
		case Unexpected:
			c.Unexpected++
		case Missing:
			c.Missing++
		case Modified:
			c.Modified++
		}
	}
	return c
}

// doc is what batcherd reads back of a binding file.
type doc struct {
	Subject     string `yaml:"subject"`
	Target      string `yaml:"target"`
	OperationID string `yaml:"operation_id"`
}

// Expected is what the repository should hold at one path.
type expected struct {
	b    store.BindingFile
	blob string // git blob id of the content batcherd writes; "" when unknown
}

// Check compares repo's bindings/ tree on ref with the database's bindings. The tree
// is read in one recursive listing; a file is read only when its blob differs from the
// content batcherd would write for its binding (then it is parsed, and only a
// different subject, target or operation_id is drift: a file batcherd wrote in an
// older format is not).
func Check(ctx context.Context, gl GitLab, st Store, repo, ref string) (Report, error) {
	rep := Report{Repo: repo, Ref: ref}
	bindings, err := st.BindingFiles(ctx, repo)
	if err != nil {
		return rep, err
	}
	want := make(map[string]expected, len(bindings))
	for _, b := range bindings {
		e := expected{b: b}
		if b.Status == domain.BindingActive {
			if content, err := mr.BindingYAMLWithAttributes(b.Subject, b.Target, b.OperationID, b.ExpiresAt, b.Attributes); err == nil {
				e.blob = mr.GitBlobID(content)
			}
		}
		want[domain.BindingPath(b.Subject, b.Target)] = e
	}
	blobs, err := gl.ListBlobs(ctx, repo, ref, Root)
	if err != nil {
		return rep, err
	}
	seen := make(map[string]bool, len(blobs))
	for _, bl := range blobs {
		seen[bl.Path] = true
		e, ok := want[bl.Path]
		switch {
		case !ok:
			rep.Files = append(rep.Files, File{bl.Path, Unexpected, "no active binding explains this file"})
			continue
		case e.b.Status != domain.BindingActive || bl.ID == e.blob:
			// revoking: the file stays until its revoke merges; pending: a grant in
			// flight may have merged already. Neither is drift, in either direction.
			continue
		}
		content, found, err := gl.ReadFile(ctx, repo, ref, bl.Path)
		if err != nil {
			return rep, err
		}
		if !found {
			seen[bl.Path] = false // gone between the listing and the read
			continue
		}
		if why := differs(content, e.b); why != "" {
			rep.Files = append(rep.Files, File{bl.Path, Modified, why})
		}
	}
	for p, e := range want {
		if e.b.Status == domain.BindingActive && !seen[p] {
			rep.Files = append(rep.Files, File{p, Missing, fmt.Sprintf("active binding %s → %s (operation %s) has no file", e.b.Subject, e.b.Target, e.b.OperationID)})
		}
	}
	slices.SortFunc(rep.Files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return rep, nil
}

// differs says how a file's content differs from what batcherd wrote for b ("" when
// subject, target and operation_id are the same).
func differs(content string, b store.BindingFile) string {
	var d doc
	if err := yaml.Unmarshal([]byte(content), &d); err != nil {
		return "not a binding file batcherd can read: " + err.Error()
	}
	var diffs []string
	if d.Subject != b.Subject {
		diffs = append(diffs, fmt.Sprintf("subject %q, want %q", d.Subject, b.Subject))
	}
	if d.Target != b.Target {
		diffs = append(diffs, fmt.Sprintf("target %q, want %q", d.Target, b.Target))
	}
	if d.OperationID != b.OperationID {
		diffs = append(diffs, fmt.Sprintf("operation_id %q, want %q", d.OperationID, b.OperationID))
	}
	return strings.Join(diffs, "; ")
}

// Member is a merged batch member to check right after its merge.
type Member struct {
	OperationID string
	Subject     string
	Target      string
	Grant       bool
	Content     string // a grant's file as batcherd wrote it ("" when unknown)
}

// perFileReads is the batch size up to which CheckMerged reads each member's file;
// a larger batch is checked against one recursive listing of bindings/ instead.
const perFileReads = 20

// CheckMerged checks that ref holds each member's change right after its batch merged:
// a grant's file with its operation id, no file for a revoke. It returns the misses
// (missing or modified for a grant; unexpected for a revoke's file still there).
func CheckMerged(ctx context.Context, gl GitLab, repo, ref string, members []Member) ([]File, error) {
	var blobs map[string]string
	if len(members) > perFileReads {
		list, err := gl.ListBlobs(ctx, repo, ref, Root)
		if err != nil {
			return nil, err
		}
		blobs = make(map[string]string, len(list))
		for _, b := range list {
			blobs[b.Path] = b.ID
		}
	}
	var out []File
	for _, m := range members {
		f, miss, err := checkMember(ctx, gl, repo, ref, blobs, m)
		if err != nil {
			return out, err
		}
		if miss {
			out = append(out, f)
		}
	}
	return out, nil
}

// checkMember checks one member of CheckMerged; blobs is the listing of bindings/
// (path to blob id) for a large batch, nil for a small one. It reports whether the
// member's change is missed on ref, and how.
func checkMember(ctx context.Context, gl GitLab, repo, ref string, blobs map[string]string, m Member) (File, bool, error) {
	p := domain.BindingPath(m.Subject, m.Target)
	var content string
	found := true
	if blobs != nil {
		id, ok := blobs[p]
		found = ok
		if ok && m.Grant && m.Content != "" && id == mr.GitBlobID(m.Content) {
			return File{}, false, nil // exactly what batcherd wrote
		}
	}
	if found && m.Grant {
		c, ok, err := gl.ReadFile(ctx, repo, ref, p)
		if err != nil {
			return File{}, false, err
		}
		content, found = c, ok
	} else if blobs == nil {
		_, ok, err := gl.ReadFile(ctx, repo, ref, p)
		if err != nil {
			return File{}, false, err
		}
		found = ok
	}
	switch {
	case m.Grant && !found:
		return File{p, Missing, fmt.Sprintf("grant %s merged but its file is not on %s", m.OperationID, ref)}, true, nil
	case m.Grant:
		var d doc
		if yaml.Unmarshal([]byte(content), &d) != nil || d.OperationID != m.OperationID || d.Subject != m.Subject || d.Target != m.Target {
			return File{p, Modified, fmt.Sprintf("grant %s merged but the file on %s carries operation_id %q", m.OperationID, ref, d.OperationID)}, true, nil
		}
	case found:
		return File{p, Unexpected, fmt.Sprintf("revoke %s merged but the file is still on %s", m.OperationID, ref)}, true, nil
	}
	return File{}, false, nil
}
