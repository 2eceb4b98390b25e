package main

import (
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/node"
	"gopkg.in/yaml.v3"
)

// k8sObject is what the test reads of a Kubernetes manifest.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		// Service
		ClusterIP                string           `yaml:"clusterIP"`
		PublishNotReadyAddresses bool             `yaml:"publishNotReadyAddresses"`
		Selector                 yaml.Node        `yaml:"selector"`
		Ports                    []k8sServicePort `yaml:"ports"`
		MaxUnavailable           int              `yaml:"maxUnavailable"`
		ServiceName              string           `yaml:"serviceName"`
		Replicas                 int              `yaml:"replicas"`
		Template                 struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				Containers []k8sContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type k8sServicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort string `yaml:"targetPort"`
}

type k8sContainer struct {
	Args []string `yaml:"args"`
	Env  []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
}

type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

// k8sObjects reads every manifest of deploy/kubernetes.
func k8sObjects(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob("../../deploy/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var out []k8sObject
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(fh)
		dec.KnownFields(false)
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, o)
		}
		fh.Close()
	}
	return out
}

// matchLabels is a selector's labels: a Service's map, or a
// PodDisruptionBudget's matchLabels.
func matchLabels(t *testing.T, n yaml.Node) map[string]string {
	t.Helper()
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		t.Fatal(err)
	}
	if ml, ok := m["matchLabels"].(map[string]any); ok {
		m = ml
	}
	out := map[string]string{}
	for k, v := range m {
		out[k] = v.(string)
	}
	return out
}

// TestKubernetesManifests: the StatefulSet runs `leasehold server` with
// flags and LEASEHOLD_* variables the server really has, which parse and
// validate together; it advertises the headless Service's stable names;
// the Services and the PodDisruptionBudget select its pods; every probe
// names a container port and a path a real server answers (not 404).
func TestKubernetesManifests(t *testing.T) {
	objs := k8sObjects(t)
	var sts *k8sObject
	kinds := map[string]int{}
	for i := range objs {
		kinds[objs[i].Kind]++
		if objs[i].Kind == "StatefulSet" {
			sts = &objs[i]
		}
	}
	if sts == nil || kinds["Service"] != 2 || kinds["PodDisruptionBudget"] != 1 {
		t.Fatalf("kinds %v, want a StatefulSet, two Services and a PodDisruptionBudget", kinds)
	}
	podLabels := sts.Spec.Template.Metadata.Labels
	if sts.Spec.Replicas != 3 || len(sts.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("StatefulSet: %d replicas, %d containers", sts.Spec.Replicas, len(sts.Spec.Template.Spec.Containers))
	}
	c := sts.Spec.Template.Spec.Containers[0]

	// Flags and variables against the server's real flag set.
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	var cfg serverConfig
	cfg.register(fs, node.DefaultConfig())
	byEnv := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { byEnv[envName(f.Name)] = f.Name })
	if len(c.Args) == 0 || c.Args[0] != "server" {
		t.Fatalf("container args %q: want server first", c.Args)
	}
	for _, a := range c.Args[1:] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || fs.Lookup(name) == nil {
			t.Errorf("argument %q is not a server flag", a)
		}
	}
	env := map[string]string{"POD_NAME": "leasehold-1", "POD_NAMESPACE": "ns"}
	ref := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, e := range c.Env {
		if strings.HasPrefix(e.Name, "LEASEHOLD_") && byEnv[e.Name] == "" {
			t.Errorf("variable %s is no server flag's", e.Name)
		}
		if e.Value != "" {
			env[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string { return env[m[2:len(m)-1]] })
		}
	}
	a, _, errb := testApp(env)
	got, err := a.parseServerFlags(c.Args[1:])
	if err != nil {
		t.Fatalf("the manifest's flags do not parse: %v %s", err, errb)
	}
	wantAdv := "leasehold-1.leasehold-peers.ns.svc.cluster.local"
	if got.node.AdvertiseAddr != wantAdv || got.node.NodeID != "leasehold-1" || got.node.BootstrapExpect != sts.Spec.Replicas {
		t.Errorf("advertise %q node id %q bootstrap-expect %d; want %s, leasehold-1, %d",
			got.node.AdvertiseAddr, got.node.NodeID, got.node.BootstrapExpect, wantAdv, sts.Spec.Replicas)
	}
	for _, j := range got.node.Join {
		if !strings.HasSuffix(j, "."+sts.Spec.ServiceName+":7702") {
			t.Errorf("--join %q is not a stable name of the headless Service %s", j, sts.Spec.ServiceName)
		}
	}
	if _, err := plaintextRefusal(got.httpAddr, got.node.RaftAddr, got.node.GossipAddr, &got.tls); err != nil {
		t.Errorf("the server would refuse to start: %v", err)
	}

	// Services and the budget select the pods; the headless one is
	// the StatefulSet's and publishes servers before they are ready.
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for _, o := range objs {
		switch o.Kind {
		case "Service", "PodDisruptionBudget":
			for k, v := range matchLabels(t, o.Spec.Selector) {
				if podLabels[k] != v {
					t.Errorf("%s %s selects %s=%s; the pods have %v", o.Kind, o.Metadata.Name, k, v, podLabels)
				}
			}
		}
		if o.Kind == "Service" {
			for _, p := range o.Spec.Ports {
				if !ports[p.TargetPort] {
					t.Errorf("Service %s targets port %q, not a container port", o.Metadata.Name, p.TargetPort)
				}
			}
			if o.Metadata.Name == sts.Spec.ServiceName && (o.Spec.ClusterIP != "None" || !o.Spec.PublishNotReadyAddresses) {
				t.Errorf("Service %s must be headless and publish not-ready addresses", o.Metadata.Name)
			}
		}
		if o.Kind == "PodDisruptionBudget" && o.Spec.MaxUnavailable != 1 {
			t.Errorf("PodDisruptionBudget maxUnavailable %d, want 1 (quorum of 3)", o.Spec.MaxUnavailable)
		}
	}

	// Probes: a container port, and a path a real server answers.
	var paths []string
	for _, p := range []*k8sProbe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
		if p == nil {
			t.Fatal("want startup, liveness and readiness probes")
		}
		if !ports[p.HTTPGet.Port] {
			t.Errorf("probe on port %q, not a container port", p.HTTPGet.Port)
		}
		paths = append(paths, p.HTTPGet.Path)
	}
	if !slices.Contains(paths, "/healthz") || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probe paths %q: want /healthz and readiness on /readyz", paths)
	}
	s := newServer(t)
	s.start()
	for _, p := range paths {
		resp, err := http.Get("http://" + s.http + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s on a ready server: %d", p, resp.StatusCode)
		}
	}
}
