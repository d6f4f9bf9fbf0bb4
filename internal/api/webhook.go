package api

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/batcherd/batcherd/internal/domain"
)

// gitlabEvent is the little of a GitLab webhook payload batcherd reads: enough to find
// a batch branch. Nothing in it is trusted as the MR's state — it only makes the batch
// due for reconcile now, and reconcile reads the MR from GitLab itself.
type gitlabEvent struct {
	ObjectKind       string `json:"object_kind"`
	ObjectAttributes struct {
		SourceBranch string `json:"source_branch"` // merge_request events
		Ref          string `json:"ref"`           // pipeline events
	} `json:"object_attributes"`
	MergeRequest *struct {
		SourceBranch string `json:"source_branch"`
	} `json:"merge_request"` // pipeline events for an MR
}

// webhookMaxBodyBytes bounds a webhook payload. It is not the API's 64 KiB: GitLab sends
// the whole MR with the event — its description (up to a million characters; batcherd's
// own list every member, 50–80 KiB for 500 members) and, on an update, the previous
// description too — and refusing it loses the hint and gets the hook disabled. Only a
// caller that passed the X-Gitlab-Token check gets this far.
const webhookMaxBodyBytes = 16 << 20

// handleWebhook: POST /v1/webhooks/gitlab. Always 204 once authenticated and parsed:
// GitLab disables hooks that keep failing, and a missed hint costs only latency (the
// reconcile loop polls anyway).
func (s *Server) handleWebhook(w http.ResponseWriter, r *http.Request) error {
	body, err := readBodyMax(w, r, webhookMaxBodyBytes)
	if err != nil {
		return err
	}
	var ev gitlabEvent
	if body != nil {
		// A field of an unexpected type is not our business (the payload is a hint);
		// only a body that is not JSON at all is refused.
		var typ *json.UnmarshalTypeError
		if err := json.Unmarshal(body, &ev); err != nil && !errors.As(err, &typ) {
			return decodeError(err)
		}
	}
	var branch string
	switch ev.ObjectKind {
	case "merge_request":
		branch = ev.ObjectAttributes.SourceBranch
	case "pipeline":
		branch = ev.ObjectAttributes.Ref
		if ev.MergeRequest != nil && ev.MergeRequest.SourceBranch != "" {
			branch = ev.MergeRequest.SourceBranch
		}
	}
	// Only this installation's batch branches (batcherd/<installation>/batch-<id>), and
	// legacy ones (batcherd/batch-<id>, from before installations had ids: a hint to look
	// at a batch costs nothing even if the branch is another's). Another installation's
	// branch on the same project names another database's batch.
	inst, id, ok := domain.ParseBranch(branch)
	if ok && inst != "" {
		own, err := s.st.Installation(r.Context())
		ok = err == nil && inst == own
	}
	if !ok {
		s.m.webhooks.WithLabelValues("ignored").Inc()
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if err := s.st.BatchMarkDue(r.Context(), id); err != nil {
		s.m.webhooks.WithLabelValues("error").Inc()
		s.log.Warn("webhook: cannot mark batch due; reconcile will find it on its own schedule", "batch_id", id, "err", err)
	} else {
		s.m.webhooks.WithLabelValues("marked_due").Inc()
		s.log.Debug("webhook: batch marked due", "batch_id", id, "kind", ev.ObjectKind)
		// Wake this replica's reconcile loop: the batch is due now, and waiting for the
		// next tick would waste the hint. Other replicas find it on their own tick.
		if s.kick != nil {
			s.kick()
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
