// Package deps pins the project's chosen dependencies while packages are being written
// in parallel, so go.mod/go.sum stay stable. Remove once every dependency is imported
// by real code.
package deps

import (
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/google/uuid"
	_ "github.com/jmoiron/sqlx"
	_ "github.com/lmittmann/tint"
	_ "github.com/pressly/goose/v3"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/prometheus/client_golang/prometheus/testutil"
	_ "github.com/robfig/cron/v3"
	_ "github.com/sethvargo/go-envconfig"
	_ "gitlab.com/gitlab-org/api/client-go"
	_ "gopkg.in/yaml.v3"
)
