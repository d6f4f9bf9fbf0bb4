// Command gitlab-sim serves the in-memory GitLab API simulator (internal/mr/gitlabsim)
// for the demo and for manual runs of batcherd without a GitLab instance.
//
// Every flag has an environment variable, so the demo can configure it from a file:
//
//	-addr               GITLAB_SIM_ADDR               listen address (default 127.0.0.1:8929)
//	-token              GITLAB_SIM_TOKEN              accepted PRIVATE-TOKEN (default sim-token)
//	-token-file         GITLAB_SIM_TOKEN_FILE         read the token from a file instead
//	-projects           GITLAB_SIM_PROJECTS           comma-separated project paths
//	-default-branch     GITLAB_SIM_DEFAULT_BRANCH     default branch (default main)
//	-pipeline-duration  GITLAB_SIM_PIPELINE_DURATION  how long pipelines run (default 2s)
//	-failure-rate       GITLAB_SIM_FAILURE_RATE       probability a pipeline fails (0..1)
//	-failure-reason     GITLAB_SIM_FAILURE_REASON     failure_reason of random failures
//	-seed               GITLAB_SIM_SEED               seed of the random failures
//	-web-url            GITLAB_SIM_WEB_URL            base of web_url fields
//
// The control API is served under /-/sim/ (see the gitlabsim package documentation).
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
)

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func main() { os.Exit(exitCode(run(os.Args[1:]))) }

// errUsage marks a command line the flag package refused (it has printed why and the
// usage already).
var errUsage = errors.New("usage")

// exitCode: 0 for success and for -h (help asked for is not an error), 2 for a bad
// command line, 1 for any other failure.
func exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintln(os.Stderr, "gitlab-sim:", err)
	return 1
}

func run(args []string) error {
	fs := flag.NewFlagSet("gitlab-sim", flag.ContinueOnError)
	addr := fs.String("addr", env("GITLAB_SIM_ADDR", "127.0.0.1:8929"), "listen address")
	token := fs.String("token", env("GITLAB_SIM_TOKEN", "sim-token"), "accepted PRIVATE-TOKEN")
	tokenFile := fs.String("token-file", env("GITLAB_SIM_TOKEN_FILE", ""), "file holding the token (overrides -token)")
	projects := fs.String("projects", env("GITLAB_SIM_PROJECTS", "platform/access-bindings"), "comma-separated project paths")
	branch := fs.String("default-branch", env("GITLAB_SIM_DEFAULT_BRANCH", "main"), "default branch")
	durationDef, err := time.ParseDuration(env("GITLAB_SIM_PIPELINE_DURATION", "2s"))
	if err != nil {
		return fmt.Errorf("GITLAB_SIM_PIPELINE_DURATION: %w", err)
	}
	duration := fs.Duration("pipeline-duration", durationDef, "how long pipelines run")
	rateDef, err := strconv.ParseFloat(env("GITLAB_SIM_FAILURE_RATE", "0"), 64)
	if err != nil {
		return fmt.Errorf("GITLAB_SIM_FAILURE_RATE: %w", err)
	}
	rate := fs.Float64("failure-rate", rateDef, "probability that a pipeline fails (0..1)")
	reason := fs.String("failure-reason", env("GITLAB_SIM_FAILURE_REASON", "script_failure"), "failure_reason of random failures")
	seedDef, err := strconv.ParseUint(env("GITLAB_SIM_SEED", "1"), 10, 64)
	if err != nil {
		return fmt.Errorf("GITLAB_SIM_SEED: %w", err)
	}
	seed := fs.Uint64("seed", seedDef, "seed of the random failures")
	webURL := fs.String("web-url", env("GITLAB_SIM_WEB_URL", ""), "base of web_url fields (default: the server URL)")
	version := fs.String("gitlab-version", env("GITLAB_SIM_VERSION", gitlabsim.DefaultVersion), "GitLab version spoken (GET /version and the merge API's semantics), e.g. "+strings.Join(gitlabsim.Versions, ", "))
	method := fs.String("merge-method", env("GITLAB_SIM_MERGE_METHOD", gitlabsim.MergeMethodMerge), "merge method of the projects: merge, ff or rebase_merge")
	checkReadsDef, err := strconv.Atoi(env("GITLAB_SIM_MERGE_CHECK_READS", "0"))
	if err != nil {
		return fmt.Errorf("GITLAB_SIM_MERGE_CHECK_READS: %w", err)
	}
	checkReads := fs.Int("merge-check-reads", checkReadsDef, "reads of an MR before its asynchronous mergeability check ends (0: at once)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("reading token file: %w", err)
		}
		*token = strings.TrimSpace(string(b))
	}
	switch *method {
	case gitlabsim.MergeMethodMerge, gitlabsim.MergeMethodFastForward, gitlabsim.MergeMethodRebaseMerge:
	default:
		return fmt.Errorf("merge method %q is not merge, ff or rebase_merge", *method)
	}
	if parts := strings.Split(*version, "."); len(parts) < 2 {
		return fmt.Errorf("gitlab version %q is not major.minor[.patch]", *version)
	}
	if *rate < 0 || *rate > 1 {
		return fmt.Errorf("failure rate %v is outside 0..1", *rate)
	}
	var paths []string
	for p := range strings.SplitSeq(*projects, ",") {
		if p = strings.TrimSpace(p); p != "" {
			paths = append(paths, p)
		}
	}
	sim := gitlabsim.New(gitlabsim.Options{
		Token: *token, Projects: paths, DefaultBranch: *branch, PipelineDuration: *duration,
		FailureRate: *rate, FailureReason: *reason, Seed: *seed, WebURL: *webURL,
		Version: *version, MergeMethod: *method, MergeCheckReads: *checkReads,
	})
	if err := sim.Start(*addr); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The token is deliberately not logged.
	log.Info("gitlab-sim listening", "url", sim.URL(), "api", sim.URL()+"/api/v4", "control", sim.URL()+"/-/sim/state",
		"projects", strings.Join(paths, ","), "pipeline_duration", duration.String(), "failure_rate", *rate, "gitlab_version", *version, "merge_method", *method)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	sim.Close()
	return nil
}
