package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/batcherd/batcherd/internal/domain"
)

// GitLab states of a repository (GET /v1/repos "gitlab"; README, "Start-up
// preflight and GitLab refusals").
const (
	GitLabOK           = "ok"
	GitLabUnauthorized = "unauthorized" // 401: GitLab refuses the token
	GitLabForbidden    = "forbidden"    // 403: the token's user may not do this in the project
	GitLabNotFound     = "not_found"    // 404 for the project: GitLab does not show it to the token
	GitLabUnreachable  = "unreachable"  // no answer, or 5xx
)

// GitLabStates lists every state, in the order the metric exports them.
var GitLabStates = []string{GitLabOK, GitLabUnauthorized, GitLabForbidden, GitLabNotFound, GitLabUnreachable}

// GitLabRefusal reports whether a state means GitLab refuses us the repository: work
// for it is held (never failed for it), and the batch timeout does not run.
func GitLabRefusal(state string) bool {
	return state == GitLabUnauthorized || state == GitLabForbidden || state == GitLabNotFound
}

// RepoHealth is one repo_state row: what replicas learned about a repository.
type RepoHealth struct {
	Repo            string     `db:"repo"`
	GitLabState     string     `db:"gitlab_state"`
	GitLabDetail    string     `db:"gitlab_detail"`
	GitLabChangedAt *time.Time `db:"gitlab_changed_at"`
	DriftUnexpected *int       `db:"drift_unexpected"`
	DriftMissing    *int       `db:"drift_missing"`
	DriftModified   *int       `db:"drift_modified"`
	DriftCheckedAt  *time.Time `db:"drift_checked_at"`
}

const repoStateCols = "repo, gitlab_state, gitlab_detail, gitlab_changed_at, drift_unexpected, drift_missing, drift_modified, drift_checked_at"

// refusalList is the SQL list of refusal states.
const refusalList = "('unauthorized', 'forbidden', 'not_found')"

// RepoGitLabStateSet records what GitLab last answered for repo. Leaving a refusal
// state stamps timeout_resume_at, from which the repository's held batches get a whole
// batch timeout again (qBatchesTimedOut). Assignments run left to right, so the stamps
// compare against the old state before it is replaced.
func (s *Store) RepoGitLabStateSet(ctx context.Context, repo, state, detail string) error {
	detail = truncRunes(detail, 512)
	_, err := s.db.ExecContext(ctx, `INSERT INTO repo_state (repo, gitlab_state, gitlab_detail, gitlab_changed_at)
		VALUES (?, ?, ?, CURRENT_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE
		  timeout_resume_at = IF(gitlab_state IN `+refusalList+` AND VALUES(gitlab_state) NOT IN `+refusalList+`,
		                         CURRENT_TIMESTAMP(6), timeout_resume_at),
		  gitlab_changed_at = IF(gitlab_state <> VALUES(gitlab_state) OR gitlab_changed_at IS NULL, CURRENT_TIMESTAMP(6), gitlab_changed_at),
		  gitlab_detail = VALUES(gitlab_detail),
		  gitlab_state = VALUES(gitlab_state),
		  version = version + 1`, repo, state, detail)
	return translate(err)
}

// RepoHealths returns every repo_state row by repository.
func (s *Store) RepoHealths(ctx context.Context) (map[string]RepoHealth, error) {
	var rows []RepoHealth
	if err := s.db.SelectContext(ctx, &rows, "SELECT "+repoStateCols+" FROM repo_state"); err != nil {
		return nil, translate(err)
	}
	out := make(map[string]RepoHealth, len(rows))
	for _, r := range rows {
		out[r.Repo] = r
	}
	return out, nil
}

// RepoDriftReserve is the drift loop's tryLock: it takes repo's drift check for one
// interval when its reservation has lapsed (drift_next_at, database clock), creating
// the row on first use. taken=false means another replica checked it (or is checking
// it) within the interval.
func (s *Store) RepoDriftReserve(ctx context.Context, repo string, interval time.Duration) (taken bool, err error) {
	err = s.withTx(ctx, sql.LevelReadCommitted, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT IGNORE INTO repo_state (repo) VALUES (?)", repo); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, `UPDATE repo_state
			SET drift_next_at = CURRENT_TIMESTAMP(6) + INTERVAL ? MICROSECOND, version = version + 1
			WHERE repo = ? AND drift_next_at <= CURRENT_TIMESTAMP(6)`, interval.Microseconds(), repo)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		taken = n == 1
		return err
	})
	return taken, err
}

// DriftCounts are the files of one drift check, by kind.
type DriftCounts struct {
	Unexpected, Missing, Modified int
}

// RepoDriftRecord stores the result of a drift check of repo.
func (s *Store) RepoDriftRecord(ctx context.Context, repo string, c DriftCounts) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO repo_state (repo, drift_unexpected, drift_missing, drift_modified, drift_checked_at)
		VALUES (?, ?, ?, ?, CURRENT_TIMESTAMP(6))
		ON DUPLICATE KEY UPDATE drift_unexpected = VALUES(drift_unexpected), drift_missing = VALUES(drift_missing),
		  drift_modified = VALUES(drift_modified), drift_checked_at = VALUES(drift_checked_at), version = version + 1`,
		repo, c.Unexpected, c.Missing, c.Modified)
	return translate(err)
}

// BindingFile is what the repository should hold for one binding of a repository:
// its status, and for an active binding the grant operation that wrote its file.
type BindingFile struct {
	Subject     string               `db:"subject"`
	Target      string               `db:"target"`
	Status      domain.BindingStatus `db:"status"`
	OperationID string               `db:"operation_id"`
	ExpiresAt   *time.Time           `db:"expires_at"`
	Attributes  []byte               `db:"attributes"` // the JSON object as stored; nil when none
}

// BindingFiles lists repo's bindings whose file the repository holds or may hold
// (active and revoking: held; pending: a grant in flight, may already be merged), with
// the expiry and attributes of the operation that owns each. A drift check reads it
// once per interval per repository.
func (s *Store) BindingFiles(ctx context.Context, repo string) ([]BindingFile, error) {
	var out []BindingFile
	err := s.db.SelectContext(ctx, &out, `SELECT b.subject, b.target, b.status, b.operation_id, o.expires_at, o.attributes
		FROM binding b LEFT JOIN operation o ON o.operation_id = b.operation_id
		WHERE b.repo = ? AND b.status IN ('active', 'revoking', 'pending')`, repo)
	return out, translate(err)
}
