package api

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/julienschmidt/httprouter"
	"gopkg.in/yaml.v3"
)

// openAPIYAML is the OpenAPI 3.1 document of the v1 API (openapi.yaml):
// every route of routes, controlRoutes and whoami, checked against the
// route table both ways and against the server by openapi_test.go.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// OpenAPI returns the OpenAPI 3.1 document of the v1 API, as YAML (the
// form it is written in; GET /v1/openapi.json serves it as JSON).
func OpenAPI() []byte { return append([]byte(nil), openAPIYAML...) }

// openAPIJSON is the document as JSON, converted once.
var openAPIJSON = sync.OnceValues(func() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openAPIYAML, &doc); err != nil {
		return nil, err
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
})

// openAPI handles GET /v1/openapi.json: the document, open to anyone (it
// holds no data).
func (s *infoAPI) openAPI(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) error {
	b, err := openAPIJSON()
	if err != nil {
		return err // a broken embedded document: openapi_test.go catches it
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil
}
