//go:build race

package harness_test

// raceEnabled: the test binary runs under -race, so the e2e test builds the
// batcherd processes with -race too.
const raceEnabled = true
