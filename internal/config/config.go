// Package config reads every BATCHERD_* environment variable into one struct with
// go-envconfig, applies defaults, loads secrets from *_FILE variables and validates
// the result with errors that name the variable and say what to do.
//
// The struct is also the documentation: Vars lists every variable with its default
// and meaning for `batcherd help`, and a test keeps the README's table in step.
package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/sethvargo/go-envconfig"

	"github.com/batcherd/batcherd/internal/domain"
)

// Prefix is the prefix of every variable.
const Prefix = "BATCHERD_"

// Config is every setting of batcherd. Field tags: env (name without the prefix and
// default), desc (one line for help and the README), secret (never printed).
type Config struct {
	MySQLDSN     string `env:"MYSQL_DSN" secret:"true" desc:"go-sql-driver DSN, user:pass@tcp(host:3306)/db (required; or BATCHERD_MYSQL_DSN_FILE)"`
	MySQLDSNFile string `env:"MYSQL_DSN_FILE" desc:"file holding the DSN (instead of BATCHERD_MYSQL_DSN)"`
	MySQLMaxConn int    `env:"MYSQL_MAX_CONNS, default=20" desc:"connection pool size per replica"`

	GitLabURL       string        `env:"GITLAB_URL" desc:"GitLab base URL, e.g. https://gitlab.example.com (required for serve)"`
	GitLabToken     string        `env:"GITLAB_TOKEN" secret:"true" desc:"GitLab token with api scope (or BATCHERD_GITLAB_TOKEN_FILE)"`
	GitLabTokenFile string        `env:"GITLAB_TOKEN_FILE" desc:"file holding the GitLab token"`
	GitLabTimeout   time.Duration `env:"GITLAB_TIMEOUT, default=15s" desc:"timeout of one GitLab API call"`
	Repos           []string      `env:"REPOS" desc:"comma-separated GitLab project paths; the first is the default (required for serve)"`
	TargetBranch    string        `env:"TARGET_BRANCH, default=main" desc:"branch the batch MRs merge into"`

	HTTPAddr          string        `env:"HTTP_ADDR, default=:8080" desc:"listen address of the API, health and metrics"`
	APITokens         []string      `env:"API_TOKENS" secret:"true" desc:"comma-separated name=token entries for /v1 (a bare token acts as token-<first 8 hex of its sha256>; or BATCHERD_API_TOKENS_FILE)"`
	APITokensFile     string        `env:"API_TOKENS_FILE" desc:"file holding API token entries, comma- or newline-separated"`
	AdminTokens       []string      `env:"ADMIN_TOKENS" secret:"true" desc:"comma-separated name=token entries for /v1/admin (also valid for /v1)"`
	AdminTokensFile   string        `env:"ADMIN_TOKENS_FILE" desc:"file holding admin token entries"`
	OIDCIssuer        string        `env:"OIDC_ISSUER" desc:"issuer URL whose bearer JWTs are accepted, e.g. https://gitlab.example.com (off when empty)"`
	OIDCAudience      string        `env:"OIDC_AUDIENCE" desc:"aud an OIDC token must carry (GitLab: the OAuth application id); required with BATCHERD_OIDC_ISSUER"`
	OIDCUsernameClaim string        `env:"OIDC_USERNAME_CLAIM, default=sub" desc:"claim naming the principal (GitLab: nickname is the username)"`
	OIDCGroupsClaim   string        `env:"OIDC_GROUPS_CLAIM, default=groups" desc:"claim listing the user's groups (GitLab's ID token: groups_direct)"`
	OIDCAdminGroups   []string      `env:"OIDC_ADMIN_GROUPS" desc:"comma-separated groups whose members are admin principals"`
	FourEyes          bool          `env:"FOUR_EYES, default=true" desc:"refuse an approval by the principal that requested the operation (403 self_approval)"`
	WebhookSecret     string        `env:"WEBHOOK_SECRET" secret:"true" desc:"X-Gitlab-Token expected on /v1/webhooks/gitlab (webhook disabled when empty; or BATCHERD_WEBHOOK_SECRET_FILE)"`
	WebhookSecretFile string        `env:"WEBHOOK_SECRET_FILE" desc:"file holding the webhook secret"`
	InsecureNoAuth    bool          `env:"INSECURE_NO_AUTH, default=false" desc:"serve the API without tokens (development only; logs a warning)"`
	AutoApprove       bool          `env:"AUTO_APPROVE, default=false" desc:"admit operations at once, skipping the approve call"`
	IdempotencyTTL    time.Duration `env:"IDEMPOTENCY_TTL, default=24h" desc:"how long an Idempotency-Key is remembered"`
	// The status page (internal/ui).
	UISessionKey     string        `env:"UI_SESSION_KEY" secret:"true" desc:"key (at least 32 bytes) signing the status page's session cookies; give every replica behind one load balancer the same (or BATCHERD_UI_SESSION_KEY_FILE). Unset: a random key per process, so a session works only on the replica that opened it and ends when it restarts"`
	UISessionKeyFile string        `env:"UI_SESSION_KEY_FILE" desc:"file holding the status page's session key"`
	UISessionTTL     time.Duration `env:"UI_SESSION_TTL, default=8h" desc:"how long a status page login lasts"`

	ClaimSchedule     string        `env:"CLAIM_SCHEDULE, default=@every 30s" desc:"robfig/cron spec of claim rounds"`
	MaxBatchSize      int           `env:"MAX_BATCH_SIZE, default=500" desc:"most operations claimed into one batch"`
	MergeMode         string        `env:"MERGE_MODE, default=auto" desc:"auto (merge when pipeline succeeds), direct (batcherd merges), manual (humans merge)"`
	ReconcileInterval time.Duration `env:"RECONCILE_INTERVAL, default=10s" desc:"how often an active batch's MR is checked"`
	BatchTimeout      time.Duration `env:"BATCH_TIMEOUT, default=30m" desc:"an active batch older than this is settled as failed (DB clock)"`
	MaxAttempts       int           `env:"MAX_ATTEMPTS, default=3" desc:"charged attempts per operation (first try and each retry; bisection rounds are free) before it fails with reason max_attempts"`
	OnFailure         string        `env:"ON_FAILURE, default=isolate" desc:"what a failed pipeline or a merge conflict does: isolate (classify, then retry, bisect or quarantine at once) or block (the batch stays blocked for an operator until BATCHERD_BATCH_TIMEOUT)"`
	InfraRetries      int           `env:"INFRA_RETRIES, default=1" desc:"retries of the same members as one group, without bisection, after an infrastructure failure (runner, stuck, scheduler, API, canceled), a batch timeout or GitLab trouble; then they fail"`
	ConflictRetries   int           `env:"CONFLICT_RETRIES, default=1" desc:"rebuilds on the new target head after a merge conflict (or a pipeline failure without a reason) before bisecting"`
	FlakeRetries      int           `env:"FLAKE_RETRIES, default=1" desc:"in-place retries of the failed pipeline of a batch of one member (a test or unknown failure) before that member is named the culprit; 0 names it at once"`
	Bisect            bool          `env:"BISECT, default=true" desc:"on a test failure (script_failure) split the batch into halves, recursively, until the culprit is alone (reason culprit); false fails every member"`
	DriftInterval     time.Duration `env:"DRIFT_INTERVAL, default=10m" desc:"how often each repository's bindings/ tree is compared with the active bindings (drift; one replica per repository per interval); 0 turns it off"`
	EventsURL         []string      `env:"EVENTS_URL" secret:"true" desc:"comma-separated receivers of signed events, each an http(s) URL or name=URL (a name keeps its pending events when the URL changes); off when empty; never logged: a URL may carry credentials"`
	EventsSecret      string        `env:"EVENTS_SECRET" secret:"true" desc:"HMAC-SHA256 key of X-Batcherd-Signature (required with BATCHERD_EVENTS_URL; or BATCHERD_EVENTS_SECRET_FILE)"`
	EventsSecretFile  string        `env:"EVENTS_SECRET_FILE" desc:"file holding the events secret"`
	EventsTimeout     time.Duration `env:"EVENTS_TIMEOUT, default=10s" desc:"timeout of one event POST; a replica holds an event for 3 x this while it delivers it (after a crash another replica sends it again once that has passed)"`
	ShutdownTimeout   time.Duration `env:"SHUTDOWN_TIMEOUT, default=20s" desc:"graceful shutdown bound on SIGTERM"`
	ReplicaID         string        `env:"REPLICA_ID" desc:"name of this replica in logs and metrics (default: hostname)"`

	LogFormat string `env:"LOG_FORMAT" desc:"text or json (default: text on a terminal, json otherwise)"`
	LogLevel  string `env:"LOG_LEVEL, default=info" desc:"debug, info, warn or error"`
	// LogRequests: request lines are wanted on their own, without every other debug line.
	LogRequests bool `env:"LOG_REQUESTS, default=false" desc:"log every API request (method, route, status, duration, principal) at info; otherwise at debug only (health, readiness and metrics probes stay at debug)"`
}

// Load reads the environment (through lookup; nil means the process environment),
// resolves *_FILE secrets and applies defaults. It does not validate: call Validate
// with what the subcommand needs.
func Load(ctx context.Context, lookup envconfig.Lookuper) (*Config, error) {
	if lookup == nil {
		lookup = envconfig.OsLookuper()
	}
	var c Config
	if err := envconfig.ProcessWith(ctx, &envconfig.Config{
		Target:   &c,
		Lookuper: envconfig.PrefixLookuper(Prefix, lookup),
	}); err != nil {
		return nil, nameVariable(err)
	}
	if err := c.loadFiles(); err != nil {
		return nil, err
	}
	c.Repos = trimList(c.Repos)
	c.APITokens = trimList(c.APITokens)
	c.AdminTokens = trimList(c.AdminTokens)
	c.OIDCAdminGroups = trimList(c.OIDCAdminGroups)
	c.EventsURL = trimList(c.EventsURL)
	if c.ReplicaID == "" {
		c.ReplicaID, _ = os.Hostname()
	}
	return &c, nil
}

// nameVariable rewrites go-envconfig's error, which starts with the Go field's name
// ("MaxBatchSize: strconv.ParseInt: …"), to start with the variable an operator sets.
// Only non-secret fields can fail to parse (secrets are strings), so the value it may
// quote is not a secret.
func nameVariable(err error) error {
	field, rest, ok := strings.Cut(err.Error(), ": ")
	if f, found := reflect.TypeOf(Config{}).FieldByName(field); ok && found {
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			return fmt.Errorf("%s%s: cannot be read: %s", Prefix, name, rest)
		}
	}
	return fmt.Errorf("reading configuration: %w", err)
}

// loadFiles reads the *_FILE secrets. A secret set both ways is refused rather than one
// silently winning: after a rotation that updated only the file, the stale variable
// would otherwise stay in force (or, for token lists, stay valid next to the new ones).
func (c *Config) loadFiles() error {
	read := func(name, path string) (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("%s%s: cannot read %s: %w", Prefix, name, path, errors.Unwrap(err))
		}
		return strings.TrimSpace(string(b)), nil
	}
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == '\n' || r == '\r' })
	}
	var errs []error
	one := func(name, path string, set bool, load func(string)) {
		if path == "" {
			return
		}
		if set {
			errs = append(errs, fmt.Errorf("%s%s and %s%s_FILE are both set: keep one (the file, to keep the secret out of the environment)", Prefix, name, Prefix, name))
			return
		}
		v, err := read(name+"_FILE", path)
		if err != nil {
			errs = append(errs, err)
			return
		}
		load(v)
	}
	one("MYSQL_DSN", c.MySQLDSNFile, c.MySQLDSN != "", func(v string) { c.MySQLDSN = v })
	one("GITLAB_TOKEN", c.GitLabTokenFile, c.GitLabToken != "", func(v string) { c.GitLabToken = v })
	one("WEBHOOK_SECRET", c.WebhookSecretFile, c.WebhookSecret != "", func(v string) { c.WebhookSecret = v })
	one("UI_SESSION_KEY", c.UISessionKeyFile, c.UISessionKey != "", func(v string) { c.UISessionKey = v })
	one("EVENTS_SECRET", c.EventsSecretFile, c.EventsSecret != "", func(v string) { c.EventsSecret = v })
	one("API_TOKENS", c.APITokensFile, len(trimList(c.APITokens)) > 0, func(v string) { c.APITokens = split(v) })
	one("ADMIN_TOKENS", c.AdminTokensFile, len(trimList(c.AdminTokens)) > 0, func(v string) { c.AdminTokens = split(v) })
	return errors.Join(errs...)
}

// Need says which groups of settings a subcommand requires.
type Need struct {
	DB     bool // migrate, check-schema, verify, serve
	GitLab bool // serve
	Serve  bool // serve: HTTP, auth, loops
}

// Validate checks the settings a subcommand needs and returns every problem at once,
// each naming its variable. Each group of settings has its own step below.
func (c *Config) Validate(n Need) error {
	var p problems
	if n.DB {
		c.validateDB(&p)
	}
	if c.MySQLMaxConn < 2 {
		p.bad("MYSQL_MAX_CONNS", "must be at least 2, got %d", c.MySQLMaxConn)
	}
	if n.GitLab {
		c.validateGitLab(&p)
	}
	if n.Serve {
		c.validateHTTP(&p)
		c.validateLoops(&p)
		c.validateFailurePolicy(&p)
		c.validateEvents(&p)
		p = append(p, c.validatePrincipals()...)
		c.validateUI(&p)
	}
	c.validateLogging(&p)
	return errors.Join(p...)
}

// problems collects one error per bad variable; bad names it with the prefix.
type problems []error

func (p *problems) bad(name, format string, a ...any) {
	*p = append(*p, fmt.Errorf("%s%s: %s", Prefix, name, fmt.Sprintf(format, a...)))
}

// validateUI: the status page's session key and lifetime.
func (c *Config) validateUI(p *problems) {
	if c.UISessionKey != "" && len(c.UISessionKey) < 32 {
		// The length only: never the key.
		p.bad("UI_SESSION_KEY", "must be at least 32 bytes, got %d (e.g. openssl rand -hex 32)", len(c.UISessionKey))
	}
	if c.UISessionTTL < time.Minute || c.UISessionTTL > 30*24*time.Hour {
		p.bad("UI_SESSION_TTL", "must be between 1m and 720h, got %s", c.UISessionTTL)
	}
}

// validateDB: what every subcommand that opens the database needs.
func (c *Config) validateDB(p *problems) {
	if c.MySQLDSN == "" {
		p.bad("MYSQL_DSN", "is required (or BATCHERD_MYSQL_DSN_FILE), e.g. batcherd:secret@tcp(db:3306)/batcherd")
	}
}

// validateGitLab: what serve needs to reach GitLab.
func (c *Config) validateGitLab(p *problems) {
	if c.GitLabURL == "" {
		p.bad("GITLAB_URL", "is required, e.g. https://gitlab.example.com")
	} else if !strings.HasPrefix(c.GitLabURL, "http://") && !strings.HasPrefix(c.GitLabURL, "https://") {
		p.bad("GITLAB_URL", "must start with http:// or https://")
	}
	if c.GitLabToken == "" {
		p.bad("GITLAB_TOKEN", "is required (or BATCHERD_GITLAB_TOKEN_FILE): a token with api scope")
	}
	if len(c.Repos) == 0 {
		p.bad("REPOS", "is required: comma-separated GitLab project paths, e.g. platform/access-bindings")
	}
	if c.GitLabTimeout <= 0 {
		p.bad("GITLAB_TIMEOUT", "must be positive")
	}
	if c.TargetBranch == "" {
		p.bad("TARGET_BRANCH", "must not be empty")
	}
}

// validateHTTP: the API's listener, authentication and idempotency.
func (c *Config) validateHTTP(p *problems) {
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		p.bad("HTTP_ADDR", "must be host:port or :port, got %q", c.HTTPAddr)
	}
	if len(c.APITokens) == 0 && len(c.AdminTokens) == 0 && !c.OIDCEnabled() && !c.InsecureNoAuth {
		p.bad("API_TOKENS", "no API or admin token is set: set BATCHERD_API_TOKENS and BATCHERD_ADMIN_TOKENS (or BATCHERD_OIDC_ISSUER), or BATCHERD_INSECURE_NO_AUTH=true for development")
	}
	if c.IdempotencyTTL < time.Minute {
		p.bad("IDEMPOTENCY_TTL", "must be at least 1m, got %s", c.IdempotencyTTL)
	}
	if c.ShutdownTimeout <= 0 {
		p.bad("SHUTDOWN_TIMEOUT", "must be positive")
	}
}

// validateLoops: the claim round and the batch life cycle.
func (c *Config) validateLoops(p *problems) {
	if _, err := cron.ParseStandard(c.ClaimSchedule); err != nil {
		p.bad("CLAIM_SCHEDULE", "is not a valid cron spec (%v); e.g. \"@every 30s\" or \"*/1 * * * *\"", err)
	}
	if c.MaxBatchSize < 1 || c.MaxBatchSize > 5000 {
		p.bad("MAX_BATCH_SIZE", "must be between 1 and 5000, got %d", c.MaxBatchSize)
	}
	switch c.MergeMode {
	case "auto", "direct", "manual":
	default:
		p.bad("MERGE_MODE", "must be auto, direct or manual, got %q", c.MergeMode)
	}
	if c.ReconcileInterval < 100*time.Millisecond {
		p.bad("RECONCILE_INTERVAL", "must be at least 100ms, got %s", c.ReconcileInterval)
	}
	if c.DriftInterval < 0 || (c.DriftInterval > 0 && c.DriftInterval < time.Second) {
		p.bad("DRIFT_INTERVAL", "must be 0 (off) or at least 1s, got %s", c.DriftInterval)
	}
	if c.BatchTimeout < time.Second {
		p.bad("BATCH_TIMEOUT", "must be at least 1s, got %s", c.BatchTimeout)
	}
}

// validateFailurePolicy: what a failed batch does.
func (c *Config) validateFailurePolicy(p *problems) {
	if c.MaxAttempts < 1 {
		p.bad("MAX_ATTEMPTS", "must be at least 1, got %d", c.MaxAttempts)
	}
	switch c.OnFailure {
	case "isolate", "block":
	default:
		p.bad("ON_FAILURE", "must be isolate or block, got %q", c.OnFailure)
	}
	if c.InfraRetries < 0 || c.InfraRetries > 10 {
		p.bad("INFRA_RETRIES", "must be between 0 and 10, got %d", c.InfraRetries)
	}
	if c.ConflictRetries < 0 || c.ConflictRetries > 10 {
		p.bad("CONFLICT_RETRIES", "must be between 0 and 10, got %d", c.ConflictRetries)
	}
	if c.FlakeRetries < 0 || c.FlakeRetries > 10 {
		p.bad("FLAKE_RETRIES", "must be between 0 and 10, got %d", c.FlakeRetries)
	}
}

// EventReceivers is BATCHERD_EVENTS_URL parsed (README "Events"); Load refused every
// entry it could not parse, so this is the whole list.
func (c *Config) EventReceivers() []domain.EventReceiver {
	rs, _ := domain.ParseEventReceivers(c.EventsURL)
	return rs
}

// validateEvents: the event receivers and their secret. A bad URL is named by its
// position only: the URL itself may carry credentials.
func (c *Config) validateEvents(p *problems) {
	_, errs := domain.ParseEventReceivers(c.EventsURL)
	for _, err := range errs {
		p.bad("EVENTS_URL", "%s", err)
	}
	if c.EventsTimeout < 100*time.Millisecond || c.EventsTimeout > 5*time.Minute {
		p.bad("EVENTS_TIMEOUT", "must be between 100ms and 5m, got %s", c.EventsTimeout)
	}
	if len(c.EventsURL) > 0 && c.EventsSecret == "" {
		p.bad("EVENTS_SECRET", "is required with BATCHERD_EVENTS_URL (or BATCHERD_EVENTS_SECRET_FILE): receivers verify X-Batcherd-Signature with it")
	}
}

// validateLogging: every subcommand logs.
func (c *Config) validateLogging(p *problems) {
	switch strings.ToLower(c.LogFormat) {
	case "", "text", "json":
	default:
		p.bad("LOG_FORMAT", "must be text or json, got %q", c.LogFormat)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		p.bad("LOG_LEVEL", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
}

// Var describes one environment variable for help output and docs.
type Var struct {
	Name, Default, Desc string
	Secret              bool
}

// Vars lists every variable in declaration order.
func Vars() []Var {
	t := reflect.TypeOf(Config{})
	out := make([]Var, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("env")
		if tag == "" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		def := ""
		if _, d, ok := strings.Cut(opts, "default="); ok {
			def = d
		}
		out = append(out, Var{Name: Prefix + name, Default: def, Desc: f.Tag.Get("desc"), Secret: f.Tag.Get("secret") == "true"})
	}
	return out
}

// Redacted returns the configuration as name=value lines with secrets masked, for a
// start-up log line.
func (c *Config) Redacted() map[string]string {
	out := map[string]string{}
	v := reflect.ValueOf(*c)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
		if name == "" {
			continue
		}
		val := fmt.Sprint(v.Field(i).Interface())
		if f.Tag.Get("secret") == "true" {
			if !v.Field(i).IsZero() {
				val = "<set>"
			} else {
				val = "<unset>"
			}
		}
		out[Prefix+name] = val
	}
	return out
}

func trimList(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
