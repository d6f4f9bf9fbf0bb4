package api

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// api/openapi.yaml is valid OpenAPI 3 as an independent implementation reads it
// (kin-openapi, the library behind the validator `make test` runs): a description with
// an unquoted comma inside {…} is an extra field of its object there, where yaml.v3
// into loose maps (the other tests here) reads it without a word. Failing here, in the
// package whose routes the document describes, catches it before the suite does.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background(), openapi3.EnableExamplesValidation()); err != nil {
		t.Fatalf("api/openapi.yaml is not valid OpenAPI: %v", err)
	}
	// The check must see the defect it is here for.
	bad := []byte("openapi: 3.0.3\ninfo: {title: t, version: \"1\"}\npaths: {}\ncomponents:\n  schemas:\n    X: {type: string, description: a, b.}\n")
	d, err := openapi3.NewLoader().LoadFromData(bad)
	if err == nil {
		err = d.Validate(context.Background())
	}
	if err == nil {
		t.Fatal("an unquoted comma in a flow-mapping description passed")
	}
}
