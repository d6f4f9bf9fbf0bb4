package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/batcherd/batcherd/internal/mr"
)

// ErrPreflight marks a start-up refusal by GitLab: the token is refused (401/403 on
// GET /user) or a configured repository is not shown to it (403/404). It is a
// configuration error: the binary exits 2 with a message naming BATCHERD_GITLAB_TOKEN
// or the repository.
var ErrPreflight = errors.New("GitLab preflight")

// preflightGitLab is what the preflight needs from the GitLab layer.
type preflightGitLab interface {
	CurrentUser(ctx context.Context) (mr.User, error)
	CheckProject(ctx context.Context, project string) error
}

// preflight asks GitLab who the token is and reads each configured repository once,
// before serve takes any work (README, "Start-up preflight and GitLab refusals"). A token
// GitLab refuses or a repository it does not show ends serve (exit 2): a replica that
// starts anyway is ready, claims work and then sits on it until the batch timeout,
// which is how a revoked token went unnoticed. GitLab unreachable is only a warning:
// it may come back, and admission must keep working meanwhile. What each repository
// answered is returned for the scanner's GitLab state (nil: ok; absent: not checked).
func preflight(ctx context.Context, gl preflightGitLab, repos []string, log *slog.Logger) (map[string]error, error) {
	out := map[string]error{}
	u, err := gl.CurrentUser(ctx)
	switch mr.AccessOf(err) {
	case mr.AccessOK:
		log.Info("GitLab preflight: token accepted", "gitlab_user", u.Username)
	case mr.AccessUnauthorized, mr.AccessForbidden:
		return nil, fmt.Errorf("%w: GitLab refuses the token (%v): check BATCHERD_GITLAB_TOKEN (a valid, unexpired token with api scope)", ErrPreflight, err)
	default:
		log.Warn("GitLab preflight: GitLab did not answer; starting anyway (admission works without it, and the loops retry)", "err", err)
		return out, nil
	}
	for _, repo := range repos {
		err := gl.CheckProject(ctx, repo)
		switch mr.AccessOf(err) {
		case mr.AccessOK:
			out[repo] = nil
		case mr.AccessUnauthorized:
			return nil, fmt.Errorf("%w: GitLab refuses the token (%v): check BATCHERD_GITLAB_TOKEN", ErrPreflight, err)
		case mr.AccessForbidden, mr.AccessNotFound:
			return nil, fmt.Errorf("%w: GitLab does not show repository %q of BATCHERD_REPOS to the token's user %s (%v): check the path and that the user is a member with at least Developer access",
				ErrPreflight, repo, u.Username, err)
		default:
			log.Warn("GitLab preflight: repository not checked, GitLab did not answer", "repo", repo, "err", err)
			out[repo] = err
		}
	}
	return out, nil
}
