package mr

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"

	gitlab "gitlab.com/gitlab-org/api/client-go"

	"github.com/batcherd/batcherd/internal/domain"
)

// ChunkTrailer is the git trailer that numbers the commits of a batch split into
// several ("Batcherd-Chunk: 2/3"). It is absent when the batch fits one commit.
const ChunkTrailer = "Batcherd-Chunk"

// maxDirListings is how many directories CommitFiles lists one by one before it lists
// their common ancestor recursively instead.
const maxDirListings = 8

// Commit is what CommitFiles made of a batch's files.
type Commit struct {
	// SHA is the branch head: the batch's (last) commit, or the branch's start when
	// nothing was committed.
	SHA string
	// Empty: no action changed anything (every one was a delete of a file the branch
	// does not have), so the branch carries no commit of the batch. An MR of it would
	// have no commits, and GitLab never merges such an MR (it reports it as
	// has_conflicts / commits_status).
	Empty bool
}

// CommitFiles makes one commit (chunked only if GitLab limits demand it) with the file
// actions on branch, carrying "Batcherd-Installation: <installation>" (from the branch
// name) and "Batcherd-Batch: <batchID>" as trailers. If the branch's head already
// carries them the commit was made before (answer lost) and its sha is returned without
// a new commit.
//
// A branch that does not exist yet is created by its first commit, started from the
// head of branch from ("" = the configured target branch) as read once: the commits
// API's start_sha, so the tree listed for create vs update is the tree the commit
// applies to. Creating the branch on its own first (POST …/repository/branches) makes
// GitLab run a pipeline for the push of the new branch — on the target's head, which
// tests nothing of the batch — and pipelines are what a batch waits for: created with
// its commit, a batch branch runs one pipeline, its commit's. A crash after that commit
// leaves the branch with the batch's trailers on its head, which the next call finds
// above; no batch branch ever exists without a batch commit on it.
//
// Create vs update is decided from one tree listing of the branch (of the start commit
// while the branch does not exist), and a delete of a file the branch does not have is
// dropped (the revoke's goal is already true). When every action is dropped no commit
// is made, no branch is created, and the result is Empty with the start's sha.
//
// A batch larger than MaxActionsPerCommit / MaxCommitBytes becomes several commits,
// each carrying the batch trailer and "Batcherd-Chunk: k/n"; the split depends only on
// the input, so a call interrupted after chunk k resumes at chunk k+1.
func (c *Client) CommitFiles(ctx context.Context, project, branch, from string, batch BatchRef, message string, files []FileAction) (Commit, error) {
	commit, err := c.commitFiles(ctx, project, branch, from, batch, message, files)
	if errors.Is(err, errBranchAppeared) {
		// Someone created the branch between our read and our commit (another
		// replica resuming this batch, whose commit the read now finds, or a
		// human): once more, on the branch as it is now.
		commit, err = c.commitFiles(ctx, project, branch, from, batch, message, files)
	}
	if errors.Is(err, errBranchAppeared) {
		return Commit{}, &Error{Op: "create_branch", Class: ClassTransient, Message: "the branch " + branch + " appeared and vanished while it was being created"}
	}
	return commit, err
}

// errBranchAppeared: the commit meant to create the branch found it already there.
var errBranchAppeared = errors.New("mr: the branch was created meanwhile")

func (c *Client) commitFiles(ctx context.Context, project, branch, from string, batch BatchRef, message string, files []FileAction) (Commit, error) {
	owner := ownerOf(branch, batch)
	plan := c.planChunks(files)
	head, found, err := c.getBranch(ctx, project, branch)
	if err != nil {
		return Commit{}, err
	}
	start, committed := 0, false
	var start0, create string // create: the start sha of a branch the first commit creates
	if found && head.Commit != nil {
		start0 = head.Commit.ID
		if tr := readTrailers(head.Commit); tr.carries(owner) {
			k, n := tr.k, tr.n
			committed = true // an earlier call made (some of) the batch's commits
			switch {
			case n <= 1 || k >= n:
				return Commit{SHA: head.Commit.ID}, nil
			case n == len(plan):
				start = k
			default:
				// The split changed between attempts (configuration changed): redo every
				// chunk. Tree-based create/update and dropped deletes make that safe.
				start = 0
			}
		}
	} else {
		if start0, err = c.startOf(ctx, project, from); err != nil {
			return Commit{}, err
		}
		create = start0
	}
	sha := start0
	if start >= len(plan) {
		return Commit{SHA: sha, Empty: !committed}, nil
	}
	var pending []FileAction
	for _, ch := range plan[start:] {
		pending = append(pending, ch...)
	}
	existing, err := c.existingFor(ctx, project, cmp.Or(create, branch), pending)
	if err != nil {
		return Commit{}, err
	}
	for i := start; i < len(plan); i++ {
		next, err := c.commitChunk(ctx, project, branch, create, owner, message, plan, i, existing, sha)
		if err != nil {
			return Commit{}, err
		}
		if next != sha {
			create = "" // the branch exists now: later chunks commit onto it
		}
		sha = next
	}
	return Commit{SHA: sha, Empty: !committed && sha == start0}, nil
}

// startOf is the head sha of branch from ("" = the configured target branch), where a
// new batch branch starts.
func (c *Client) startOf(ctx context.Context, project, from string) (string, error) {
	from = cmp.Or(from, c.cfg.TargetBranch)
	b, found, err := c.getBranch(ctx, project, from)
	if err != nil {
		return "", err
	}
	if !found || b.Commit == nil || b.Commit.ID == "" {
		return "", &Error{Op: "commit_files", Class: ClassNotFound, Status: http.StatusNotFound, Message: "404 Branch Not Found: the start branch " + from}
	}
	return b.Commit.ID, nil
}

// planChunks sorts and de-duplicates the actions (the last action on a path wins, as
// two actions on one path would make GitLab refuse the commit) and splits them.
func (c *Client) planChunks(files []FileAction) [][]FileAction {
	last := make(map[string]int, len(files))
	for i, f := range files {
		last[f.Path] = i
	}
	uniq := make([]FileAction, 0, len(last))
	for i, f := range files {
		if last[f.Path] == i {
			uniq = append(uniq, f)
		}
	}
	slices.SortFunc(uniq, func(a, b FileAction) int { return strings.Compare(a.Path, b.Path) })
	var plan [][]FileAction
	var cur []FileAction
	bytes := 0
	for _, f := range uniq {
		size := len(f.Path) + 64
		if !f.Delete {
			size += len(f.Content)
		}
		if len(cur) > 0 && (len(cur) >= c.cfg.MaxActionsPerCommit || bytes+size > c.cfg.MaxCommitBytes) {
			plan = append(plan, cur)
			cur, bytes = nil, 0
		}
		cur = append(cur, f)
		bytes += size
	}
	if len(cur) > 0 || len(plan) == 0 {
		plan = append(plan, cur)
	}
	return plan
}

// commitChunk commits chunk i of plan and returns the new head sha. create, when set,
// is the sha the branch does not exist yet and starts from: this commit creates it.
func (c *Client) commitChunk(ctx context.Context, project, branch, create string, owner Owner, message string, plan [][]FileAction, i int, existing map[string]bool, head string) (string, error) {
	msg := commitMessage(message, owner, i+1, len(plan))
	for attempt := 0; ; attempt++ {
		actions := buildActions(plan[i], existing)
		if len(actions) == 0 {
			return head, nil
		}
		opt := &gitlab.CreateCommitOptions{
			Branch:        &branch,
			CommitMessage: &msg,
			Actions:       actions,
		}
		if create != "" {
			opt.StartSHA = &create
		}
		var commit glCommit
		err := c.raw(ctx, "create_commit", http.MethodPost, projectPath(project, "repository/commits"), opt, &commit)
		if err == nil {
			applyExisting(plan[i], existing)
			return commit.ID, nil
		}
		if ClassOf(err) == ClassTransient {
			// GitLab may have made the commit (and created the branch) and lost the
			// answer: the branch head then carries this chunk's trailers.
			if b, found, gerr := c.getBranch(ctx, project, branch); gerr == nil && found && b.Commit != nil {
				if tr := readTrailers(b.Commit); tr.carries(owner) && (tr.k == i+1 || (tr.n <= 1 && len(plan) == 1)) {
					applyExisting(plan[i], existing)
					return b.Commit.ID, nil
				}
			}
			return "", err
		}
		if branchRefusal(err) {
			if create != "" && messageContains(err, "already exists") {
				return "", errBranchAppeared
			}
			// About the branch or the start, not the batch's content: never a content
			// refusal (IsContentRefusal), which would fail the batch for it.
			var e *Error
			if errors.As(err, &e) {
				e.Op = "create_branch"
			}
			return "", err
		}
		staleTree := isStatus(err, http.StatusBadRequest) &&
			(messageContains(err, "already exists") || messageContains(err, "doesn't exist") || messageContains(err, "does not exist"))
		if !staleTree || attempt > 0 {
			return "", err
		}
		// Our listing disagreed with the branch (a lagging replica of the tree, or a
		// human pushed to the batch branch): list once more and retry.
		fresh, lerr := c.existingFor(ctx, project, cmp.Or(create, branch), plan[i])
		if lerr != nil {
			return "", lerr
		}
		for _, f := range plan[i] {
			existing[f.Path] = fresh[f.Path]
		}
	}
}

// branchRefusal: GitLab refused the commit for its branch or start, not for its files
// (Commits::CreateService's validations, all 400): the branch to create exists ("A
// branch called '…' already exists. Switch to that branch…"), the branch to commit
// onto does not ("You can only create or edit files when you are on a branch", a
// human deleted it between two chunks), the start_sha ("Invalid start_sha",
// "Cannot find start_sha"), or the new branch's name ("Something went wrong when we
// tried to create '…' for you: …", a push rule).
func branchRefusal(err error) bool {
	if !isStatus(err, http.StatusBadRequest) {
		return false
	}
	for _, m := range []string{"a branch called", "when you are on a branch", "start_sha", "start_branch", "tried to create"} {
		if messageContains(err, m) {
			return true
		}
	}
	return false
}

func buildActions(files []FileAction, existing map[string]bool) []*gitlab.CommitActionOptions {
	out := make([]*gitlab.CommitActionOptions, 0, len(files))
	for _, f := range files {
		p := f.Path
		switch {
		case f.Delete && !existing[p]:
			continue
		case f.Delete:
			out = append(out, &gitlab.CommitActionOptions{Action: gitlab.Ptr(gitlab.FileDelete), FilePath: gitlab.Ptr(p)})
		case existing[p]:
			out = append(out, &gitlab.CommitActionOptions{Action: gitlab.Ptr(gitlab.FileUpdate), FilePath: gitlab.Ptr(p), Content: gitlab.Ptr(f.Content)})
		default:
			out = append(out, &gitlab.CommitActionOptions{Action: gitlab.Ptr(gitlab.FileCreate), FilePath: gitlab.Ptr(p), Content: gitlab.Ptr(f.Content)})
		}
	}
	return out
}

func applyExisting(files []FileAction, existing map[string]bool) {
	for _, f := range files {
		existing[f.Path] = !f.Delete
	}
}

// commitMessage appends the trailers as the message's last paragraph: the
// installation (when the branch names one), the batch, and the chunk of a split batch.
// When the message already ends with a paragraph of trailers (the scanner's
// principals), batcherd's join it: git reads trailers from the last paragraph only.
func commitMessage(message string, owner Owner, chunk, chunks int) string {
	var b strings.Builder
	message = strings.TrimRight(message, " \t\r\n")
	b.WriteString(message)
	if endsWithTrailers(message) {
		b.WriteString("\n")
	} else {
		b.WriteString("\n\n")
	}
	if owner.Installation != "" {
		fmt.Fprintf(&b, "%s: %s\n", domain.TrailerInstallation, owner.Installation)
	}
	fmt.Fprintf(&b, "%s: %d", CommitTrailer, owner.BatchID)
	if owner.Stamp != "" {
		fmt.Fprintf(&b, "\n%s: %s", domain.TrailerBatchClaimed, owner.Stamp)
	}
	if chunks > 1 {
		fmt.Fprintf(&b, "\n%s: %d/%d", ChunkTrailer, chunk, chunks)
	}
	b.WriteString("\n")
	return b.String()
}

// endsWithTrailers reports whether the message's last paragraph (after a first one)
// consists of "Key: value" lines, Key a git trailer token (letters, digits, '-').
func endsWithTrailers(message string) bool {
	i := strings.LastIndex(message, "\n\n")
	if i < 0 {
		return false
	}
	for line := range strings.SplitSeq(message[i+2:], "\n") {
		key, _, ok := strings.Cut(line, ": ")
		if !ok || key == "" || strings.TrimLeft(key, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-") != "" {
			return false
		}
	}
	return true
}

// commitTrailers is what a commit says about its batch: the installation ("" when the
// commit names none), the batch id, and the chunk k/n (0/0 when absent).
type commitTrailers struct {
	installation string
	batchID      int64
	hasBatch     bool
	stamp        string // Batcherd-Batch-Claimed, "" when absent
	k, n         int
}

// batchTrailers reads a commit's batch trailers from the message itself (GitLab's parsed
// trailers fields are absent on old versions), then from extended_trailers (values are
// arrays of strings) and trailers, for whatever the message did not give.
func readTrailers(c *glCommit) commitTrailers {
	var t commitTrailers
	if c == nil {
		return t
	}
	for line := range strings.SplitSeq(c.Message, "\n") {
		key, val, found := strings.Cut(strings.TrimSpace(line), ":")
		if !found {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case domain.TrailerInstallation:
			t.installation = val
		case CommitTrailer:
			if v, err := strconv.ParseInt(val, 10, 64); err == nil {
				t.batchID, t.hasBatch = v, true
			}
		case domain.TrailerBatchClaimed:
			t.stamp = val
		case ChunkTrailer:
			a, b, _ := strings.Cut(val, "/")
			t.k, _ = strconv.Atoi(a)
			t.n, _ = strconv.Atoi(b)
		}
	}
	parsed := func(key string) (string, bool) {
		if vs := c.ExtendedTrailers[key]; len(vs) > 0 {
			return strings.TrimSpace(vs[len(vs)-1]), true
		}
		v, ok := c.Trailers[key]
		return strings.TrimSpace(v), ok
	}
	if !t.hasBatch {
		if v, ok := parsed(CommitTrailer); ok {
			if x, err := strconv.ParseInt(v, 10, 64); err == nil {
				t.batchID, t.hasBatch = x, true
			}
		}
	}
	if t.installation == "" {
		t.installation, _ = parsed(domain.TrailerInstallation)
	}
	if t.stamp == "" {
		t.stamp, _ = parsed(domain.TrailerBatchClaimed)
	}
	return t
}

// carries reports whether the commit carries owner's trailers: this installation's id
// (none for a legacy owner), this batch's id and, when both the commit and the owner
// have one, this batch's claim time — a commit with another claim time is a batch of
// the same id that a restored database forgot. A commit without one was made before
// the trailer existed.
func (t commitTrailers) carries(owner Owner) bool {
	if t.stamp != "" && owner.Stamp != "" && t.stamp != owner.Stamp {
		return false
	}
	return t.hasBatch && t.batchID == owner.BatchID && t.installation == owner.Installation
}

// existingFor reports which of the files' paths exist on ref: from tree listings, and,
// for every delete the listing says is unnecessary, from the file itself. A revoke
// whose delete is dropped leaves access granted while the batch settles succeeded, so
// "the file is not there" must not rest on a listing alone: a listing can miss a file
// (a 404 of the wrong kind read as an empty directory, a paging quirk of some GitLab
// versions). Only GitLab's own "404 File Not Found" for the path drops the delete; any
// other answer is an error, and the publish is tried again.
func (c *Client) existingFor(ctx context.Context, project, ref string, files []FileAction) (map[string]bool, error) {
	paths := make([]string, 0, len(files))
	for _, f := range files {
		paths = append(paths, f.Path)
	}
	existing, err := c.listExisting(ctx, project, ref, paths)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if !f.Delete || existing[f.Path] {
			continue
		}
		found, err := c.FileExists(ctx, project, ref, f.Path)
		if err != nil {
			return nil, err
		}
		existing[f.Path] = found
	}
	return existing, nil
}

// FileExists reads one file of ref (GET …/repository/files/:file_path): true when it is
// there, false only on GitLab's own "404 File Not Found" for it. Any other 404 (the
// project, the ref) is returned as the error it is.
func (c *Client) FileExists(ctx context.Context, project, ref, filePath string) (bool, error) {
	var f struct {
		FilePath string `json:"file_path"`
	}
	err := c.raw(ctx, "get_file", http.MethodGet, projectPath(project, "repository/files", gitlab.PathEscape(filePath)),
		&gitlab.GetFileOptions{Ref: &ref}, &f)
	if err == nil {
		return true, nil
	}
	if ClassOf(err) == ClassNotFound && messageContains(err, "file not found") {
		return false, nil
	}
	if ClassOf(err) == ClassNotFound && !messageContains(err, "project") {
		// Not the file's own 404 (nor the project's, which is the repository's state):
		// never read as "the file is gone"; tried again.
		var e *Error
		if errors.As(err, &e) {
			e.Class = ClassTransient
		}
	}
	return false, err
}

// listExisting reports which of paths exist as files on ref, from as few tree
// listings as possible: each parent directory when there are few, else their common
// ancestor, recursively.
func (c *Client) listExisting(ctx context.Context, project, ref string, paths []string) (map[string]bool, error) {
	dirs := map[string]bool{}
	for _, p := range paths {
		dirs[path.Dir(p)] = true
	}
	existing := make(map[string]bool, len(paths))
	want := make(map[string]bool, len(paths))
	for _, p := range paths {
		want[p] = true
	}
	collect := func(dir string, recursive bool) error {
		nodes, err := c.listTree(ctx, project, ref, dir, recursive)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.Type == "blob" && want[n.Path] {
				existing[n.Path] = true
			}
		}
		return nil
	}
	if len(dirs) <= maxDirListings {
		for _, d := range slices.Sorted(func(yield func(string) bool) {
			for d := range dirs {
				if !yield(d) {
					return
				}
			}
		}) {
			if err := collect(d, false); err != nil {
				return nil, err
			}
		}
		return existing, nil
	}
	if err := collect(commonDir(paths), true); err != nil {
		return nil, err
	}
	return existing, nil
}

// commonDir is the deepest directory containing every path ("." for the root).
func commonDir(paths []string) string {
	if len(paths) == 0 {
		return "."
	}
	parts := strings.Split(path.Dir(paths[0]), "/")
	for _, p := range paths[1:] {
		other := strings.Split(path.Dir(p), "/")
		n := 0
		for n < len(parts) && n < len(other) && parts[n] == other[n] {
			n++
		}
		parts = parts[:n]
	}
	if len(parts) == 0 {
		return "."
	}
	return strings.Join(parts, "/")
}

// listTree lists a directory of ref (all pages, keyset pagination as GitLab
// recommends for trees). A directory that does not exist lists as empty.
func (c *Client) listTree(ctx context.Context, project, ref, dir string, recursive bool) ([]*gitlab.TreeNode, error) {
	opt := &gitlab.ListTreeOptions{
		ListOptions: gitlab.ListOptions{Pagination: "keyset", PerPage: 100},
		Ref:         &ref,
		Recursive:   &recursive,
	}
	if dir != "." && dir != "" {
		opt.Path = &dir
	}
	var out []*gitlab.TreeNode
	var next gitlab.RequestOptionFunc
	for {
		var resp *gitlab.Response
		err := c.call(ctx, "list_tree", http.MethodGet, func(o gitlab.RequestOptionFunc) (*gitlab.Response, error) {
			var nodes []*gitlab.TreeNode
			var err error
			nodes, resp, err = c.gl.Repositories.ListTree(project, opt, o, next)
			out = append(out, nodes...)
			return resp, err
		})
		if ClassOf(err) == ClassNotFound && !messageContains(err, "project") {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		n, ok := gitlab.WithNext(resp)
		if !ok {
			return out, nil
		}
		next = n
	}
}
