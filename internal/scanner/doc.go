// Package scanner runs batcherd's background loops (docs/ARCHITECTURE.md, "The loops") in every replica. The
// replicas never talk to each other: every loop coordinates only through the store's
// unique active slot and guarded writes, following fetch → tryLock (seed 002): read
// candidates without locks, take each with a guarded UPDATE that also pushes its
// next-check time into the future (the reservation), then act only on what was taken.
// Losing a race is normal and logged at debug.
//
// # Batch state machine
//
//	claim ──► RUNNING ◄──────── unblock ─────────┐
//	            │  │                             │
//	            │  └──────── block ─────────► BLOCKED
//	            │                                │
//	            ├── MR merged ───────────────────┼──► SUCCEEDED ◄──┐
//	            │                                │                 │ merged wins
//	            └── settle failure ──────────────┴──► FAILED ──────┘ (orphan sweep)
//
// In words:
//
//   - RUNNING and BLOCKED are "active": they hold the repository's slot (I1), so at
//     most one of them exists per repository.
//   - A failed (or canceled) pipeline, a conflict or a needed rebase is classified and
//     settled at once through the failure policy (policy.go, BATCHERD_ON_FAILURE=isolate,
//     the default): the batch goes FAILED and its members are retried, bisected or
//     failed with a reason. With BATCHERD_ON_FAILURE=block, and always when the head
//     moved away from the sha batcherd committed, RUNNING → BLOCKED instead: the slot
//     stays taken and the batch waits for an operator (retry the pipeline, fix the
//     conflict) or for the timeout, which then applies the policy.
//   - BLOCKED → RUNNING when the reason went away (e.g. the pipeline was retried and
//     runs again); in auto mode the merge is re-armed.
//   - RUNNING/BLOCKED → SUCCEEDED when the MR is merged; → FAILED on settle failure.
//   - FAILED is final for the batch, not for its members: a failure settlement puts
//     members back in the waiting set as a claim group (a retry of the same members, or
//     one half of a bisection) in the same transaction, and later rounds take each
//     group as its own batch (a new branch on the current target head).
//   - FAILED → SUCCEEDED only when the MR merged anyway (a human merged it, or a merge
//     landed while the batch was being failed): the database follows the repository,
//     merged wins. SUCCEEDED is final.
//
// # Loops
//
// One file per loop, each with a small config and a runOnce(ctx) that tests call
// directly; Scanner.Run starts them all with start jitter, capped exponential backoff
// with jitter on errors, and sleeps that a context cancel (or Kick) interrupts.
//
//   - claim (claim.go): on a cron schedule and on RunRound (the admin API), same code:
//     one lock-free precheck (anything waiting? slot held?), then one store transaction
//     per repository that may claim; a claim in flight elsewhere answers slot_occupied
//     at once instead of being waited for.
//   - publish (publish.go): a RUNNING batch without an MR gets its branch
//     batcherd/<installation>/batch-<id>, one commit, the MR; the MR is recorded with a guarded write
//     BEFORE any merge is armed (fencing), then the merge mode is applied. Every step
//     is idempotent by the deterministic branch, so any replica resumes a half-done
//     publish without a second MR: after the publish lease when the publisher died,
//     after a short backoff when a step met a transient GitLab error.
//   - reconcile (reconcile.go): reads the MR of each due active batch: merged → settle
//     success; closed → settle failure; failed pipeline/conflict → BLOCKED; recovered →
//     RUNNING; direct mode merges once the pipeline succeeded.
//   - timeout (timeout.go): active batches older than BatchTimeout (DB clock) → settle
//     failure (class timeout, or gitlab_unavailable when no MR was ever recorded).
//   - settle (settle.go): settle failure records the failure class on the batch, closes
//     the MR (found by recorded iid or by the branch even when none is recorded),
//     re-reads it — merged wins — and only then fails the batch and applies the policy
//     to its members in one store transaction; a closed MR on a batch without a
//     recorded class was closed by a human (closed_by_user). When the settlement
//     requeued members, the settling replica claims the next group at once
//     (BatchClaimFollowUp) instead of waiting for the schedule. SettleBatch exposes it
//     to the admin API.
//   - policy (policy.go): classification (test, infra, conflict, unknown, timeout,
//     gitlab_unavailable, closed_by_user, …) and each member's fate: retry the group,
//     bisect into halves, culprit, max_attempts, or failed with the class.
//   - expiry (expiry.go): active bindings past expires_at get a revoke operation.
//   - cleanup (cleanup.go): expired idempotency keys and old waiting rows, in chunks.
//   - orphans (orphans.go): open batcherd-labelled MRs whose batch is not active are
//     closed; FAILED batches whose MR merged anyway are settled SUCCEEDED.
//
// No store call is made inside a GitLab call or the other way round (I7): the loops
// call store, then GitLab, then store, so a crash between any two calls leaves a state
// that the next pass of some replica finishes.
package scanner
