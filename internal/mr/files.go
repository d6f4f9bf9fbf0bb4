package mr

import (
	"fmt"
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

// bindingDocAttrs is bindingDoc with the operation's free-form attributes.
type bindingDocAttrs struct {
	bindingDoc `yaml:",inline"`
	Attributes map[string]any `yaml:"attributes,omitempty"`
}

// BindingYAMLWithAttributes is BindingYAML plus the operation's attributes (omitted
// when empty). It fails only for values YAML cannot represent.
func BindingYAMLWithAttributes(subject, target, operationID string, expiresAt *time.Time, attributes map[string]any) (string, error) {
	doc := bindingDocAttrs{bindingDoc: bindingDoc{Subject: subject, Target: target, OperationID: operationID}, Attributes: attributes}
	if expiresAt != nil {
		doc.ExpiresAt = expiresAt.UTC().Format(time.RFC3339)
	}
	out, err := marshalYAML(doc)
	if err != nil {
		return "", err
	}
	return fileHeader + out, nil
}

// fileHeader tells a reader of the repository where the file comes from.
const fileHeader = "# Managed by batcherd. Changes are made through its API, not by hand.\n"

// marshalYAML turns yaml.v3's panics on unsupported values (funcs, channels) into
// errors.
func marshalYAML(v any) (s string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("mr: rendering YAML: %v", r)
		}
	}()
	out, err := yaml.Marshal(v)
	return string(out), err
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
	return fileHeader + string(out)
}
