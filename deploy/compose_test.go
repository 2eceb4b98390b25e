package deploy_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestComposeFileCurrentSyntax parses docker-compose.yml as the Compose
// Specification reads it: no top-level `version:` (obsolete), services
// n1-n3 from the shared x-leasehold block, each with the image's health
// check.
func TestComposeFileCurrentSyntax(t *testing.T) {
	data, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]yaml.Node
	if err := yaml.Unmarshal(data, &top); err != nil {
		t.Fatalf("docker-compose.yml is not YAML: %v", err)
	}
	allowed := []string{"name", "services", "networks", "volumes", "configs", "secrets", "include"}
	for k := range top {
		if k == "version" {
			t.Errorf("top-level `version:` is obsolete in the Compose Specification")
		} else if !strings.HasPrefix(k, "x-") && !slices.Contains(allowed, k) {
			t.Errorf("unknown top-level key %q", k)
		}
	}
	// Decoding resolves the YAML anchors and merge keys (<<: *leasehold).
	var file struct {
		Services map[string]struct {
			Image       string   `yaml:"image"`
			Command     []string `yaml:"command"`
			Healthcheck struct {
				Test        []string `yaml:"test"`
				Interval    string   `yaml:"interval"`
				StartPeriod string   `yaml:"start_period"`
			} `yaml:"healthcheck"`
			Volumes []string `yaml:"volumes"`
		} `yaml:"services"`
		Volumes map[string]any `yaml:"volumes"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	for _, id := range nodeIDs {
		s, ok := file.Services[id]
		if !ok {
			t.Fatalf("no service %s", id)
		}
		if s.Image == "" || !slices.Contains(s.Command, "--node-id") || !slices.Contains(s.Command, id) {
			t.Errorf("%s: image %q, command %v", id, s.Image, s.Command)
		}
		if hc := s.Healthcheck; len(hc.Test) < 3 || hc.Test[0] != "CMD" || hc.Test[1] != "/leasehold" || hc.Test[2] != "health" || hc.Interval == "" {
			t.Errorf("%s: healthcheck %+v", id, hc)
		}
		if len(s.Volumes) != 1 || !strings.HasSuffix(s.Volumes[0], ":/data") {
			t.Errorf("%s: volumes %v", id, s.Volumes)
		}
		if _, ok := file.Volumes[strings.Split(s.Volumes[0], ":")[0]]; !ok {
			t.Errorf("%s: volume %s not declared", id, s.Volumes[0])
		}
	}
}

// TestDockerfileHealthcheck: the image probes itself with `leasehold
// health` (exec form: the image has no shell).
func TestDockerfileHealthcheck(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(data), "\\\n", " ")
	var hc string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "HEALTHCHECK ") {
			hc = line
		}
	}
	if !strings.Contains(hc, `CMD ["/leasehold", "health"`) {
		t.Errorf("HEALTHCHECK line %q", hc)
	}
}

// TestSystemdUnitNotify: the unit waits for the server's READY=1.
func TestSystemdUnitNotify(t *testing.T) {
	data, err := os.ReadFile("leasehold.service")
	if err != nil {
		t.Fatal(err)
	}
	var typ []string
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Type="); ok {
			typ = append(typ, v)
		}
	}
	if !slices.Equal(typ, []string{"notify"}) {
		t.Errorf("Type= %v, want notify", typ)
	}
}
