package api

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/batcherd/batcherd/internal/wire"
)

// The OpenAPI document is kept in step with the code: every registered route is
// documented and every documented route is registered, and the documented objects
// have exactly the fields the handlers render.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	raw, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI    string                               `yaml:"openapi"`
		Paths      map[string]map[string]map[string]any `yaml:"paths"`
		Components struct {
			Schemas map[string]struct {
				Required   []string       `yaml:"required"`
				Properties map[string]any `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}

	s := &Server{}
	var code, documented []string
	for _, rt := range s.routeTable() {
		code = append(code, rt.method+" "+rt.path)
	}
	for path, ops := range doc.Paths {
		for method := range ops {
			switch method {
			case "get", "post", "put", "patch", "delete":
				documented = append(documented, strings.ToUpper(method)+" "+path)
			}
		}
	}
	sort.Strings(code)
	sort.Strings(documented)
	if !reflect.DeepEqual(code, documented) {
		t.Fatalf("routes and api/openapi.yaml differ:\ncode:       %v\ndocumented: %v", code, documented)
	}

	for name, typ := range map[string]reflect.Type{
		"Operation": reflect.TypeFor[wire.Operation](),
		"Binding":   reflect.TypeFor[wire.Binding](),
		"Batch":     reflect.TypeFor[wire.Batch](),
		"Event":     reflect.TypeFor[wire.Event](),
		"Repo":      reflect.TypeFor[wire.Repo](),
	} {
		var fields []string
		for f := range typ.Fields() {
			fields = append(fields, strings.Split(f.Tag.Get("json"), ",")[0])
		}
		sch, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("schema %s missing", name)
			continue
		}
		var props []string
		for p := range sch.Properties {
			props = append(props, p)
		}
		req := append([]string(nil), sch.Required...)
		sort.Strings(fields)
		sort.Strings(props)
		sort.Strings(req)
		if !reflect.DeepEqual(fields, props) || !reflect.DeepEqual(fields, req) {
			t.Errorf("schema %s: code renders %v, document has properties %v, required %v", name, fields, props, req)
		}
	}

	// The documented request fields are the ones the decoder accepts.
	var reqFields []string
	for f := range reflect.TypeFor[createRequest]().Fields() {
		reqFields = append(reqFields, strings.Split(f.Tag.Get("json"), ",")[0])
	}
	var props []string
	for p := range doc.Components.Schemas["CreateOperationRequest"].Properties {
		props = append(props, p)
	}
	sort.Strings(reqFields)
	sort.Strings(props)
	if !reflect.DeepEqual(reqFields, props) {
		t.Errorf("CreateOperationRequest: decoder accepts %v, document lists %v", reqFields, props)
	}
}
