package gitlabsim

// Routes and controls for what batcherd checks at GitLab's boundary: who the token is
// (GET /user), a single file (GET …/repository/files/:file_path, which answers its own 404,
// "404 File Not Found"), and paths GitLab refuses in a commit.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"maps"
	"net/http"
	"path"
	"strings"
)

func init() {
	addRoute(http.MethodGet, "/user", getUser)
	addRoute(http.MethodGet, "/projects/:id/repository/files/:file", getFile)
}

func getUser(s *Sim, q *req) (*reply, *apiError) {
	u := s.userJSON()
	u["email"] = s.user.Email
	u["is_admin"] = false
	u["bot"] = false
	return ok(http.StatusOK, u)
}

// getFile answers GET /projects/:id/repository/files/:file_path?ref=: the file with
// its content (base64), or GitLab's own 404 for a file that is not there.
func getFile(s *Sim, q *req) (*reply, *apiError) {
	ref, hasRef := q.str("ref")
	if !hasRef || ref == "" {
		return nil, validationErr("ref is missing")
	}
	fp := q.segs[4]
	sha, found := s.resolveRef(q.proj, ref)
	if !found {
		return nil, notFound("Commit")
	}
	content, exists := s.commits[sha].files[fp]
	if !exists {
		return nil, notFound("File")
	}
	sum := sha256.Sum256([]byte(content))
	return ok(http.StatusOK, map[string]any{
		"file_name": path.Base(fp), "file_path": fp, "size": len(content), "encoding": "base64",
		"content": base64.StdEncoding.EncodeToString([]byte(content)), "content_sha256": hex.EncodeToString(sum[:]),
		"ref": ref, "blob_id": blobID(content), "commit_id": sha, "last_commit_id": sha, "execute_filemode": false,
	})
}

// RefusedPath makes createCommit refuse an action on a path containing Contains, with
// Status (default 400) and Message, as GitLab refuses paths it will not store.
type RefusedPath struct {
	Contains string
	Status   int
	Message  string
}

// RefusePath adds a refusal rule to a project.
func (s *Sim) RefusePath(project string, rule RefusedPath) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.projectLocked(project) == nil {
		return errors.New("gitlabsim: no project " + project)
	}
	if rule.Status == 0 {
		rule.Status = http.StatusBadRequest
	}
	if s.refused == nil {
		s.refused = map[string][]RefusedPath{}
	}
	s.refused[project] = append(s.refused[project], rule)
	return nil
}

func (s *Sim) refusedPath(p *project, fp string) *apiError {
	for _, r := range s.refused[p.path] {
		if strings.Contains(fp, r.Contains) {
			return msgErr(r.Status, r.Message)
		}
	}
	return nil
}

// CommitToBranch commits files on branch as a human with push rights would (content
// nil deletes the path), creating the branch from the default branch when it does not
// exist. It returns the new head sha.
func (s *Sim) CommitToBranch(project, branch string, files map[string]*string, message string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.projectLocked(project)
	if p == nil {
		return "", ErrNotFound
	}
	head, ok := p.branches[branch]
	if !ok {
		head = p.branches[p.defaultBranch]
	}
	next := maps.Clone(s.commits[head].files)
	for fp, content := range files {
		if content == nil {
			delete(next, fp)
		} else {
			next[fp] = *content
		}
	}
	c := s.newCommit([]string{head}, message, next)
	p.branches[branch] = c.sha
	return c.sha, nil
}
