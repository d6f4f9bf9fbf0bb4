package app

import (
	"fmt"
	"strings"
)

// SchemaError is a schema batcherd refuses to run on: migrations not applied, or drift
// (a constraint an invariant rests on is missing or wrong). Its message is meant for a
// terminal: the fix first, then one short line per problem. It is ErrSchemaDrift for
// errors.Is (exit 3).
type SchemaError struct {
	Database string
	// Pending lists the migrations not applied, oldest first.
	Pending []string
	// Problems lists what the schema check found, one per constraint.
	Problems []string
}

func (e *SchemaError) Unwrap() error { return ErrSchemaDrift }

// Lines returns the message line by line: the fix, then the problems.
func (e *SchemaError) Lines() []string {
	if len(e.Pending) > 0 {
		lines := []string{fmt.Sprintf("run 'batcherd migrate' (with this BATCHERD_MYSQL_DSN): database %q is not migrated", e.Database)}
		for _, m := range e.Pending {
			lines = append(lines, "migration "+m+" is not applied")
		}
		// What those migrations create is what the check misses: listing it would bury
		// the fix under a screen of consequences.
		if len(e.Problems) > 0 {
			lines = append(lines, fmt.Sprintf("(%d schema problems follow from these; run 'batcherd check-schema' after migrating)", len(e.Problems)))
		}
		return lines
	}
	lines := []string{fmt.Sprintf("run 'batcherd migrate'; if the problems stay, follow the README's runbook on schema drift: schema drift in database %q", e.Database)}
	return append(lines, e.Problems...)
}

func (e *SchemaError) Error() string { return strings.Join(e.Lines(), "\n  ") }
