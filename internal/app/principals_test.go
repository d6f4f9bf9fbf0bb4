package app_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/batcherd/batcherd/internal/auth"
	"github.com/batcherd/batcherd/internal/auth/authtest"
	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/mr/gitlabsim"
	"github.com/batcherd/batcherd/internal/store/storetest"
)

// A replica configured through BATCHERD_* accepts its issuer's tokens, records who
// applied (auto-approved: approved_by auto), and an operator's settle names the
// operator as the actor of the members' events.
func TestServePrincipalsEndToEnd(t *testing.T) {
	_, dsn := storetest.New(t)
	repo := "platform/access"
	sim := gitlabsim.New(gitlabsim.Options{Projects: []string{repo}, PipelineDuration: time.Hour})
	if err := sim.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	iss := authtest.NewIssuer(t, "batcherd-app")
	cfg, err := config.Load(context.Background(), envconfig.MapLookuper(map[string]string{
		"BATCHERD_MYSQL_DSN": dsn, "BATCHERD_GITLAB_URL": sim.URL(), "BATCHERD_GITLAB_TOKEN": "sim-token",
		"BATCHERD_REPOS": repo, "BATCHERD_HTTP_ADDR": "127.0.0.1:0",
		"BATCHERD_API_TOKENS": "requests=" + apiToken, "BATCHERD_ADMIN_TOKENS": adminToken,
		"BATCHERD_OIDC_ISSUER": iss.URL, "BATCHERD_OIDC_AUDIENCE": "batcherd-app",
		"BATCHERD_OIDC_USERNAME_CLAIM": "nickname", "BATCHERD_OIDC_GROUPS_CLAIM": "groups_direct",
		"BATCHERD_OIDC_ADMIN_GROUPS": "platform/admins",
		"BATCHERD_AUTO_APPROVE":      "true", "BATCHERD_MERGE_MODE": "manual",
		"BATCHERD_CLAIM_SCHEDULE": "@every 1s", "BATCHERD_RECONCILE_INTERVAL": "200ms", "BATCHERD_SHUTDOWN_TIMEOUT": "5s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(config.Need{DB: true, GitLab: true, Serve: true}); err != nil {
		t.Fatal(err)
	}
	a, stop := startApp(t, cfg)
	defer stop()
	base := "http://" + a.Addr()
	// The replica keeps the tokens only as digests (internal/auth): its configuration
	// no longer holds them.
	if cfg.APITokens != nil || cfg.AdminTokens != nil {
		t.Fatal("the configuration still holds the tokens after start")
	}

	claims := iss.Claims("4711")
	claims["nickname"] = "erin"
	oidcToken := iss.Token(claims)
	var created struct {
		Operation struct {
			ID          string  `json:"id"`
			RequestedBy *string `json:"requested_by"`
			ApprovedBy  *string `json:"approved_by"`
			BatchID     *int64  `json:"batch_id"`
			MRURL       *string `json:"mr_url"`
		} `json:"operation"`
	}
	if code := call(t, "POST", base+"/v1/operations", oidcToken, map[string]any{"subject": "u1", "target": "db/prod", "action": "grant"}, &created); code != 201 {
		t.Fatalf("create with an OIDC token: %d", code)
	}
	op := created.Operation
	if op.RequestedBy == nil || *op.RequestedBy != "erin" || op.ApprovedBy == nil || *op.ApprovedBy != "auto" {
		t.Fatalf("created: %+v", op)
	}
	// Not an admin: no admin group.
	if code := call(t, "POST", base+"/v1/admin/rounds", oidcToken, map[string]any{}, nil); code != 403 {
		t.Fatalf("admin route with a non-admin OIDC token: %d", code)
	}

	// Wait for the MR, then settle as the operator.
	deadline := time.Now().Add(30 * time.Second)
	for created.Operation.MRURL == nil {
		if time.Now().After(deadline) {
			t.Fatal("the operation's batch never got an MR")
		}
		time.Sleep(100 * time.Millisecond)
		call(t, "GET", base+"/v1/operations/"+op.ID, apiToken, nil, &created)
	}
	id := strconv.FormatInt(*created.Operation.BatchID, 10)
	if code := call(t, "POST", base+"/v1/admin/batches/"+id+"/settle", adminToken, nil, nil); code != 200 {
		t.Fatalf("settle: %d", code)
	}
	var evs struct {
		Events []struct {
			Code  string  `json:"code"`
			Actor *string `json:"actor"`
		} `json:"events"`
	}
	call(t, "GET", base+"/v1/operations/"+op.ID+"/events", apiToken, nil, &evs)
	var got []string
	for _, e := range evs.Events {
		a := "-"
		if e.Actor != nil {
			a = *e.Actor
		}
		got = append(got, e.Code+":"+a)
	}
	joined := strings.Join(got, ",")
	t.Logf("events: %s", joined)
	admin := auth.BareName(adminToken)
	if !strings.HasPrefix(joined, "created:erin,admitted:auto,claimed:-") || !strings.Contains(joined, ":"+admin) {
		t.Fatalf("events %s: want created by erin, admitted by auto, and the settle by %s", joined, admin)
	}
}
