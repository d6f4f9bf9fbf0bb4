package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"

	"github.com/batcherd/batcherd/internal/domain"
)

// ErrNoInstallation: the installation row is missing (the database was migrated by a
// binary older than schema v5, or by hand): run `batcherd migrate`.
var ErrNoInstallation = errors.New("the installation id is missing (run 'batcherd migrate')")

// installationCache keeps the id once read: it never changes (README,
// "Installation identity"), so one read per process is enough.
type installationCache struct {
	mu sync.Mutex
	id string
}

// NewInstallationID returns a random installation id: 10 lower-case letters and
// digits from crypto/rand (about 51 bits, so two installations practically never share
// one).
func NewInstallationID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("store: crypto/rand failed: " + err.Error())
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// ensureInstallation writes the installation row if there is none. INSERT IGNORE on
// the singleton key: the first migrate's id stays for ever, whoever runs migrate later
// (or several at once).
func (s *Store) ensureInstallation(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx,
		"INSERT IGNORE INTO installation (singleton, installation_id) VALUES (1, ?)", NewInstallationID())
	return translate(err)
}

// Installation returns this installation's id (read once, then cached). It fails with
// ErrNoInstallation when the row is missing or holds something that is not an id.
func (s *Store) Installation(ctx context.Context) (string, error) {
	s.inst.mu.Lock()
	defer s.inst.mu.Unlock()
	if s.inst.id != "" {
		return s.inst.id, nil
	}
	var id string
	err := s.db.GetContext(ctx, &id, "SELECT installation_id FROM installation WHERE singleton = 1")
	if err != nil {
		err = translate(err)
		if errors.Is(err, ErrNotFound) {
			return "", ErrNoInstallation
		}
		return "", err
	}
	if !domain.ValidInstallationID(id) {
		return "", fmt.Errorf("%w: the stored id %q is not 8-12 lower-case letters and digits", ErrNoInstallation, id)
	}
	s.inst.id = id
	return id, nil
}

// checkInstallation adds the installation row to the schema check: a database without
// it cannot name its branches.
func (s *Store) checkInstallation(ctx context.Context, rep *SchemaReport) error {
	var n int
	if err := s.db.GetContext(ctx, &n,
		`SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'installation'`); err != nil {
		return translate(err)
	}
	if n == 0 {
		rep.problem("table installation is missing (schema v5, installation identity: run batcherd migrate)")
		return nil
	}
	if _, err := s.Installation(ctx); err != nil {
		if errors.Is(err, ErrNoInstallation) {
			rep.problem("table installation: %v", err)
			return nil
		}
		return err
	}
	rep.Checked = append(rep.Checked, "installation id present")
	return nil
}
