package app

import (
	"errors"
	"fmt"

	"github.com/batcherd/batcherd/internal/config"
	"github.com/batcherd/batcherd/internal/store"
)

// ValidateConfig is config.Validate plus what only the store can judge (the DSN's
// shape, without connecting): every configuration problem of a subcommand at once, each
// naming its variable, so that the binary exits 2 with all of them before it touches
// the database.
func ValidateConfig(cfg *config.Config, n config.Need) error {
	errs := []error{cfg.Validate(n)}
	if n.DB && cfg.MySQLDSN != "" {
		if err := store.CheckDSN(cfg.MySQLDSN); err != nil {
			if cfg.MySQLDSNFile != "" {
				err = fmt.Errorf("%w (read from BATCHERD_MYSQL_DSN_FILE)", err)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
