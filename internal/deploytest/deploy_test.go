package deploytest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"
	"go.yaml.in/yaml/v3"

	"github.com/batcherd/batcherd/internal/config"
)

// The HTTP contract of `batcherd serve` (README "HTTP API"; the listener default is
// BATCHERD_HTTP_ADDR in internal/config). Changing any of these means changing the
// probes, the Service, the Dockerfile EXPOSE and the docs together.
const (
	wantHTTPAddr  = ":8080"
	wantPort      = 8080
	readinessPath = "/readyz"
	livenessPath  = "/healthz"
	wantReplicas  = 3
)

// ---------------------------------------------------------------------------------
// files

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ---------------------------------------------------------------------------------
// Kubernetes: the subset of the API the checks read

type meta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type probe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"`
	} `yaml:"httpGet"`
	PeriodSeconds    int `yaml:"periodSeconds"`
	FailureThreshold int `yaml:"failureThreshold"`
}

type envFromSource struct {
	ConfigMapRef *struct {
		Name string `yaml:"name"`
	} `yaml:"configMapRef"`
	SecretRef *struct {
		Name string `yaml:"name"`
	} `yaml:"secretRef"`
}

type securityContext struct {
	RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
	RunAsUser                *int  `yaml:"runAsUser"`
	ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	Privileged               *bool `yaml:"privileged"`
	Capabilities             *struct {
		Drop []string `yaml:"drop"`
		Add  []string `yaml:"add"`
	} `yaml:"capabilities"`
	SeccompProfile *struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type container struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Ports   []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	EnvFrom []envFromSource `yaml:"envFrom"`
	Env     []struct {
		Name      string    `yaml:"name"`
		Value     *string   `yaml:"value"`
		ValueFrom yaml.Node `yaml:"valueFrom"`
	} `yaml:"env"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	StartupProbe   *probe `yaml:"startupProbe"`
	Lifecycle      *struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext *securityContext `yaml:"securityContext"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int             `yaml:"terminationGracePeriodSeconds"`
	RestartPolicy                 string           `yaml:"restartPolicy"`
	SecurityContext               *securityContext `yaml:"securityContext"`
	TopologySpreadConstraints     []struct {
		TopologyKey   string        `yaml:"topologyKey"`
		LabelSelector labelSelector `yaml:"labelSelector"`
	} `yaml:"topologySpreadConstraints"`
	Affinity *struct {
		PodAntiAffinity yaml.Node `yaml:"podAntiAffinity"`
	} `yaml:"affinity"`
	Containers []container `yaml:"containers"`
}

type podTemplate struct {
	Metadata meta    `yaml:"metadata"`
	Spec     podSpec `yaml:"spec"`
}

type object struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   meta              `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`       // ConfigMap, Secret
	StringData map[string]string `yaml:"stringData"` // Secret
	Spec       struct {
		// Deployment
		Replicas *int          `yaml:"replicas"`
		Selector labelSelector `yaml:"selector"`
		Template podTemplate   `yaml:"template"`
		// Job
		BackoffLimit            *int `yaml:"backoffLimit"`
		TTLSecondsAfterFinished *int `yaml:"ttlSecondsAfterFinished"`
		// PodDisruptionBudget
		MinAvailable   yaml.Node `yaml:"minAvailable"`
		MaxUnavailable yaml.Node `yaml:"maxUnavailable"`
		// Service (the PDB selector uses Selector above)
		ServiceSelector map[string]string `yaml:"-"`
		Ports           []struct {
			Name       string    `yaml:"name"`
			Port       int       `yaml:"port"`
			TargetPort yaml.Node `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
	file string
}

// manifests is everything in deploy/kubernetes, as file name → content.
type manifests map[string]string

func loadManifests(t *testing.T) manifests {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	names, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	yml, _ := filepath.Glob(filepath.Join(dir, "*.yml"))
	names = append(names, yml...)
	if len(names) == 0 {
		t.Fatalf("no YAML in %s", dir)
	}
	m := manifests{}
	for _, n := range names {
		m[filepath.Base(n)] = readFile(t, n)
	}
	return m
}

// parsed is the decoded manifests.
type parsed struct {
	objects   []*object
	resources []string // kustomization.yaml resources
}

func parse(m manifests) (*parsed, []error) {
	var errs []error
	p := &parsed{}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "kustomization.yaml" || name == "kustomization.yml" {
			var k struct {
				Namespace string   `yaml:"namespace"`
				Resources []string `yaml:"resources"`
			}
			if err := yaml.Unmarshal([]byte(m[name]), &k); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			if k.Namespace != "" {
				errs = append(errs, fmt.Errorf("%s: sets namespace %q; the manifests must stay namespace-agnostic", name, k.Namespace))
			}
			p.resources = k.Resources
			continue
		}
		dec := yaml.NewDecoder(strings.NewReader(m[name]))
		for i := 0; ; i++ {
			var raw yaml.Node
			err := dec.Decode(&raw)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", name, i, err))
				break
			}
			if len(raw.Content) == 0 { // empty document (a stray ---)
				continue
			}
			o := &object{file: name}
			if err := raw.Decode(o); err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", name, i, err))
				continue
			}
			if o.Kind == "Service" {
				var s struct {
					Spec struct {
						Selector map[string]string `yaml:"selector"`
					} `yaml:"spec"`
				}
				_ = raw.Decode(&s)
				o.Spec.ServiceSelector = s.Spec.Selector
			}
			p.objects = append(p.objects, o)
		}
	}
	return p, errs
}

func (p *parsed) byKind(kind string) []*object {
	var out []*object
	for _, o := range p.objects {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// env is the effective configuration the pods get: ConfigMap data, Secret values and
// literal container env, as the variables batcherd reads.
func (p *parsed) env() map[string]string {
	env := map[string]string{}
	for _, o := range p.byKind("ConfigMap") {
		for k, v := range o.Data {
			env[k] = v
		}
	}
	for _, o := range p.byKind("Secret") {
		for k := range o.Data {
			env[k] = "<base64>"
		}
		for k, v := range o.StringData {
			env[k] = v
		}
	}
	return env
}

// knownVars is every variable internal/config reads, name → description.
func knownVars() map[string]config.Var {
	out := map[string]config.Var{}
	for _, v := range config.Vars() {
		out[v.Name] = v
	}
	return out
}

// effective loads the variables through internal/config exactly as batcherd serve would
// and validates them for serve.
func effective(env map[string]string) (*config.Config, error) {
	lookup := map[string]string{}
	for k, v := range env {
		if strings.HasPrefix(k, config.Prefix) {
			lookup[k] = v
		}
	}
	cfg, err := config.Load(context.Background(), envconfig.MapLookuper(lookup))
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(config.Need{DB: true, GitLab: true, Serve: true}); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func portOf(addr string) (int, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(p)
}

// resolvePort turns a probe's or Service's port (a number or a container port name) into
// a number using the container's ports.
func resolvePort(n yaml.Node, c *container) (int, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, errors.New("port is not set")
	}
	if v, err := strconv.Atoi(n.Value); err == nil {
		return v, nil
	}
	for _, p := range c.Ports {
		if p.Name == n.Value {
			return p.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("port name %q is not a port of container %q", n.Value, c.Name)
}

func subset(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkManifests returns every problem found in the Kubernetes manifests.
func checkManifests(m manifests) []error {
	p, errs := parse(m)
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	// --- kustomization lists every manifest, and only existing files
	for name := range m {
		if name == "kustomization.yaml" || name == "kustomization.yml" {
			continue
		}
		if !slices.Contains(p.resources, name) {
			bad("kustomization.yaml does not list %s", name)
		}
	}
	for _, r := range p.resources {
		if _, ok := m[r]; !ok {
			bad("kustomization.yaml lists %s, which does not exist", r)
		}
	}

	// --- every document is well-formed and namespace-agnostic
	for _, o := range p.objects {
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			bad("%s: a document lacks apiVersion, kind or metadata.name", o.file)
		}
		if o.Metadata.Namespace != "" {
			bad("%s: %s/%s sets metadata.namespace; keep the manifests namespace-agnostic", o.file, o.Kind, o.Metadata.Name)
		}
	}
	for _, kind := range []string{"Deployment", "Service", "PodDisruptionBudget", "Secret", "ConfigMap", "Job"} {
		if n := len(p.byKind(kind)); n != 1 {
			bad("want exactly one %s, found %d", kind, n)
		}
	}
	if len(errs) > 0 && (len(p.byKind("Deployment")) != 1 || len(p.byKind("Job")) != 1) {
		return errs
	}

	// --- configuration: every key is a variable batcherd reads; secrets only in the Secret
	known := knownVars()
	configMaps, secrets := map[string]bool{}, map[string]bool{}
	for _, o := range p.byKind("ConfigMap") {
		configMaps[o.Metadata.Name] = true
		for k := range o.Data {
			if !strings.HasPrefix(k, config.Prefix) {
				bad("ConfigMap %s: key %s does not start with %s", o.Metadata.Name, k, config.Prefix)
			} else if _, ok := known[k]; !ok {
				bad("ConfigMap %s: %s is not a variable internal/config reads", o.Metadata.Name, k)
			} else if known[k].Secret {
				bad("ConfigMap %s: %s is a secret; put it in the Secret", o.Metadata.Name, k)
			}
		}
	}
	for _, o := range p.byKind("Secret") {
		secrets[o.Metadata.Name] = true
		keys := map[string]bool{}
		for k := range o.Data {
			keys[k] = true
		}
		for k := range o.StringData {
			keys[k] = true
		}
		for k := range keys {
			if !strings.HasPrefix(k, config.Prefix) {
				bad("Secret %s: key %s does not start with %s", o.Metadata.Name, k, config.Prefix)
			} else if _, ok := known[k]; !ok {
				bad("Secret %s: %s is not a variable internal/config reads", o.Metadata.Name, k)
			}
		}
		for _, k := range []string{"MYSQL_DSN", "GITLAB_TOKEN", "API_TOKENS", "ADMIN_TOKENS", "WEBHOOK_SECRET"} {
			if !keys[config.Prefix+k] {
				bad("Secret %s: missing %s%s", o.Metadata.Name, config.Prefix, k)
			}
		}
	}
	env := p.env()
	if v := strings.ToLower(env[config.Prefix+"INSECURE_NO_AUTH"]); v != "" && v != "false" && v != "0" {
		bad("%sINSECURE_NO_AUTH=%s: the production manifests must keep authentication on", config.Prefix, v)
	}
	cfg, err := effective(env)
	if err != nil {
		bad("the ConfigMap and Secret do not make a valid serve configuration: %v", err)
	}
	if cfg == nil {
		return errs
	}
	httpPort, err := portOf(cfg.HTTPAddr)
	if err != nil {
		bad("BATCHERD_HTTP_ADDR %q: %v", cfg.HTTPAddr, err)
	}
	if httpPort != wantPort {
		bad("BATCHERD_HTTP_ADDR as deployed is %q; the manifests expose %d", cfg.HTTPAddr, wantPort)
	}

	// --- Deployment
	d := p.byKind("Deployment")[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != wantReplicas {
		bad("Deployment %s: replicas must be %d", d.Metadata.Name, wantReplicas)
	}
	tmpl := d.Spec.Template
	if !subset(d.Spec.Selector.MatchLabels, tmpl.Metadata.Labels) {
		bad("Deployment %s: selector %v does not match the pod labels %v", d.Metadata.Name, d.Spec.Selector.MatchLabels, tmpl.Metadata.Labels)
	}
	podLabels := tmpl.Metadata.Labels
	if len(tmpl.Spec.Containers) != 1 {
		bad("Deployment %s: want one container, found %d", d.Metadata.Name, len(tmpl.Spec.Containers))
		return errs
	}
	c := &tmpl.Spec.Containers[0]
	if len(c.Command) != 0 {
		bad("Deployment %s: command overrides the image ENTRYPOINT; use args", d.Metadata.Name)
	}
	if !slices.Equal(c.Args, []string{"serve"}) {
		bad("Deployment %s: args = %q, want [serve]", d.Metadata.Name, c.Args)
	}
	var httpContainerPort int
	for _, cp := range c.Ports {
		if cp.Name == "http" {
			httpContainerPort = cp.ContainerPort
		}
	}
	if httpContainerPort != wantPort {
		bad("Deployment %s: container port named http is %d, want %d", d.Metadata.Name, httpContainerPort, wantPort)
	}
	if httpContainerPort != httpPort {
		bad("Deployment %s: container port http %d differs from BATCHERD_HTTP_ADDR %q", d.Metadata.Name, httpContainerPort, cfg.HTTPAddr)
	}
	checkProbe := func(kind string, pr *probe, path string) {
		if pr == nil || pr.HTTPGet == nil {
			bad("Deployment %s: %s must be an httpGet probe on %s", d.Metadata.Name, kind, path)
			return
		}
		if pr.HTTPGet.Path != path {
			bad("Deployment %s: %s path is %q, want %q", d.Metadata.Name, kind, pr.HTTPGet.Path, path)
		}
		port, err := resolvePort(pr.HTTPGet.Port, c)
		if err != nil {
			bad("Deployment %s: %s: %v", d.Metadata.Name, kind, err)
		} else if port != httpPort {
			bad("Deployment %s: %s probes port %d, but batcherd listens on %q", d.Metadata.Name, kind, port, cfg.HTTPAddr)
		}
	}
	checkProbe("readinessProbe", c.ReadinessProbe, readinessPath)
	checkProbe("livenessProbe", c.LivenessProbe, livenessPath)
	if c.StartupProbe != nil {
		checkProbe("startupProbe", c.StartupProbe, livenessPath)
	}
	preStop := 0
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = c.Lifecycle.PreStop.Sleep.Seconds
	}
	grace := tmpl.Spec.TerminationGracePeriodSeconds
	switch {
	case grace == nil:
		bad("Deployment %s: terminationGracePeriodSeconds must be set (default 30s is not derived from the shutdown timeout)", d.Metadata.Name)
	case time.Duration(*grace)*time.Second <= cfg.ShutdownTimeout+time.Duration(preStop)*time.Second:
		bad("Deployment %s: terminationGracePeriodSeconds %d must exceed preStop sleep %ds + BATCHERD_SHUTDOWN_TIMEOUT %s",
			d.Metadata.Name, *grace, preStop, cfg.ShutdownTimeout)
	}
	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" {
			bad("Deployment %s: resources.requests.%s is not set", d.Metadata.Name, r)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		bad("Deployment %s: resources.limits.memory is not set", d.Metadata.Name)
	}
	checkEnvFrom := func(what string, c *container) {
		var cm, sec bool
		for _, ef := range c.EnvFrom {
			if ef.ConfigMapRef != nil {
				cm = true
				if !configMaps[ef.ConfigMapRef.Name] {
					bad("%s: envFrom ConfigMap %q is not in the manifests", what, ef.ConfigMapRef.Name)
				}
			}
			if ef.SecretRef != nil {
				sec = true
				if !secrets[ef.SecretRef.Name] {
					bad("%s: envFrom Secret %q is not in the manifests", what, ef.SecretRef.Name)
				}
			}
		}
		if !cm || !sec {
			bad("%s: envFrom must load both the ConfigMap and the Secret", what)
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, config.Prefix) {
				if _, ok := known[e.Name]; !ok {
					bad("%s: env %s is not a variable internal/config reads", what, e.Name)
				}
			}
		}
	}
	checkEnvFrom("Deployment "+d.Metadata.Name, c)
	checkSecurity := func(what string, ps podSpec, c *container) {
		pod, ctr := ps.SecurityContext, c.SecurityContext
		if pod == nil {
			pod = &securityContext{}
		}
		if ctr == nil {
			bad("%s: container securityContext is not set", what)
			return
		}
		isTrue := func(b ...*bool) bool {
			for _, x := range b {
				if x != nil {
					return *x
				}
			}
			return false
		}
		if !isTrue(ctr.RunAsNonRoot, pod.RunAsNonRoot) {
			bad("%s: runAsNonRoot must be true", what)
		}
		for _, u := range []*int{ctr.RunAsUser, pod.RunAsUser} {
			if u != nil && *u == 0 {
				bad("%s: runAsUser must not be 0", what)
			}
		}
		if !isTrue(ctr.ReadOnlyRootFilesystem) {
			bad("%s: readOnlyRootFilesystem must be true", what)
		}
		if ctr.AllowPrivilegeEscalation == nil || *ctr.AllowPrivilegeEscalation {
			bad("%s: allowPrivilegeEscalation must be false", what)
		}
		if isTrue(ctr.Privileged) {
			bad("%s: must not be privileged", what)
		}
		if ctr.Capabilities == nil || !slices.Contains(ctr.Capabilities.Drop, "ALL") || len(ctr.Capabilities.Add) > 0 {
			bad("%s: capabilities must drop ALL and add none", what)
		}
		seccomp := ""
		for _, s := range []*securityContext{ctr, pod} {
			if s.SeccompProfile != nil && seccomp == "" {
				seccomp = s.SeccompProfile.Type
			}
		}
		if seccomp != "RuntimeDefault" && seccomp != "Localhost" {
			bad("%s: seccompProfile must be RuntimeDefault, got %q", what, seccomp)
		}
	}
	checkSecurity("Deployment "+d.Metadata.Name, tmpl.Spec, c)
	spread := false
	for _, tsc := range tmpl.Spec.TopologySpreadConstraints {
		if tsc.TopologyKey == "kubernetes.io/hostname" && subset(tsc.LabelSelector.MatchLabels, podLabels) {
			spread = true
		}
	}
	if !spread && (tmpl.Spec.Affinity == nil || tmpl.Spec.Affinity.PodAntiAffinity.Kind == 0) {
		bad("Deployment %s: replicas must be spread across nodes (topologySpreadConstraints on kubernetes.io/hostname selecting the pods, or podAntiAffinity)", d.Metadata.Name)
	}

	// --- Service
	for _, s := range p.byKind("Service") {
		if !subset(s.Spec.ServiceSelector, podLabels) {
			bad("Service %s: selector %v does not select the Deployment's pods %v", s.Metadata.Name, s.Spec.ServiceSelector, podLabels)
		}
		if len(s.Spec.Ports) == 0 {
			bad("Service %s: no ports", s.Metadata.Name)
		}
		for _, sp := range s.Spec.Ports {
			tp := sp.TargetPort
			if tp.Kind == 0 { // targetPort defaults to port
				tp = yaml.Node{Kind: yaml.ScalarNode, Value: strconv.Itoa(sp.Port)}
			}
			port, err := resolvePort(tp, c)
			if err != nil {
				bad("Service %s: %v", s.Metadata.Name, err)
			} else if port != httpPort {
				bad("Service %s: targets port %d, but batcherd listens on %q", s.Metadata.Name, port, cfg.HTTPAddr)
			}
		}
	}

	// --- PodDisruptionBudget
	for _, pdb := range p.byKind("PodDisruptionBudget") {
		if !subset(pdb.Spec.Selector.MatchLabels, podLabels) {
			bad("PodDisruptionBudget %s: selector does not select the Deployment's pods", pdb.Metadata.Name)
		}
		switch {
		case pdb.Spec.MinAvailable.Kind != 0 && pdb.Spec.MaxUnavailable.Kind != 0:
			bad("PodDisruptionBudget %s: set minAvailable or maxUnavailable, not both", pdb.Metadata.Name)
		case pdb.Spec.MaxUnavailable.Kind != 0:
			if pdb.Spec.MaxUnavailable.Value != "1" {
				bad("PodDisruptionBudget %s: maxUnavailable must be 1, got %q", pdb.Metadata.Name, pdb.Spec.MaxUnavailable.Value)
			}
		case pdb.Spec.MinAvailable.Kind != 0:
			n, err := strconv.Atoi(pdb.Spec.MinAvailable.Value)
			if err != nil || n < 2 || n >= wantReplicas {
				bad("PodDisruptionBudget %s: minAvailable must be between 2 and replicas-1, got %q", pdb.Metadata.Name, pdb.Spec.MinAvailable.Value)
			}
		default:
			bad("PodDisruptionBudget %s: neither minAvailable nor maxUnavailable is set", pdb.Metadata.Name)
		}
	}

	// --- migrate Job
	j := p.byKind("Job")[0]
	if len(j.Spec.Template.Spec.Containers) != 1 {
		bad("Job %s: want one container", j.Metadata.Name)
		return errs
	}
	jc := &j.Spec.Template.Spec.Containers[0]
	if len(jc.Command) != 0 || !slices.Equal(jc.Args, []string{"migrate"}) {
		bad("Job %s: must run the image entrypoint with args [migrate], got command %q args %q", j.Metadata.Name, jc.Command, jc.Args)
	}
	if jc.Image != c.Image {
		bad("Job %s: image %q differs from the Deployment's %q", j.Metadata.Name, jc.Image, c.Image)
	}
	if j.Spec.BackoffLimit == nil || *j.Spec.BackoffLimit < 1 || *j.Spec.BackoffLimit > 10 {
		bad("Job %s: backoffLimit must be set between 1 and 10", j.Metadata.Name)
	}
	if j.Spec.TTLSecondsAfterFinished == nil {
		bad("Job %s: ttlSecondsAfterFinished must be set", j.Metadata.Name)
	}
	if rp := j.Spec.Template.Spec.RestartPolicy; rp != "Never" && rp != "OnFailure" {
		bad("Job %s: restartPolicy must be Never or OnFailure, got %q", j.Metadata.Name, rp)
	}
	checkEnvFrom("Job "+j.Metadata.Name, jc)
	checkSecurity("Job "+j.Metadata.Name, j.Spec.Template.Spec, jc)
	return errs
}

func errorsText(errs []error) string {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString("\n  " + e.Error())
	}
	return b.String()
}

func TestKubernetesManifests(t *testing.T) {
	if errs := checkManifests(loadManifests(t)); len(errs) > 0 {
		t.Fatalf("deploy/kubernetes has %d problem(s):%s", len(errs), errorsText(errs))
	}
}

// TestHTTPAddrDefault pins the default listener the manifests, the Dockerfile and the
// systemd unit assume to internal/config's BATCHERD_HTTP_ADDR default.
func TestHTTPAddrDefault(t *testing.T) {
	v, ok := knownVars()[config.Prefix+"HTTP_ADDR"]
	if !ok {
		t.Fatalf("internal/config has no %sHTTP_ADDR", config.Prefix)
	}
	if v.Default != wantHTTPAddr {
		t.Fatalf("internal/config default %sHTTP_ADDR = %q; deploy/, systemd/ and the Dockerfile assume %q", config.Prefix, v.Default, wantHTTPAddr)
	}
	cfg, err := config.Load(context.Background(), envconfig.MapLookuper(nil))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := portOf(cfg.HTTPAddr); err != nil || p != wantPort {
		t.Fatalf("loaded default HTTP address %q, want port %d", cfg.HTTPAddr, wantPort)
	}
}

// TestManifestChecksCatchMistakes proves the checks fail: each mutation of the real
// manifests must be reported.
func TestManifestChecksCatchMistakes(t *testing.T) {
	real := loadManifests(t)
	cases := []struct {
		name, file, old, new, want string
	}{
		{"replicas", "deployment.yaml", "replicas: 3", "replicas: 2", "replicas must be 3"},
		{"readiness path", "deployment.yaml", "path: /readyz", "path: /ready", `readinessProbe path is "/ready"`},
		{"liveness path", "deployment.yaml", "path: /healthz\n              port: http\n            periodSeconds: 10", "path: /livez\n              port: http\n            periodSeconds: 10", `livenessProbe path is "/livez"`},
		{"container port", "deployment.yaml", "containerPort: 8080", "containerPort: 9090", "container port named http is 9090"},
		{"listen address", "configmap.yaml", `BATCHERD_HTTP_ADDR: ":8080"`, `BATCHERD_HTTP_ADDR: ":9090"`, "the manifests expose 8080"},
		{"grace period", "deployment.yaml", "terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 20", "terminationGracePeriodSeconds 20 must exceed"},
		{"shutdown timeout", "configmap.yaml", `BATCHERD_SHUTDOWN_TIMEOUT: "20s"`, `BATCHERD_SHUTDOWN_TIMEOUT: "45s"`, "must exceed"},
		{"unprefixed key", "configmap.yaml", "BATCHERD_LOG_LEVEL:", "LOG_LEVEL:", "does not start with BATCHERD_"},
		{"unknown variable", "configmap.yaml", "BATCHERD_LOG_LEVEL:", "BATCHERD_LOGLEVEL:", "not a variable internal/config reads"},
		{"secret in configmap", "configmap.yaml", "\ndata:\n", "\ndata:\n  BATCHERD_GITLAB_TOKEN: x\n", "is a secret; put it in the Secret"},
		{"invalid value", "configmap.yaml", `BATCHERD_MERGE_MODE: "auto"`, `BATCHERD_MERGE_MODE: "sometimes"`, "BATCHERD_MERGE_MODE"},
		{"missing secret", "secret.yaml", "BATCHERD_WEBHOOK_SECRET:", "BATCHERD_OTHER:", "missing BATCHERD_WEBHOOK_SECRET"},
		{"job args", "migrate-job.yaml", `args: ["migrate"]`, `args: ["serve"]`, "args [migrate]"},
		{"root", "deployment.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", "Deployment batcherd: readOnlyRootFilesystem"},
		{"namespace", "service.yaml", "  name: batcherd\n", "  name: batcherd\n  namespace: prod\n", "namespace-agnostic"},
		{"unlisted file", "kustomization.yaml", "  - pdb.yaml\n", "", "does not list pdb.yaml"},
		{"service selector", "service.yaml", "app.kubernetes.io/component: server", "app.kubernetes.io/component: web", "does not select"},
		{"pdb", "pdb.yaml", "maxUnavailable: 1", "maxUnavailable: 3", "maxUnavailable must be 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := manifests{}
			for k, v := range real {
				m[k] = v
			}
			if !strings.Contains(m[tc.file], tc.old) {
				t.Fatalf("%s no longer contains %q; update this mutation", tc.file, tc.old)
			}
			m[tc.file] = strings.Replace(m[tc.file], tc.old, tc.new, 1)
			errs := checkManifests(m)
			if !strings.Contains(errorsText(errs), tc.want) {
				t.Fatalf("mutation not caught: want an error containing %q, got:%s", tc.want, errorsText(errs))
			}
		})
	}
}

// ---------------------------------------------------------------------------------
// systemd

// unit is a parsed unit file: section → key → values in order (keys may repeat).
type unit map[string]map[string][]string

// parseUnit reads a systemd unit file by hand: [Section] headers, Key=Value lines,
// # and ; comments, trailing-backslash continuations.
func parseUnit(text string) (unit, error) {
	u := unit{}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	var cont strings.Builder
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cont.Len() == 0 && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";")) {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cont.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		if cont.Len() > 0 {
			line = cont.String() + line
			cont.Reset()
		}
		if strings.HasPrefix(line, "[") {
			if !strings.HasSuffix(line, "]") {
				return nil, fmt.Errorf("line %d: bad section header %q", n, line)
			}
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("line %d: not Key=Value: %q", n, line)
		}
		if section == "" {
			return nil, fmt.Errorf("line %d: %q outside a section", n, line)
		}
		k = strings.TrimSpace(k)
		u[section][k] = append(u[section][k], strings.TrimSpace(v))
	}
	return u, sc.Err()
}

// last returns the effective value of a single-valued key and whether it is set.
func (u unit) last(section, key string) (string, bool) {
	vs := u[section][key]
	if len(vs) == 0 {
		return "", false
	}
	return vs[len(vs)-1], true
}

// parseSystemdTime parses a systemd time span: "30", "30s", "1min 30s", "500ms", "infinity".
func parseSystemdTime(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "infinity" {
		return time.Duration(1<<63 - 1), nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	units := map[string]time.Duration{
		"us": time.Microsecond, "usec": time.Microsecond,
		"ms": time.Millisecond, "msec": time.Millisecond,
		"s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
		"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
		"h": time.Hour, "hr": time.Hour, "hour": time.Hour, "hours": time.Hour,
	}
	re := regexp.MustCompile(`^\s*(\d+)\s*([a-z]+)`)
	var total time.Duration
	rest := s
	for strings.TrimSpace(rest) != "" {
		m := re.FindStringSubmatch(rest)
		if m == nil {
			return 0, fmt.Errorf("bad time span %q", s)
		}
		u, ok := units[m[2]]
		if !ok {
			return 0, fmt.Errorf("bad unit %q in %q", m[2], s)
		}
		n, _ := strconv.Atoi(m[1])
		total += time.Duration(n) * u
		rest = rest[len(m[0]):]
	}
	return total, nil
}

// parseEnvFile reads an EnvironmentFile: KEY=value lines, # comments, optional quotes.
func parseEnvFile(text string) map[string]string {
	env := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	return env
}

// checkUnit returns every problem found in the unit, given the environment file it
// would run with (for the shutdown timeout).
func checkUnit(unitText, envText string) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	u, err := parseUnit(unitText)
	if err != nil {
		return []error{err}
	}
	for _, s := range []string{"Unit", "Service", "Install"} {
		if u[s] == nil {
			bad("no [%s] section", s)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	exact := map[string]string{
		"Type":                    "simple",
		"EnvironmentFile":         "/etc/batcherd/batcherd.env",
		"ExecStart":               "/usr/local/bin/batcherd serve",
		"Restart":                 "on-failure",
		"KillSignal":              "SIGTERM",
		"DynamicUser":             "yes",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"CapabilityBoundingSet":   "",
		"AmbientCapabilities":     "",
		"SystemCallArchitectures": "native",
		"LockPersonality":         "yes",
		"MemoryDenyWriteExecute":  "yes",
		"RestrictNamespaces":      "yes",
		"RestrictRealtime":        "yes",
		"RestrictSUIDSGID":        "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectKernelModules":    "yes",
		"ProtectKernelLogs":       "yes",
		"ProtectControlGroups":    "yes",
		"ProtectClock":            "yes",
		"ProtectHostname":         "yes",
		"UMask":                   "0077",
	}
	keys := make([]string, 0, len(exact))
	for k := range exact {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		got, ok := u.last("Service", k)
		if !ok {
			bad("[Service] %s= is missing (want %q)", k, exact[k])
		} else if got != exact[k] {
			bad("[Service] %s=%s, want %q", k, got, exact[k])
		}
	}
	// Capability sets: every assignment must be empty, or a later one could add back.
	for _, k := range []string{"CapabilityBoundingSet", "AmbientCapabilities"} {
		for _, v := range u["Service"][k] {
			if v != "" {
				bad("[Service] %s=%s: must be empty (no capabilities)", k, v)
			}
		}
	}
	if fams, ok := u.last("Service", "RestrictAddressFamilies"); !ok {
		bad("[Service] RestrictAddressFamilies= is missing")
	} else {
		got := strings.Fields(fams)
		sort.Strings(got)
		if !slices.Equal(got, []string{"AF_INET", "AF_INET6", "AF_UNIX"}) {
			bad("[Service] RestrictAddressFamilies=%s, want AF_INET AF_INET6 AF_UNIX", fams)
		}
	}
	filters := u["Service"]["SystemCallFilter"]
	if len(filters) == 0 || filters[0] != "@system-service" {
		bad("[Service] the first SystemCallFilter= must be the allow list @system-service, got %q", filters)
	}
	for _, f := range filters {
		if f == "" {
			bad("[Service] an empty SystemCallFilter= resets the filter")
		}
	}
	if u["Service"]["User"] != nil || u["Service"]["Group"] != nil {
		bad("[Service] User=/Group= set; DynamicUser=yes allocates the user")
	}

	shutdown := 20 * time.Second
	env := parseEnvFile(envText)
	for k := range env {
		if !strings.HasPrefix(k, config.Prefix) {
			bad("env file: %s does not start with %s", k, config.Prefix)
		}
	}
	if _, err := effective(env); err != nil {
		bad("env file does not make a valid serve configuration: %v", err)
	}
	known := knownVars()
	for _, line := range strings.Split(envText, "\n") {
		// Commented-out examples must name real variables too.
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		if k, _, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, config.Prefix) && !strings.ContainsAny(k, " \t") {
			if _, ok := known[k]; !ok {
				bad("env file: %s is not a variable internal/config reads", k)
			}
		}
	}
	if v := known[config.Prefix+"SHUTDOWN_TIMEOUT"].Default; v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			bad("internal/config default SHUTDOWN_TIMEOUT %q: %v", v, err)
		} else {
			shutdown = d
		}
	}
	if v, ok := env[config.Prefix+"SHUTDOWN_TIMEOUT"]; ok {
		if d, err := time.ParseDuration(v); err == nil {
			shutdown = d
		}
	}
	stop, ok := u.last("Service", "TimeoutStopSec")
	if !ok {
		bad("[Service] TimeoutStopSec= is missing (default 90s is not derived from the shutdown timeout)")
	} else if d, err := parseSystemdTime(stop); err != nil {
		bad("[Service] TimeoutStopSec=%s: %v", stop, err)
	} else if d <= shutdown {
		bad("[Service] TimeoutStopSec=%s must exceed BATCHERD_SHUTDOWN_TIMEOUT %s", stop, shutdown)
	}
	if wb, _ := u.last("Install", "WantedBy"); wb == "" {
		bad("[Install] WantedBy= is missing")
	}
	return errs
}

func loadUnit(t *testing.T) (unitText, envText string) {
	root := repoRoot(t)
	return readFile(t, filepath.Join(root, "systemd", "batcherd.service")),
		readFile(t, filepath.Join(root, "systemd", "batcherd.env.example"))
}

func TestSystemdUnit(t *testing.T) {
	unitText, envText := loadUnit(t)
	if errs := checkUnit(unitText, envText); len(errs) > 0 {
		t.Fatalf("systemd/batcherd.service has %d problem(s):%s", len(errs), errorsText(errs))
	}
}

func TestSystemdChecksCatchMistakes(t *testing.T) {
	unitText, envText := loadUnit(t)
	cases := []struct {
		name, old, new, want string
		env                  bool
	}{
		{name: "stop timeout", old: "TimeoutStopSec=30s", new: "TimeoutStopSec=20s", want: "must exceed"},
		{name: "stop timeout minutes", old: "TimeoutStopSec=30s", new: "TimeoutStopSec=1min", want: ""},
		{name: "dynamic user", old: "DynamicUser=yes", new: "DynamicUser=no", want: "DynamicUser=no"},
		{name: "capabilities", old: "CapabilityBoundingSet=\n", new: "CapabilityBoundingSet=CAP_NET_ADMIN\n", want: "CapabilityBoundingSet=CAP_NET_ADMIN"},
		{name: "protect system", old: "ProtectSystem=strict", new: "ProtectSystem=full", want: "ProtectSystem=full"},
		{name: "no filter", old: "SystemCallFilter=@system-service", new: "#", want: "@system-service"},
		{name: "address families", old: "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX", new: "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK", want: "RestrictAddressFamilies="},
		{name: "missing key", old: "NoNewPrivileges=yes", new: "", want: "NoNewPrivileges= is missing"},
		{name: "exec", old: "ExecStart=/usr/local/bin/batcherd serve", new: "ExecStart=/usr/local/bin/batcherd", want: "ExecStart="},
		{name: "env shutdown", env: true, old: "#BATCHERD_SHUTDOWN_TIMEOUT=20s", new: "BATCHERD_SHUTDOWN_TIMEOUT=40s", want: "must exceed"},
		{name: "env unknown", env: true, old: "#BATCHERD_LOG_LEVEL=info", new: "BATCHERD_LOGLEVEL=info", want: "not a variable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, e := unitText, envText
			target := &u
			if tc.env {
				target = &e
			}
			if !strings.Contains(*target, tc.old) {
				t.Fatalf("file no longer contains %q; update this mutation", tc.old)
			}
			*target = strings.Replace(*target, tc.old, tc.new, 1)
			got := errorsText(checkUnit(u, e))
			if tc.want == "" {
				if got != "" {
					t.Fatalf("valid mutation reported:%s", got)
				}
				return
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("mutation not caught: want an error containing %q, got:%s", tc.want, got)
			}
		})
	}
}

func TestParseSystemdTime(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30": 30 * time.Second, "30s": 30 * time.Second, "1min 30s": 90 * time.Second,
		"2min": 2 * time.Minute, "500ms": 500 * time.Millisecond, "1h": time.Hour,
	} {
		got, err := parseSystemdTime(in)
		if err != nil || got != want {
			t.Errorf("parseSystemdTime(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := parseSystemdTime("soon"); err == nil {
		t.Error("parseSystemdTime(soon) did not fail")
	}
}

// TestSystemdAnalyzeVerify runs scripts/verify-systemd.sh: `systemd-analyze verify` on
// the unit, failing on any warning. Skipped where systemd-analyze is not installed.
func TestSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Skip("systemd-analyze not installed")
	}
	root := repoRoot(t)
	cmd := exec.Command(filepath.Join(root, "scripts", "verify-systemd.sh"))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/verify-systemd.sh: %v\n%s", err, out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
}

// ---------------------------------------------------------------------------------
// Dockerfile

func checkDockerfile(text string) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	// Join continuation lines, drop comments.
	var lines []string
	var cur strings.Builder
	for _, l := range strings.Split(text, "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "#") {
			continue
		}
		if strings.HasSuffix(t, `\`) {
			cur.WriteString(strings.TrimSuffix(t, `\`) + " ")
			continue
		}
		cur.WriteString(t)
		if s := strings.TrimSpace(cur.String()); s != "" {
			lines = append(lines, s)
		}
		cur.Reset()
	}
	var froms []string
	last := map[string]string{} // instruction → last value, within the final stage
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		instr = strings.ToUpper(instr)
		if instr == "FROM" {
			froms = append(froms, rest)
			last = map[string]string{}
		}
		last[instr] = strings.TrimSpace(rest)
		if instr == "HEALTHCHECK" {
			bad("HEALTHCHECK present; Kubernetes probes /healthz and /readyz instead")
		}
	}
	if len(froms) < 2 {
		bad("want a multi-stage build, found %d FROM", len(froms))
	}
	if !strings.Contains(text, "CGO_ENABLED=0") || !strings.Contains(text, "-trimpath") || !strings.Contains(text, "-X main.version=") {
		bad("the build must use CGO_ENABLED=0, -trimpath and -X main.version=")
	}
	if !strings.Contains(text, "./cmd/batcherd") {
		bad("the build must compile ./cmd/batcherd")
	}
	user := last["USER"]
	if user == "" || user == "root" || user == "0" || strings.HasPrefix(user, "0:") || strings.HasPrefix(user, "root:") {
		bad("the runtime stage must set a non-root USER, got %q", user)
	}
	if last["ENTRYPOINT"] != `["/batcherd"]` {
		bad(`ENTRYPOINT must be ["/batcherd"], got %q`, last["ENTRYPOINT"])
	}
	if last["CMD"] != `["serve"]` {
		bad(`CMD must be ["serve"], got %q`, last["CMD"])
	}
	if last["EXPOSE"] != strconv.Itoa(wantPort) {
		bad("EXPOSE must be %d (BATCHERD_HTTP_ADDR default), got %q", wantPort, last["EXPOSE"])
	}
	return errs
}

func TestDockerfile(t *testing.T) {
	text := readFile(t, filepath.Join(repoRoot(t), "Dockerfile"))
	if errs := checkDockerfile(text); len(errs) > 0 {
		t.Fatalf("Dockerfile has %d problem(s):%s", len(errs), errorsText(errs))
	}
	for _, m := range []struct{ old, new, want string }{
		{"EXPOSE 8080", "EXPOSE 9090", "EXPOSE must be"},
		{"USER 65532:65532", "USER root", "non-root USER"},
		{`CMD ["serve"]`, `CMD ["migrate"]`, "CMD must be"},
		{"EXPOSE 8080", "EXPOSE 8080\nHEALTHCHECK CMD [\"/batcherd\",\"version\"]", "HEALTHCHECK"},
	} {
		if !strings.Contains(text, m.old) {
			t.Fatalf("Dockerfile no longer contains %q; update this mutation", m.old)
		}
		if got := errorsText(checkDockerfile(strings.Replace(text, m.old, m.new, 1))); !strings.Contains(got, m.want) {
			t.Errorf("Dockerfile mutation %q → %q not caught (want %q), got:%s", m.old, m.new, m.want, got)
		}
	}
}
