package domain

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// EventReceiver is one entry of BATCHERD_EVENTS_URL (README "Events"): where events
// are POSTed, and the identity its outbox rows carry.
//
// The identity (ID) is what makes a pending event go to the receiver it was written
// for even when the list is reordered, shortened or differs between replicas during a
// rolling update: it is derived from the entry's name when the operator gave one
// (`name=https://…`), else from the whole URL. Renaming a receiver (or changing an
// unnamed one's URL) gives it a new identity; events pending for the old one stay in
// the outbox, undelivered and counted, until it comes back.
type EventReceiver struct {
	ID    int64  // event_outbox.receiver: ≥ ReceiverIDMin, never a legacy position
	Name  string // the operator's name, or "" for an unnamed entry
	Label string // the metrics label and log name: the name, else the URL's host (never its credentials)
	URL   string // may carry credentials: never logged
}

// ReceiverIDMin is the smallest receiver identity. Rows written before receivers had
// identities carry their position in the list (0–99); identities are kept far above
// that, so the two can never be confused.
const ReceiverIDMin = int64(1) << 62

// MaxEventReceivers bounds BATCHERD_EVENTS_URL.
const MaxEventReceivers = 100

var receiverName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ReceiverID is the identity of a named receiver (name != "") or an unnamed one (its
// URL): 62 bits of SHA-256, offset to ReceiverIDMin. Stored in the database only; a
// metric or a log names a receiver by its Label.
func ReceiverID(name, rawURL string) int64 {
	key := "url:" + rawURL
	if name != "" {
		key = "name:" + name
	}
	sum := sha256.Sum256([]byte("batcherd event receiver\x00" + key))
	return ReceiverIDMin | int64(binary.BigEndian.Uint64(sum[:8])>>2)
}

// ParseEventReceivers parses the entries of BATCHERD_EVENTS_URL: each a URL or
// name=URL. Errors name an entry by its position only: the URL may carry credentials.
func ParseEventReceivers(entries []string) ([]EventReceiver, []error) {
	var out []EventReceiver
	var errs []error
	seen := map[int64]int{}
	labels := map[string]int{}
	if len(entries) > MaxEventReceivers {
		errs = append(errs, fmt.Errorf("at most %d receivers, got %d", MaxEventReceivers, len(entries)))
	}
	for i, entry := range entries {
		name, raw, named := splitReceiverEntry(entry)
		if named && !receiverName.MatchString(name) {
			errs = append(errs, fmt.Errorf("entry %d: receiver name must be 1-63 of a-z 0-9 _ . - starting with a letter or digit", i+1))
			continue
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("entry %d is not an http(s) URL with a host (or name=URL)", i+1))
			continue
		}
		r := EventReceiver{ID: ReceiverID(name, raw), Name: name, URL: raw, Label: name}
		if j, dup := seen[r.ID]; dup {
			errs = append(errs, fmt.Errorf("entries %d and %d are the same receiver (same name, or same URL without a name): give them distinct names", j+1, i+1))
			continue
		}
		seen[r.ID] = i
		if r.Label == "" {
			r.Label = u.Host
		}
		labels[r.Label]++
		if n := labels[r.Label]; n > 1 {
			r.Label = fmt.Sprintf("%s#%d", r.Label, n)
		}
		out = append(out, r)
	}
	return out, errs
}

// splitReceiverEntry splits "name=URL" into its name and URL; an entry that starts
// with its URL (no '=' before "://") has no name. A URL's own '=' (in a query) comes
// after "://", so it never reads as a name.
func splitReceiverEntry(entry string) (name, raw string, named bool) {
	eq := strings.IndexByte(entry, '=')
	sep := strings.Index(entry, "://")
	if eq < 0 || (sep >= 0 && eq > sep) {
		return "", entry, false
	}
	return strings.TrimSpace(entry[:eq]), strings.TrimSpace(entry[eq+1:]), true
}
