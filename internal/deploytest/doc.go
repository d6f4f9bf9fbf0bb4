// Package deploytest holds no code: its tests check that the packaging in the repository
// (deploy/kubernetes, systemd/, Dockerfile) agrees with the code — probe paths and ports
// against the HTTP server's defaults, grace periods against BATCHERD_SHUTDOWN_TIMEOUT,
// every configured variable against internal/config, and the hardening of the systemd unit.
package deploytest
