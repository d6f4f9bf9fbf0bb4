package store_test

import (
	"errors"
	"testing"

	"github.com/batcherd/batcherd/internal/store"
)

// CheckDSN accepts the DSNs batcherd is run with and refuses, as ErrInvalidDSN, the ones
// it cannot use; the binary's tests (cmd/batcherd) check that no refusal shows the
// password, for many malformed shapes.
func TestCheckDSN(t *testing.T) {
	for _, dsn := range []string{
		"batcherd:secret@tcp(db:3306)/batcherd",
		"batcherd:se/cr)et@tcp(db:3306)/batcherd", // '/' and ')' in a password are fine before /db
		"batcherd:secret@tcp(db:3306)/batcherd?tls=true&timeout=3s",
		"batcherd@unix(/run/mysqld/mysqld.sock)/batcherd",
		"batcherd:secret@tcp([::1]:3306)/batcherd",
	} {
		if err := store.CheckDSN(dsn); err != nil {
			t.Errorf("CheckDSN(%q) = %v, want nil", dsn, err)
		}
	}
	for _, dsn := range []string{
		"",
		"batcherd:secret@tcp(db:3306)/",
		"batcherd:secret@tcp(db:3306)",
		"batcherd:secret@db:3306/batcherd",
		"batcherd:secret@tcp(db:3306)/batcherd?parseTime=maybe",
	} {
		if err := store.CheckDSN(dsn); !errors.Is(err, store.ErrInvalidDSN) {
			t.Errorf("CheckDSN(%q) = %v, want ErrInvalidDSN", dsn, err)
		}
	}
}
