// Package sql embeds batcherd's versioned schema migrations (goose format) so the
// binary can apply them with `batcherd migrate` without any file on disk.
package sql

import "embed"

// Migrations holds migrations/*.sql, applied in file-name order by goose.
//
//go:embed migrations/*.sql
var Migrations embed.FS
