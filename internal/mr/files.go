package mr

import (
	"net/url"
	"time"

	"gopkg.in/yaml.v3"
)

func pathEscape(s string) string { return url.PathEscape(s) }

// bindingDoc is the YAML document of one binding file (DESIGN §5). Field order is
// the order in the file.
type bindingDoc struct {
	Subject     string `yaml:"subject"`
	Target      string `yaml:"target"`
	OperationID string `yaml:"operation_id"`
	ExpiresAt   string `yaml:"expires_at,omitempty"`
}

// BindingYAML renders the content of a binding's file: subject, target, operation_id
// and, when set, expires_at (RFC 3339, UTC). yaml.v3 quotes every value that would
// otherwise read as another type or break the document ("yes", "123", ": ", "#",
// leading spaces, newlines), so subjects and targets round-trip exactly.
func BindingYAML(subject, target, operationID string, expiresAt *time.Time) string {
	doc := bindingDoc{Subject: subject, Target: target, OperationID: operationID}
	if expiresAt != nil {
		doc.ExpiresAt = expiresAt.UTC().Format(time.RFC3339)
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		// Marshalling a struct of strings cannot fail; a panic here is a programming
		// error, not a runtime condition.
		panic("mr: rendering binding YAML: " + err.Error())
	}
	return "# Managed by batcherd. Changes are made through its API, not by hand.\n" + string(out)
}
