package store

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ErrInvalidDSN marks a DSN batcherd cannot use (a configuration error: the binary exits
// 2). Its messages never quote the DSN nor any part of it: go-sql-driver's parse errors
// can (a password holding a '/' ends up as the "network" or the database name in them),
// and a DSN that does not parse has no password field one could mask reliably.
var ErrInvalidDSN = errors.New("BATCHERD_MYSQL_DSN is not a usable go-sql-driver DSN")

// dsnShape is the form the messages ask for.
const dsnShape = "want user:password@tcp(host:3306)/database"

// CheckDSN says why dsn cannot be used, or nil. It connects to nothing.
func CheckDSN(dsn string) error {
	_, err := ParseDSN(dsn, Options{})
	return err
}

// parseDSN is mysql.ParseDSN plus what batcherd needs of the result (a database name,
// a real network), with errors in our own words.
func parseDSN(dsn string) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, invalidDSN(dsnParseReason(err))
	}
	switch cfg.Net {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		// Only a network registered with mysql.RegisterDialContext parses here; batcherd
		// registers none.
		return nil, invalidDSN("the address after '@' must be tcp(host:port) or unix(/path/to/socket)")
	}
	if cfg.DBName == "" {
		return nil, invalidDSN("it names no database: end it with /<database>, e.g. @tcp(db:3306)/batcherd")
	}
	return cfg, nil
}

func invalidDSN(reason string) error {
	return fmt.Errorf("%w: %s; %s (the value is not shown: it holds the password)", ErrInvalidDSN, reason, dsnShape)
}

// dsnParseReason turns a go-sql-driver parse error into a reason that quotes nothing
// of the DSN (the driver's own text may, so it is never passed on).
func dsnParseReason(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "missing the slash"):
		return "no '/' before the database name"
	case strings.Contains(msg, "network address not terminated"):
		return "the address after tcp( has no closing ')'"
	case strings.Contains(msg, "forget to escape"):
		return "a '(' or ')' out of place: the address is written tcp(host:port), and a password holding parentheses cannot be used here"
	case strings.HasPrefix(msg, "default addr for network"):
		return "the address after '@' must be tcp(host:port) or unix(/path/to/socket) (a URL such as mysql://… is not a DSN)"
	case strings.HasPrefix(msg, "invalid dbname"):
		return "the database name holds an invalid %-escape"
	}
	return "a parameter after '?' is invalid, or the DSN is not of the form user:password@tcp(host:port)/database"
}
