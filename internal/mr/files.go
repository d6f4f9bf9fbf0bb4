package mr

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/batcherd/batcherd/internal/domain"
	"go.yaml.in/yaml/v3"
)

// The binding file is written node by node, not marshalled from a struct, so that
// every string — values and attribute keys alike — is double-quoted. yaml.v3 quotes
// only what YAML 1.2 would read as something else; YAML 1.1 readers (PyYAML, Ruby) read
// "=" as a value tag (safe_load fails), "<<" as a merge key, "yes"/"on"/"off" as
// booleans, "1_000" and "1:20" as numbers, and a plain RFC 3339 time as a timestamp. A
// double-quoted string is a string to every reader (PyYAML safe_load, yaml.v3,
// js-yaml), exactly as sent. The document's own keys are fixed identifiers, plain.

// BindingYAMLWithAttributes is BindingYAML plus the operation's attributes, a JSON
// object as the API stored it (omitted when empty or null). Numbers are written as
// sent, so a reader gets the number the caller sent: decoding into float64 first
// turned a ticket id 1234567 into 1.234567e+06 and 2^53+1 into 2^53. It fails for
// attributes that are not a JSON object.
func BindingYAMLWithAttributes(subject, target, operationID string, expiresAt *time.Time, attributes json.RawMessage) (string, error) {
	doc := bindingNode(subject, target, operationID, expiresAt)
	if t := bytes.TrimSpace(attributes); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		dec := json.NewDecoder(bytes.NewReader(t))
		dec.UseNumber()
		var attrs map[string]any
		if err := dec.Decode(&attrs); err != nil {
			return "", fmt.Errorf("mr: attributes are not a JSON object: %w", err)
		}
		if len(attrs) > 0 {
			n, err := valueNode(attrs)
			if err != nil {
				return "", err
			}
			doc.Content = append(doc.Content, plainKey("attributes"), n)
		}
	}
	out, err := marshalYAML(doc)
	if err != nil {
		return "", err
	}
	return fileHeader + out, nil
}

// bindingNode is the mapping of a binding file without attributes.
func bindingNode(subject, target, operationID string, expiresAt *time.Time) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	m.Content = append(m.Content,
		plainKey("subject"), quoted(subject),
		plainKey("target"), quoted(target),
		plainKey("operation_id"), quoted(operationID))
	if expiresAt != nil {
		m.Content = append(m.Content, plainKey("expires_at"), quoted(expiresAt.UTC().Format(time.RFC3339)))
	}
	return m
}

func plainKey(k string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k} }

// quoted is a string every YAML reader reads back as that string.
func quoted(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s, Style: yaml.DoubleQuotedStyle}
}

// valueNode turns a JSON value decoded with UseNumber into YAML nodes: strings (and
// object keys, sorted) double-quoted, numbers as numberNode writes them, true, false
// and null plain.
func valueNode(v any) (*yaml.Node, error) {
	switch x := v.(type) {
	case map[string]any:
		m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			n, err := valueNode(x[k])
			if err != nil {
				return nil, err
			}
			m.Content = append(m.Content, quoted(k), n)
		}
		return m, nil
	case []any:
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, e := range x {
			n, err := valueNode(e)
			if err != nil {
				return nil, err
			}
			seq.Content = append(seq.Content, n)
		}
		return seq, nil
	case string:
		return quoted(x), nil
	case json.Number:
		return numberNode(string(x)), nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(x)}, nil
	case nil:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
	return nil, fmt.Errorf("mr: attributes hold a %T, which JSON does not make", v)
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
// and, when set, expires_at (RFC 3339, UTC), every value double-quoted.
func BindingYAML(subject, target, operationID string, expiresAt *time.Time) string {
	out, err := marshalYAML(bindingNode(subject, target, operationID, expiresAt))
	if err != nil {
		// Marshalling a mapping of strings cannot fail; a panic here is a programming
		// error, not a runtime condition.
		panic("mr: rendering binding YAML: " + err.Error())
	}
	return fileHeader + out
}
