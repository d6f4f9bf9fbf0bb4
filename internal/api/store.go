package api

import (
	"context"

	"github.com/batcherd/batcherd/internal/domain"
	"github.com/batcherd/batcherd/internal/store"
)

// Store is what the API needs from the database; *store.Store satisfies it. Declared
// here, where it is used: every method is one store transaction, and the handlers
// never see a driver error (store translates them into its sentinel errors, which
// toAPIError maps to answers).
type Store interface {
	Ping(ctx context.Context) error

	// operations
	OperationCreate(ctx context.Context, p store.OperationCreateParams) (op domain.Operation, created bool, err error)
	OperationApproveBy(ctx context.Context, operationID, actor string, fourEyes bool) (domain.Operation, error)
	OperationRejectBy(ctx context.Context, operationID, actor string) (domain.Operation, error)
	OperationRetryBy(ctx context.Context, operationID, actor string) (domain.Operation, error)
	OperationGetView(ctx context.Context, operationID string) (store.OperationView, error)
	OperationEvents(ctx context.Context, operationID string) ([]store.Event, error)
	OperationCounts(ctx context.Context, statuses ...domain.OpStatus) (map[domain.OpStatus]int64, error)

	// bindings and batches
	BindingList(ctx context.Context, subject, target string, afterID int64, limit int) ([]domain.Binding, error)
	BindingsExpiredActive(ctx context.Context) (int64, error)
	BatchGet(ctx context.Context, id int64) (domain.Batch, error)
	BatchList(ctx context.Context, f store.BatchFilter) ([]domain.Batch, error)
	BatchMRURL(ctx context.Context, batchID int64) (string, error)
	BatchOperationIDs(ctx context.Context, batchIDs []int64) (map[int64][]string, error)
	BatchMarkDue(ctx context.Context, id int64) error
	WaitingStats(ctx context.Context) ([]store.RepoWaiting, error)

	// repositories: GitLab state and drift (GET /v1/repos)
	RepoHealths(ctx context.Context) (map[string]store.RepoHealth, error)

	// installation identity (webhook: this installation's branches only)
	Installation(ctx context.Context) (string, error)

	// queue control
	OperationGet(ctx context.Context, operationID string) (domain.Operation, error)
	OperationWithdraw(ctx context.Context, operationID, by string) (domain.Operation, error)
	BatchClaimPrecheck(ctx context.Context, repo string) (store.ClaimPrecheck, error)
	RepoPause(ctx context.Context, p store.RepoPauseParams) (store.RepoControl, error)
	RepoResume(ctx context.Context, repo, by string) (store.RepoControl, error)
	RepoControls(ctx context.Context, repos []string) (map[string]store.RepoControl, error)
	RepoStates(ctx context.Context, repos []string) ([]store.RepoState, error)
	RepoEvents(ctx context.Context, repo string, limit int) ([]store.Event, error)
	WaitingStrays(ctx context.Context, limit int) ([]store.Stray, error)
}

var _ Store = (*store.Store)(nil)
