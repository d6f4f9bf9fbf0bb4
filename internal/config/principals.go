package config

import (
	"fmt"
	"net"
	"net/url"
	"strings"

	"github.com/batcherd/batcherd/internal/auth"
)

// TokenLists returns the configured token lists, each named by the variable it was
// read from (the _FILE when it came from a file), for auth.ParseTokens.
func (c *Config) TokenLists() []auth.TokenList {
	name := func(v, file string) string {
		if file != "" {
			return Prefix + v + "_FILE"
		}
		return Prefix + v
	}
	return []auth.TokenList{
		{Var: name("API_TOKENS", c.APITokensFile), Entries: c.APITokens},
		{Var: name("ADMIN_TOKENS", c.AdminTokensFile), Entries: c.AdminTokens, Admin: true},
	}
}

// OIDCEnabled reports whether bearer JWTs of an OIDC issuer are accepted.
func (c *Config) OIDCEnabled() bool { return c.OIDCIssuer != "" }

// validatePrincipals checks the token lists (names, duplicates: every message names a
// variable and an entry, never a token) and the OIDC settings.
func (c *Config) validatePrincipals() []error {
	var errs []error
	if _, err := auth.ParseTokens(c.TokenLists()...); err != nil {
		errs = append(errs, err)
	}
	if c.OIDCIssuer == "" {
		if c.OIDCAudience != "" || len(c.OIDCAdminGroups) > 0 {
			errs = append(errs, fmt.Errorf("%sOIDC_AUDIENCE/%sOIDC_ADMIN_GROUPS are set without %sOIDC_ISSUER", Prefix, Prefix, Prefix))
		}
		return errs
	}
	u, err := url.Parse(c.OIDCIssuer)
	switch {
	case err != nil || u.Host == "" || u.RawQuery != "" || u.Fragment != "":
		errs = append(errs, fmt.Errorf("%sOIDC_ISSUER: must be the issuer's URL, e.g. https://gitlab.example.com", Prefix))
	case u.Scheme != "https" && !(u.Scheme == "http" && loopback(u.Hostname())):
		errs = append(errs, fmt.Errorf("%sOIDC_ISSUER: must start with https:// (http:// only for a loopback address)", Prefix))
	}
	if c.OIDCAudience == "" {
		errs = append(errs, fmt.Errorf("%sOIDC_AUDIENCE: is required with %sOIDC_ISSUER: the aud tokens must carry (for GitLab, the OAuth application's id)", Prefix, Prefix))
	}
	if strings.TrimSpace(c.OIDCUsernameClaim) == "" {
		errs = append(errs, fmt.Errorf("%sOIDC_USERNAME_CLAIM: must not be empty", Prefix))
	}
	if strings.TrimSpace(c.OIDCGroupsClaim) == "" {
		errs = append(errs, fmt.Errorf("%sOIDC_GROUPS_CLAIM: must not be empty", Prefix))
	}
	return errs
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ForgetTokens drops the configuration's copies of the API and admin tokens once
// internal/auth holds their digests, so the replica keeps no token in the clear. The
// lists read as set (<set>) no more afterwards: log the configuration before.
func (c *Config) ForgetTokens() {
	clear(c.APITokens)
	clear(c.AdminTokens)
	c.APITokens, c.AdminTokens = nil, nil
}
