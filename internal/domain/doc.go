// Package domain is what batcherd's business is, with no database, HTTP or GitLab in
// it: operations, batches and bindings; their statuses and the transitions allowed
// between them (transitions.go, one table per entity); the failure classes a batch can
// fail for; and the naming rules every other package shares (branch names, binding
// file paths, what a subject or target may be, which attribute numbers a file can
// carry).
//
// It imports nothing of batcherd's. store maps rows to these types, api renders them,
// scanner decides with them, mr writes the files they name. docs/ARCHITECTURE.md
// shows where each rule is enforced.
package domain
