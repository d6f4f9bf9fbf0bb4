package mr

import (
	"context"
	"crypto/sha1"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	gitlab "gitlab.com/gitlab-org/api/client-go"
)

// User is who GitLab says the token is.
type User struct {
	ID       int64  `json:"id"`
	Username string `json:"username"`
}

// CurrentUser asks GitLab who the token is (GET /user): 401 when GitLab refuses it.
func (c *Client) CurrentUser(ctx context.Context) (User, error) {
	var u User
	err := c.raw(ctx, "current_user", http.MethodGet, "user", nil, &u)
	return u, err
}

// CheckProject reads a project once (GET /projects/:id): 403 or 404 when GitLab does not
// show it to the token.
func (c *Client) CheckProject(ctx context.Context, project string) error {
	var p struct {
		ID int64 `json:"id"`
	}
	return c.raw(ctx, "get_project", http.MethodGet, projectPath(project), nil, &p)
}

// Access states: what an error (or its absence) says about batcherd's access to a
// project. They are the repository states of GET /v1/repos.
const (
	AccessOK           = "ok"
	AccessUnauthorized = "unauthorized"
	AccessForbidden    = "forbidden"
	AccessNotFound     = "not_found"
	AccessUnreachable  = "unreachable"
)

// AccessOf reads what err says about access to the project a call was about: "ok" for
// nil or an answer that proves access (a 404 of a branch, a 409, a 400 about the
// content…), unauthorized (401), forbidden (403), not_found (GitLab's own "404 Project
// Not Found"), unreachable (no answer, a timeout, 5xx, 429). "" when err says nothing
// about GitLab (a cancelled context, a local error).
func AccessOf(err error) string {
	if err == nil {
		return AccessOK
	}
	var e *Error
	if !errors.As(err, &e) {
		return ""
	}
	if errors.Is(err, context.Canceled) {
		return ""
	}
	switch {
	case e.Status == http.StatusUnauthorized:
		return AccessUnauthorized
	case e.Status == http.StatusForbidden:
		return AccessForbidden
	case e.Status == http.StatusNotFound && messageContains(err, "project"):
		return AccessNotFound
	case e.Class == ClassTransient:
		return AccessUnreachable
	}
	return AccessOK
}

// IsContentRefusal reports a permanent refusal of a batch's content by the commit call:
// 400 or 422 from POST …/repository/commits (a path GitLab will not store, an action it
// refuses). Retrying the same content cannot help; the batch fails at once and the
// failure policy isolates the member.
func IsContentRefusal(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Op == "create_commit" &&
		(e.Status == http.StatusBadRequest || e.Status == http.StatusUnprocessableEntity)
}

// Blob is one file of a tree listing: its path and git blob id.
type Blob struct {
	Path string
	ID   string
}

// ListBlobs lists every file under dir on ref, recursively (all pages). A directory
// that does not exist lists as empty.
func (c *Client) ListBlobs(ctx context.Context, project, ref, dir string) ([]Blob, error) {
	nodes, err := c.listTree(ctx, project, ref, dir, true)
	if err != nil {
		return nil, err
	}
	out := make([]Blob, 0, len(nodes))
	for _, n := range nodes {
		if n.Type == "blob" {
			out = append(out, Blob{Path: n.Path, ID: n.ID})
		}
	}
	return out, nil
}

// ReadFile reads one file of ref: its content, or found=false on GitLab's own
// "404 File Not Found".
func (c *Client) ReadFile(ctx context.Context, project, ref, filePath string) (content string, found bool, err error) {
	var f struct {
		Content  string `json:"content"`
		Encoding string `json:"encoding"`
	}
	err = c.raw(ctx, "get_file", http.MethodGet, projectPath(project, "repository/files", gitlab.PathEscape(filePath)),
		&gitlab.GetFileOptions{Ref: &ref}, &f)
	if ClassOf(err) == ClassNotFound && messageContains(err, "file not found") {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	if f.Encoding == "base64" {
		b, derr := base64.StdEncoding.DecodeString(f.Content)
		if derr != nil {
			return "", false, &Error{Op: "get_file", Class: ClassTransient, Message: "undecodable file content: " + derr.Error()}
		}
		return string(b), true, nil
	}
	return f.Content, true, nil
}

// GitBlobID is git's object id of a blob with this content (what tree listings show),
// so a file can be compared with what batcherd would write without reading it.
func GitBlobID(content string) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(content))
	h.Write([]byte(content))
	return hex.EncodeToString(h.Sum(nil))
}
