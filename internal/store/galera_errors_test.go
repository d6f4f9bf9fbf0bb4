package store

// The answers a Galera cluster gives, read on purpose by the one translation place
// (codes measured on a Galera cluster; the cluster itself is exercised by `make ha`).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/go-sql-driver/mysql"
)

func TestTranslateClusterAnswers(t *testing.T) {
	ctx := context.Background()
	myErr := func(n uint16) error { return fmt.Errorf("exec: %w", &mysql.MySQLError{Number: n, Message: "m"}) }
	for _, c := range []struct {
		name  string
		got   error
		is    []error
		isNot []error
	}{
		{"certification failure at a statement", translate(myErr(1213)), []error{ErrLostRace, ErrTxAborted}, []error{ErrNotPrimary, ErrCommitUnknown}},
		{"a lock wait timeout is no abort", translate(myErr(1205)), []error{ErrLostRace}, []error{ErrTxAborted}},
		{"a guard that lost is no abort", translate(ErrLostRace), []error{ErrLostRace}, []error{ErrTxAborted}},
		{"certification failure at COMMIT", commitError(ctx, myErr(1213)), []error{ErrLostRace}, []error{ErrCommitUnknown}},
		{"node not in the primary component", translate(myErr(1047)), []error{ErrNotPrimary}, []error{ErrLostRace, ErrUnavailable}},
		{"a read-only server (a fenced former primary)", translate(myErr(1290)), []error{ErrNotPrimary}, []error{ErrLostRace}},
		{"a pooled connection still inside a transaction", translate(myErr(1568)), []error{ErrUnavailable}, []error{ErrNotPrimary}},
		{"1180 at a statement", translate(myErr(1180)), []error{ErrNotPrimary}, []error{ErrCommitUnknown}},
		{"1180 at COMMIT: the others may have certified it", commitError(ctx, myErr(1180)), []error{ErrCommitUnknown, ErrNotPrimary}, nil},
		{"connection lost at COMMIT", commitError(ctx, mysql.ErrInvalidConn), []error{ErrCommitUnknown}, []error{ErrUnavailable}},
		{"connection lost at COMMIT (EOF)", commitError(ctx, io.ErrUnexpectedEOF), []error{ErrCommitUnknown}, nil},
		{"connection lost before COMMIT", translate(fmt.Errorf("exec: %w", mysql.ErrInvalidConn)), []error{ErrUnavailable, mysql.ErrInvalidConn}, []error{ErrCommitUnknown}},
		{"translate is idempotent", translate(translate(myErr(1047))), []error{ErrNotPrimary}, nil},
		{"a cancelled context stays itself", translate(context.Canceled), []error{context.Canceled}, []error{ErrUnavailable}},
	} {
		for _, want := range c.is {
			if !errors.Is(c.got, want) {
				t.Errorf("%s: %v is not %v", c.name, c.got, want)
			}
		}
		for _, not := range c.isNot {
			if errors.Is(c.got, not) {
				t.Errorf("%s: %v must not be %v", c.name, c.got, not)
			}
		}
	}
}

func TestWsrepReady(t *testing.T) {
	for _, c := range []struct {
		st map[string]string
		ok bool
	}{
		{map[string]string{"wsrep_on": "ON", "wsrep_ready": "ON", "wsrep_cluster_status": "Primary"}, true},
		{map[string]string{"wsrep_on": "ON", "wsrep_ready": "OFF", "wsrep_cluster_status": "non-Primary"}, false},
		{map[string]string{"wsrep_on": "ON", "wsrep_ready": "ON", "wsrep_cluster_status": "non-Primary"}, false},
		{map[string]string{"wsrep_on": "ON", "wsrep_ready": "OFF", "wsrep_cluster_status": "Primary"}, false},
	} {
		err := wsrepReady(c.st)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrNotPrimary)) {
			t.Errorf("wsrepReady(%v) = %v, want ok=%v", c.st, err, c.ok)
		}
	}
}
