package mr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"go.yaml.in/yaml/v3"
)

// bindingDoc is the YAML document of one binding file (README, "Files written to the repository"). Field order is
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

// BindingYAMLWithAttributes is BindingYAML plus the operation's attributes, a JSON
// object as the API stored it (omitted when empty or null). Numbers are written as
// sent, so a reader gets the number the caller sent: decoding into float64 first
// turned a ticket id 1234567 into 1.234567e+06 and 2^53+1 into 2^53. It fails for
// attributes that are not a JSON object.
func BindingYAMLWithAttributes(subject, target, operationID string, expiresAt *time.Time, attributes json.RawMessage) (string, error) {
	doc := bindingDocAttrs{bindingDoc: bindingDoc{Subject: subject, Target: target, OperationID: operationID}}
	if expiresAt != nil {
		doc.ExpiresAt = expiresAt.UTC().Format(time.RFC3339)
	}
	if t := bytes.TrimSpace(attributes); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		dec := json.NewDecoder(bytes.NewReader(t))
		dec.UseNumber()
		var attrs map[string]any
		if err := dec.Decode(&attrs); err != nil {
			return "", fmt.Errorf("mr: attributes are not a JSON object: %w", err)
		}
		yamlValues(attrs) // in place
		doc.Attributes = attrs
	}
	out, err := marshalYAML(doc)
	if err != nil {
		return "", err
	}
	return fileHeader + out, nil
}

// CheckAttributeNumber is domain.CheckAttributeNumber (forwarding name; use domain's).
var CheckAttributeNumber = domain.CheckAttributeNumber

// yamlValues replaces the json.Numbers in a decoded JSON value with YAML scalars.
func yamlValues(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = yamlValues(e)
		}
	case []any:
		for i, e := range x {
			x[i] = yamlValues(e)
		}
	case json.Number:
		return numberNode(string(x))
	}
	return v
}

// numberNode writes a JSON number as a plain YAML scalar that YAML 1.2 and 1.1
// readers (PyYAML, Ruby) both read as that number: integers as sent; other numbers
// with their digits as sent, but with a decimal point and a signed exponent, because
// YAML 1.1 reads "1e5" or "1.5e3" as strings.
func numberNode(n string) *yaml.Node {
	if domain.IsJSONInteger(n) {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: n}
	}
	mant, exp, hasExp := strings.Cut(strings.ToLower(n), "e")
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	if hasExp {
		if exp[0] != '+' && exp[0] != '-' {
			exp = "+" + exp
		}
		mant += "e" + exp
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: mant}
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
