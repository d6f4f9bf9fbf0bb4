package scanner

import (
	"encoding/json"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/batcherd/batcherd/internal/store"
)

// bindingYAML renders a grant's binding file (DESIGN §5: at least subject, target,
// operation_id, and expires_at when set).
//
// TODO(scanner): switch to mr.BindingYAML once the GitLab layer exports it, so the
// file format lives next to BindingPath.
func bindingYAML(op store.Operation) (string, error) {
	type file struct {
		Subject     string         `yaml:"subject"`
		Target      string         `yaml:"target"`
		OperationID string         `yaml:"operation_id"`
		ExpiresAt   string         `yaml:"expires_at,omitempty"`
		Attributes  map[string]any `yaml:"attributes,omitempty"`
	}
	f := file{Subject: op.Subject, Target: op.Target, OperationID: op.OperationID}
	if op.ExpiresAt != nil {
		f.ExpiresAt = op.ExpiresAt.UTC().Format(time.RFC3339)
	}
	if len(op.Attributes) > 0 && string(op.Attributes) != "null" {
		if err := json.Unmarshal(op.Attributes, &f.Attributes); err != nil {
			return "", err
		}
	}
	out, err := yaml.Marshal(f)
	return string(out), err
}
