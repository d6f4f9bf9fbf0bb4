// Package harness runs batcherd the way production does — separate `batcherd serve`
// processes sharing one MySQL/MariaDB database, talking to a GitLab — and gives a
// test, the demo or a chaos run the handles to drive and observe them.
//
// What it does, in order (Start):
//
//  1. builds cmd/batcherd and cmd/gitlab-sim once (go build, or uses prebuilt
//     binaries from Options.Binaries);
//  2. creates a fresh, uniquely named database on the server of Options.ServerDSN
//     (BATCHERD_TEST_DSN, default batcherd:batcherd@tcp(127.0.0.1:3306)/) and runs
//     `batcherd migrate` against it;
//  3. starts the GitLab simulator (cmd/gitlab-sim) on a free loopback port;
//  4. starts N `batcherd serve` replicas, each its own process group, its own
//     BATCHERD_HTTP_ADDR on a free 127.0.0.1 port and BATCHERD_REPLICA_ID, and waits
//     for every /readyz.
//
// A Replica can then be killed (SIGKILL to its process group), stopped (SIGTERM,
// graceful), restarted on the same address, and scraped (/metrics). Client speaks
// the HTTP API (internal/wire) (round-robin over live replicas, failing over on
// connection errors, which is safe because every call it makes is idempotent:
// admission with an Idempotency-Key, approve, reads, rounds). SimClient reads and
// drives the simulator through its control API (/-/sim/...). Audit checks the end
// state against the repository: operations merged, one MR per batch, no MR merged
// behind a failed batch, binding files present or absent.
//
// Nothing outlives the harness: Close stops every process it started (SIGTERM, then
// SIGKILL to the process group) and drops the database; on Linux every child also
// has PR_SET_PDEATHSIG=SIGKILL, so even a harness killed with -9 (or a test binary
// that panics on -timeout) takes its replicas and simulator with it. Only the
// database of such a run is left behind; its name starts with Options.DBPrefix.
//
// Each process's stdout and stderr go to a file under Cluster.LogDir
// (replica-1.log, gitlab-sim.log, …); Cluster.LogTail helps a failing test say why.
package harness
