package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	matchingv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	skipv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netinputv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	metadatamatchv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/input_matchers/metadata/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/policy"
)

// knownMetrics is every metric family capsnap registers on /metrics, with
// its type. It must match what capsnap registers (decide, catalog, cache
// and cmd/capsnap); until the test of the metrics wiring scrapes the real
// registry, this list is the contract the alerts and the dashboard are held
// to. Replace it with that scrape, not with a second copy.
var knownMetrics = map[string]string{
	"capsnap_decisions_total":              "counter",
	"capsnap_limit_decisions_total":        "counter",
	"capsnap_check_duration_seconds":       "histogram",
	"capsnap_snapshots_minted_total":       "counter",
	"capsnap_snapshots_active":             "gauge",
	"capsnap_snapshot_invalidations_total": "counter",
	"capsnap_catalog_tools":                "gauge",
	"capsnap_catalog_refreshes_total":      "counter",
	"capsnap_catalog_list_changed_total":   "counter",
	"capsnap_catalog_staleness_seconds":    "gauge",
	"capsnap_policy_reloads_total":         "counter",
	"capsnap_policy_info":                  "gauge",
	"capsnap_snapshot_lookups_total":       "counter",
	"capsnap_deliveries_total":             "counter",
	"capsnap_tools_withheld_total":         "counter",
	"capsnap_delivery_unbound_total":       "counter",
	"capsnap_store_up":                     "gauge",
	"capsnap_store_failures_total":         "counter",
	"capsnap_store_records_rejected_total": "counter",
	"capsnap_store_resyncs_total":          "counter",
	"capsnap_store_sequence_rewound_total": "counter",
}

// The drift reasons, as in deny/deny.go; the drift alert and panel select
// exactly these.
var driftReasons = []string{"schema_drift", "policy_drift", "principal_mismatch", "effect_escalation", "snapshot_expired"}

const (
	root = "../.."
	// extAuthzFilter is the name of the ext_authz HTTP filter, which Istio
	// also gives the one it generates for a CUSTOM policy; per-route
	// settings are keyed by it, and its dynamic metadata (the listing
	// ticket) is under it.
	extAuthzFilter = "envoy.filters.http.ext_authz"
	// extProcFilter is the name of the response path's filter, in
	// envoy/demo.yaml and in examples/istio/response-path.yaml.
	extProcFilter = "capsnap.ext_proc"
	// hcmFilter is the network filter that holds the HTTP filters.
	hcmFilter = "envoy.filters.network.http_connection_manager"
	// capsnapShutdown is how long capsnap may take to stop after SIGTERM:
	// shutdownGrace (cmd/capsnap/serve.go) for in-flight Checks, then as
	// long again for the admin listener.
	capsnapShutdown = 2 * 10 * time.Second
)

func repoPath(elem ...string) string { return filepath.Join(append([]string{root}, elem...)...) }

func readFile(t *testing.T, elem ...string) []byte {
	t.Helper()
	data, err := os.ReadFile(repoPath(elem...))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ---------------------------------------------------------------------------
// YAML documents

// object is one YAML document with the fields every Kubernetes object has.
type object struct {
	file       string
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	node       *yaml.Node
}

type objectMeta struct {
	Name        string            `yaml:"name"`
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// decode decodes the document into v; strict rejects fields v has no place
// for, as the API server does with field validation on.
func (o object) decode(t *testing.T, v any, strict bool) {
	t.Helper()
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	if err := enc.Encode(o.node); err != nil {
		t.Fatalf("%s: %v", o.file, err)
	}
	dec := yaml.NewDecoder(&buf)
	dec.KnownFields(strict)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %s %q: %v", o.file, o.Kind, o.Metadata.Name, err)
	}
}

// readDocs parses every document of a YAML file; empty documents (a
// trailing "---") are errors, since kubectl would skip them silently.
func readDocs(t *testing.T, file string) []object {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var out []object
	for i := 0; ; i++ {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", file, i, err)
		}
		if len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode {
			t.Fatalf("%s: document %d is empty or not a mapping", file, i)
		}
		o := object{file: file, node: &n}
		if err := n.Decode(&o); err != nil {
			t.Fatalf("%s: document %d: %v", file, i, err)
		}
		out = append(out, o)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no YAML documents", file)
	}
	return out
}

func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(repoPath("examples", dir, pat))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatalf("examples/%s: no YAML files", dir)
	}
	slices.Sort(files)
	return files
}

// manifests are the Kubernetes objects of a directory, by kind then name.
type manifests map[string]map[string]object

func loadManifests(t *testing.T, dir string) manifests {
	t.Helper()
	m := manifests{}
	for _, f := range yamlFiles(t, dir) {
		for _, o := range readDocs(t, f) {
			if o.Kind == "Kustomization" {
				continue
			}
			if m[o.Kind] == nil {
				m[o.Kind] = map[string]object{}
			}
			if _, dup := m[o.Kind][o.Metadata.Namespace+"/"+o.Metadata.Name]; dup {
				t.Fatalf("%s: %s %q is defined twice", f, o.Kind, o.Metadata.Name)
			}
			m[o.Kind][o.Metadata.Namespace+"/"+o.Metadata.Name] = o
		}
	}
	return m
}

// one returns the only object of a kind.
func (m manifests) one(t *testing.T, kind string) object {
	t.Helper()
	if len(m[kind]) != 1 {
		t.Fatalf("want exactly one %s, have %d", kind, len(m[kind]))
	}
	for _, o := range m[kind] {
		return o
	}
	panic("unreachable")
}

func (m manifests) all(kind string) []object {
	keys := slices.Sorted(maps.Keys(m[kind]))
	out := make([]object, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[kind][k])
	}
	return out
}

func TestYAMLFilesParse(t *testing.T) {
	for _, dir := range []string{"kubernetes", "kubernetes/redis", "kubernetes/jwt", "istio", "istio/jwt", "prometheus"} {
		for _, f := range yamlFiles(t, dir) {
			docs := readDocs(t, f)
			if dir == "prometheus" {
				continue // rule files and scrape configs are not Kubernetes objects
			}
			for _, o := range docs {
				if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" && o.Kind != "Kustomization" {
					t.Errorf("%s: a document lacks apiVersion, kind or metadata.name", f)
				}
				// The Kubernetes manifests are applied with -n: a namespace
				// written into one would split the deployment.
				if strings.HasPrefix(dir, "kubernetes") && o.Metadata.Namespace != "" {
					t.Errorf("%s: %s %q sets metadata.namespace; leave it to kubectl -n", f, o.Kind, o.Metadata.Name)
				}
			}
		}
	}
}

// No example logs the client's Mcp-Method or Mcp-Name header: clients
// before MCP 2026-07-28 send neither, and on a request capsnap refused
// they say whatever the client chose. An access log names the MCP request
// from capsnap's dynamic metadata (mcp_method, mcp_name), as envoy/*.yaml
// do (envoy/envoy_test.go).
func TestNoExampleLogsMCPHeaders(t *testing.T) {
	raw := regexp.MustCompile(`(?i)%(REQ|REQUEST_HEADER)\([^)]*\bmcp-(method|name)\b`)
	err := filepath.WalkDir(repoPath("examples"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch filepath.Ext(p) {
		case ".yaml", ".yml", ".md":
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if m := raw.Find(data); m != nil {
				t.Errorf("%s reads the client's MCP header: %s; log %%DYNAMIC_METADATA(envoy.filters.http.ext_authz:mcp_method)%% and :mcp_name instead", p, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// kustomization is a kustomization.yaml, decoded strictly.
type kustomization struct {
	APIVersion         string   `yaml:"apiVersion"`
	Kind               string   `yaml:"kind"`
	Resources          []string `yaml:"resources"`
	ConfigMapGenerator []struct {
		Name  string   `yaml:"name"`
		Files []string `yaml:"files"`
	} `yaml:"configMapGenerator"`
}

func TestKustomizationListsEveryManifest(t *testing.T) {
	for _, dir := range []string{"kubernetes", "kubernetes/jwt"} {
		var k kustomization
		docs := readDocs(t, repoPath("examples", dir, "kustomization.yaml"))
		docs[0].decode(t, &k, true)
		var want []string
		for _, f := range yamlFiles(t, dir) {
			if b := filepath.Base(f); b != "kustomization.yaml" {
				want = append(want, b)
			}
		}
		got := slices.Sorted(slices.Values(k.Resources))
		if !slices.Equal(got, want) {
			t.Errorf("examples/%s/kustomization.yaml resources = %v, want every manifest in the directory: %v", dir, got, want)
		}
	}
}

// ---------------------------------------------------------------------------
// Kubernetes

type intOrString struct{ value string }

func (v *intOrString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a port number or name", n.Line)
	}
	v.value = n.Value
	return nil
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	RunAsGroup               *int64 `yaml:"runAsGroup"`
	FSGroup                  *int64 `yaml:"fsGroup"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	Capabilities             struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

type probe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
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
	ReadinessProbe  *probe          `yaml:"readinessProbe"`
	LivenessProbe   *probe          `yaml:"livenessProbe"`
	SecurityContext securityContext `yaml:"securityContext"`
	Resources       struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

// port resolves a probe's or Service's port (a number or a port name).
func (c container) port(p intOrString) (int, bool) {
	if n, err := strconv.Atoi(p.value); err == nil {
		for _, cp := range c.Ports {
			if cp.ContainerPort == n {
				return n, true
			}
		}
		return 0, false
	}
	for _, cp := range c.Ports {
		if cp.Name == p.value {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func (c container) namedPort(t *testing.T, name string) int {
	t.Helper()
	p, ok := c.port(intOrString{name})
	if !ok {
		t.Fatalf("container %s has no port named %q", c.Name, name)
	}
	return p
}

type deployment struct {
	Spec struct {
		Replicas *int `yaml:"replicas"`
		Strategy struct {
			Type          string `yaml:"type"`
			RollingUpdate struct {
				MaxUnavailable *intOrString `yaml:"maxUnavailable"`
			} `yaml:"rollingUpdate"`
		} `yaml:"strategy"`
		Selector labelSelector `yaml:"selector"`
		Template struct {
			Metadata objectMeta `yaml:"metadata"`
			Spec     struct {
				ServiceAccountName            string          `yaml:"serviceAccountName"`
				TerminationGracePeriodSeconds *int            `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               securityContext `yaml:"securityContext"`
				Containers                    []container     `yaml:"containers"`
				Volumes                       []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
					Secret *struct {
						SecretName string `yaml:"secretName"`
					} `yaml:"secret"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type service struct {
	Spec struct {
		Selector map[string]string `yaml:"selector"`
		Ports    []struct {
			Name        string      `yaml:"name"`
			Port        int         `yaml:"port"`
			TargetPort  intOrString `yaml:"targetPort"`
			AppProtocol string      `yaml:"appProtocol"`
		} `yaml:"ports"`
	} `yaml:"spec"`
}

// k8s is the Kubernetes example, decoded and cross-referenced.
type k8s struct {
	m          manifests
	deploy     deployment
	deployName string
	capsnap    container
	service    service
	svcName    string
	cm         map[string]string
	cmName     string
	mountPath  string
	configPath string
	cfg        config.Config
}

func loadK8s(t *testing.T) *k8s {
	t.Helper()
	k := &k8s{m: loadManifests(t, "kubernetes")}
	d := k.m.one(t, "Deployment")
	d.decode(t, &k.deploy, false)
	k.deployName = d.Metadata.Name
	cs := k.deploy.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("Deployment: want one container (capsnap), have %d", len(cs))
	}
	k.capsnap = cs[0]

	s := k.m.one(t, "Service")
	s.decode(t, &k.service, false)
	k.svcName = s.Metadata.Name

	cm := k.m.one(t, "ConfigMap")
	var cmv struct {
		Data map[string]string `yaml:"data"`
	}
	cm.decode(t, &cmv, false)
	k.cm, k.cmName = cmv.Data, cm.Metadata.Name

	// The config file is the --config argument (the image's CMD, which
	// the Dockerfile test compares with it).
	args := k.capsnap.Args
	i := slices.Index(args, "--config")
	if len(k.capsnap.Command) != 0 || len(args) < 3 || args[0] != "serve" || i < 0 || i+1 >= len(args) {
		t.Fatalf("Deployment: args = %q, want the image's entrypoint with serve --config FILE", args)
	}
	k.configPath = args[i+1]
	for _, vm := range k.capsnap.VolumeMounts {
		for _, v := range k.deploy.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == k.cmName {
				k.mountPath = vm.MountPath
				// A subPath mount never receives the ConfigMap's updates,
				// so a policy edit would never be reloaded.
				if vm.SubPath != "" {
					t.Errorf("Deployment: ConfigMap %q is mounted with subPath %q; mount the directory so policy edits reach capsnap", k.cmName, vm.SubPath)
				}
				if !vm.ReadOnly {
					t.Errorf("Deployment: ConfigMap %q is mounted read-write", k.cmName)
				}
			}
		}
	}
	if k.mountPath == "" {
		t.Fatalf("Deployment: ConfigMap %q is not mounted", k.cmName)
	}
	if filepath.Dir(k.configPath) != k.mountPath {
		t.Fatalf("Deployment: --config %s is not in the ConfigMap's mount %s", k.configPath, k.mountPath)
	}
	raw, ok := k.cm[filepath.Base(k.configPath)]
	if !ok {
		t.Fatalf("ConfigMap %q has no key %q for --config %s", k.cmName, filepath.Base(k.configPath), k.configPath)
	}
	cfg, err := config.Parse([]byte(raw))
	if err != nil {
		t.Fatalf("ConfigMap %q: %s: %v", k.cmName, filepath.Base(k.configPath), err)
	}
	k.cfg = cfg
	return k
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s: %v", addr, err)
	}
	return n
}

func hasLabels(have, want map[string]string) bool {
	if len(want) == 0 {
		return false
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func TestDeployment(t *testing.T) {
	k := loadK8s(t)
	d, c, pod := k.deploy.Spec, k.capsnap, k.deploy.Spec.Template.Spec

	// Several replicas give one verdict only if they share the snapshot
	// store, and a rolling update keeps every snapshot only then.
	if d.Replicas == nil || *d.Replicas < 3 {
		t.Errorf("replicas: want at least 3, so that a drain or a rollout never leaves one")
	}
	if k.cfg.Snapshots.Store != config.StoreRedis {
		t.Errorf("%d replicas on snapshots.store %q: a call that reaches another replica than its tools/list is denied no_snapshot; use %s", *d.Replicas, k.cfg.Snapshots.Store, config.StoreRedis)
	}
	if d.Strategy.Type != "RollingUpdate" || d.Strategy.RollingUpdate.MaxUnavailable == nil || d.Strategy.RollingUpdate.MaxUnavailable.value != "0" {
		t.Errorf("strategy %+v: want RollingUpdate with maxUnavailable 0", d.Strategy)
	}
	if k.cfg.Drain <= 0 {
		t.Errorf("drain is 0: a stopping replica would refuse Checks before its endpoint is gone")
	}
	// Every secret is mounted where capsnap.yaml reads it, from a Secret,
	// never from the ConfigMap, as a directory (a subPath mount never sees
	// a rotation).
	for field, file := range map[string]string{
		"snapshots.redis.secret_file": k.cfg.Snapshots.Redis.SecretFile,
		"grpc_tls.cert_file":          k.cfg.GRPCTLS.CertFile,
		"grpc_tls.key_file":           k.cfg.GRPCTLS.KeyFile,
		"grpc_tls.client_ca_file":     k.cfg.GRPCTLS.ClientCAFile,
		"admin.token_file":            k.cfg.Admin.TokenFile,
	} {
		if file == "" {
			continue
		}
		mounted := false
		for _, vm := range c.VolumeMounts {
			for _, v := range pod.Volumes {
				if v.Name == vm.Name && v.Secret != nil && vm.MountPath == path.Dir(file) && vm.SubPath == "" && vm.ReadOnly {
					mounted = true
				}
			}
		}
		if !mounted {
			t.Errorf("%s %s is not in a Secret mounted read-only as a directory", field, file)
		}
	}
	// The files of a Secret are root's; capsnap reads them through the
	// group the kubelet gives them.
	if pod.SecurityContext.FSGroup == nil || pod.SecurityContext.RunAsGroup == nil || *pod.SecurityContext.FSGroup != *pod.SecurityContext.RunAsGroup {
		t.Errorf("pod securityContext: fsGroup must be capsnap's group, or it cannot read its Secrets (mode 0440)")
	}
	labels := k.deploy.Spec.Template.Metadata.Labels
	if !hasLabels(labels, d.Selector.MatchLabels) {
		t.Errorf("selector %v does not select the pod template's labels %v", d.Selector.MatchLabels, labels)
	}
	if sa := k.m.one(t, "ServiceAccount").Metadata.Name; pod.ServiceAccountName != sa {
		t.Errorf("serviceAccountName %q, want the ServiceAccount %q (Istio exempts capsnap by it)", pod.ServiceAccountName, sa)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= k.cfg.Drain+capsnapShutdown {
		t.Errorf("terminationGracePeriodSeconds must exceed capsnap's drain and shutdown (%s), or SIGKILL cuts in-flight Checks", k.cfg.Drain+capsnapShutdown)
	}

	// Ports: the ones capsnap.yaml listens on.
	grpcPort, adminPort := c.namedPort(t, "grpc"), c.namedPort(t, "admin")
	if p := portOf(t, k.cfg.GRPCAddr); p != grpcPort {
		t.Errorf("container port grpc %d, but capsnap.yaml grpc_addr is %s", grpcPort, k.cfg.GRPCAddr)
	}
	if p := portOf(t, k.cfg.AdminAddr); p != adminPort {
		t.Errorf("container port admin %d, but capsnap.yaml admin_addr is %s", adminPort, k.cfg.AdminAddr)
	}
	for _, addr := range []string{k.cfg.GRPCAddr, k.cfg.AdminAddr} {
		if h, _, _ := net.SplitHostPort(addr); h != "0.0.0.0" && h != "" && h != "::" {
			t.Errorf("capsnap.yaml listens on %s; Envoy, the kubelet and Prometheus dial the pod IP", addr)
		}
	}

	// Probes.
	for _, p := range []struct {
		name string
		pr   *probe
		path string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if p.pr == nil || p.pr.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe of %s", p.name, p.path)
			continue
		}
		if p.pr.HTTPGet.Path != p.path {
			t.Errorf("%s path %q, want %s", p.name, p.pr.HTTPGet.Path, p.path)
		}
		if port, ok := c.port(p.pr.HTTPGet.Port); !ok || port != adminPort {
			t.Errorf("%s port %q, want the admin port %d", p.name, p.pr.HTTPGet.Port.value, adminPort)
		}
	}

	checkHardened(t, pod.SecurityContext, c)

	// Prometheus finds the admin port by the pod's annotations.
	ann := k.deploy.Spec.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(adminPort) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape \"true\", port %d, path /metrics", ann, adminPort)
	}
}

// checkHardened holds a pod and its container to running non-root,
// read-only, without privileges, and within requested resources.
func checkHardened(t *testing.T, pod securityContext, c container) {
	t.Helper()
	for name, sc := range map[string]securityContext{"pod": pod, "container " + c.Name: c.SecurityContext} {
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s securityContext: runAsNonRoot must be true", name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s securityContext: runAsUser 0", name)
		}
	}
	sc := c.SecurityContext
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container %s securityContext: readOnlyRootFilesystem must be true", c.Name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container %s securityContext: allowPrivilegeEscalation must be false", c.Name)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) != 0 {
		t.Errorf("container %s securityContext: capabilities must drop ALL and add none, have %+v", c.Name, sc.Capabilities)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		t.Errorf("container %s resources: want cpu and memory requests and a memory limit, have %+v", c.Name, c.Resources)
	}
}

func TestService(t *testing.T) {
	k := loadK8s(t)
	s := k.service.Spec
	if !hasLabels(k.deploy.Spec.Template.Metadata.Labels, s.Selector) {
		t.Errorf("Service selector %v does not select capsnap's pods", s.Selector)
	}
	want := map[string]int{"grpc": k.capsnap.namedPort(t, "grpc"), "admin": k.capsnap.namedPort(t, "admin")}
	for _, p := range s.Ports {
		target, ok := k.capsnap.port(p.TargetPort)
		if !ok {
			t.Errorf("Service port %s: targetPort %q is no container port", p.Name, p.TargetPort.value)
		}
		if w, ok := want[p.Name]; ok {
			if p.Port != w || target != w {
				t.Errorf("Service port %s: %d -> %d, want %d -> %d", p.Name, p.Port, target, w, w)
			}
			delete(want, p.Name)
		}
		if p.Name == "grpc" && p.AppProtocol != "grpc" {
			t.Errorf("Service port grpc: appProtocol %q, want grpc so that meshes speak HTTP/2 to it", p.AppProtocol)
		}
	}
	if len(want) != 0 {
		t.Errorf("Service lacks ports %v", slices.Sorted(maps.Keys(want)))
	}
}

func TestPodDisruptionBudget(t *testing.T) {
	k := loadK8s(t)
	var pdb struct {
		Spec struct {
			MinAvailable   *intOrString  `yaml:"minAvailable"`
			MaxUnavailable *intOrString  `yaml:"maxUnavailable"`
			Selector       labelSelector `yaml:"selector"`
		} `yaml:"spec"`
	}
	k.m.one(t, "PodDisruptionBudget").decode(t, &pdb, false)
	if !hasLabels(k.deploy.Spec.Template.Metadata.Labels, pdb.Spec.Selector.MatchLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not select capsnap's pods", pdb.Spec.Selector.MatchLabels)
	}
	if (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
		t.Errorf("PodDisruptionBudget: set exactly one of minAvailable and maxUnavailable")
	}
	// A budget that allows no eviction blocks every node drain.
	if m := pdb.Spec.MinAvailable; m != nil {
		if n, err := strconv.Atoi(m.value); err != nil || n < 1 || n >= *k.deploy.Spec.Replicas {
			t.Errorf("PodDisruptionBudget minAvailable %q: want 1..%d, below the %d replicas", m.value, *k.deploy.Spec.Replicas-1, *k.deploy.Spec.Replicas)
		}
	}
}

// The development Redis of examples/kubernetes/redis is the one
// capsnap.yaml names, reachable by capsnap's pods alone, and never evicts
// the keys capsnap keeps without a TTL.
func TestDevelopmentRedis(t *testing.T) {
	k := loadK8s(t)
	m := loadManifests(t, "kubernetes/redis")
	host, port, err := net.SplitHostPort(k.cfg.Snapshots.Redis.Addr)
	if err != nil {
		t.Fatal(err)
	}
	var svc service
	svcObj, ok := m["Service"]["/"+host] // applied with -n: no namespace
	if !ok {
		t.Fatalf("snapshots.redis.addr %s: examples/kubernetes/redis has no Service %q", k.cfg.Snapshots.Redis.Addr, host)
	}
	svcObj.decode(t, &svc, false)
	if len(svc.Spec.Ports) != 1 || strconv.Itoa(svc.Spec.Ports[0].Port) != port {
		t.Errorf("Service %s ports %+v, want %s", host, svc.Spec.Ports, port)
	}
	var sts struct {
		Spec struct {
			Template struct {
				Metadata objectMeta `yaml:"metadata"`
				Spec     struct {
					Containers []struct {
						Args []string `yaml:"args"`
					} `yaml:"containers"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	m.one(t, "StatefulSet").decode(t, &sts, false)
	if !hasLabels(sts.Spec.Template.Metadata.Labels, svc.Spec.Selector) {
		t.Errorf("Service %s does not select the Redis pods", host)
	}
	args := strings.Join(sts.Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--maxmemory-policy noeviction") {
		t.Errorf("Redis args %q: want --maxmemory-policy noeviction (the invalidation keys have no TTL)", args)
	}
	var np struct {
		Spec struct {
			PodSelector labelSelector `yaml:"podSelector"`
			Ingress     []struct {
				From []struct {
					PodSelector       *labelSelector `yaml:"podSelector"`
					NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
				} `yaml:"from"`
			} `yaml:"ingress"`
		} `yaml:"spec"`
	}
	m.one(t, "NetworkPolicy").decode(t, &np, false)
	if !hasLabels(sts.Spec.Template.Metadata.Labels, np.Spec.PodSelector.MatchLabels) {
		t.Errorf("the Redis NetworkPolicy does not select the Redis pods")
	}
	for _, in := range np.Spec.Ingress {
		for _, f := range in.From {
			if f.NamespaceSelector != nil || f.PodSelector == nil || !hasLabels(k.deploy.Spec.Template.Metadata.Labels, f.PodSelector.MatchLabels) {
				t.Errorf("the Redis NetworkPolicy admits %+v, want capsnap's pods only", f)
			}
		}
	}
}

// networkPolicy is the part of a NetworkPolicy these tests read.
type networkPolicy struct {
	Spec struct {
		PodSelector labelSelector `yaml:"podSelector"`
		PolicyTypes []string      `yaml:"policyTypes"`
		Ingress     []struct {
			From []struct {
				NamespaceSelector *labelSelector `yaml:"namespaceSelector"`
				PodSelector       *labelSelector `yaml:"podSelector"`
			} `yaml:"from"`
			Ports []struct {
				Port intOrString `yaml:"port"`
			} `yaml:"ports"`
		} `yaml:"ingress"`
	} `yaml:"spec"`
}

func TestNetworkPolicy(t *testing.T) {
	k := loadK8s(t)
	var np networkPolicy
	k.m.one(t, "NetworkPolicy").decode(t, &np, false)
	if !hasLabels(k.deploy.Spec.Template.Metadata.Labels, np.Spec.PodSelector.MatchLabels) {
		t.Errorf("NetworkPolicy podSelector %v does not select capsnap's pods", np.Spec.PodSelector.MatchLabels)
	}
	open := map[int]bool{}
	for i, in := range np.Spec.Ingress {
		// A rule without from admits every pod, and anyone who can call
		// Check can claim any principal.
		if len(in.From) == 0 {
			t.Errorf("NetworkPolicy ingress[%d] admits every source", i)
		}
		for _, p := range in.Ports {
			port, ok := k.capsnap.port(p.Port)
			if !ok {
				if n, err := strconv.Atoi(p.Port.value); err == nil {
					port = n // a sidecar's port, such as Istio's 15020
				}
			}
			open[port] = true
		}
	}
	for _, name := range []string{"grpc", "admin"} {
		if p := k.capsnap.namedPort(t, name); !open[p] {
			t.Errorf("NetworkPolicy admits nobody to the %s port %d", name, p)
		}
	}
}

// Who may call capsnap: the grpc port requires client certificates of the
// MCP servers' Envoys, whose namespaces are the ones the NetworkPolicy lets
// reach it, and the admin listener's reload needs a token.
func TestWhoMayCallCapsnap(t *testing.T) {
	k := loadK8s(t)
	g := k.cfg.GRPCTLS
	if !g.Enabled() {
		t.Fatal("capsnap.yaml: no grpc_tls; whoever reaches the grpc port could call Check as any principal")
	}
	var np networkPolicy
	k.m.one(t, "NetworkPolicy").decode(t, &np, false)
	grpcPort := k.capsnap.namedPort(t, "grpc")
	admitted := map[string]bool{}
	for _, in := range np.Spec.Ingress {
		for _, p := range in.Ports {
			if port, ok := k.capsnap.port(p.Port); ok && port == grpcPort {
				for _, f := range in.From {
					if f.NamespaceSelector != nil {
						admitted[f.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]] = true
					}
				}
			}
		}
	}
	for _, id := range g.AllowedClients {
		m := regexp.MustCompile(`^spiffe://[^/]+/ns/([^/]+)/sa/[^/]+$`).FindStringSubmatch(id)
		if m == nil {
			t.Errorf("grpc_tls.allowed_clients: %q is not a workload's SPIFFE ID (spiffe://<trust-domain>/ns/<namespace>/sa/<account>)", id)
			continue
		}
		if !admitted[m[1]] {
			t.Errorf("grpc_tls.allowed_clients: %q is in namespace %s, which the NetworkPolicy does not let reach the grpc port %d", id, m[1], grpcPort)
		}
	}
	if k.cfg.Admin.TokenFile == "" {
		t.Error("capsnap.yaml: no admin.token_file; POST /policy/reload would be open to whoever reaches the admin port")
	}
}

func TestConfigMap(t *testing.T) {
	k := loadK8s(t)
	cfg := k.cfg
	if cfg.Principal.Source != config.SourceMTLS {
		t.Errorf("principal.source %q: in a cluster the principal must come from the verified peer certificate (mtls)", cfg.Principal.Source)
	}
	if filepath.Dir(cfg.PolicyFile) != k.mountPath {
		t.Errorf("policy_file %s is not in the ConfigMap's mount %s", cfg.PolicyFile, k.mountPath)
	}

	// The response path: the examples put Envoy's ext_proc filter in front
	// (examples/istio/response-path.yaml), so the snapshot binds what the
	// agent is delivered; and the ConfigMap says so, not the defaults.
	var written struct {
		Discovery struct {
			Bind             *string `yaml:"bind"`
			MaxResponseBytes *int    `yaml:"max_response_bytes"`
		} `yaml:"discovery"`
	}
	if err := yaml.Unmarshal([]byte(k.cm[filepath.Base(k.configPath)]), &written); err != nil {
		t.Fatal(err)
	}
	if written.Discovery.Bind == nil || written.Discovery.MaxResponseBytes == nil {
		t.Errorf("capsnap.yaml: write out discovery.bind and discovery.max_response_bytes; they must agree with the Envoy in front")
	}
	if cfg.Discovery.Bind != config.BindDelivered {
		t.Errorf("discovery.bind %q: the examples run the response path; want %q", cfg.Discovery.Bind, config.BindDelivered)
	}
	// Envoy buffers a tools/list response up to the ext_authz filter's
	// max_request_bytes, the same bound as the request body's (TestIstio
	// holds the mesh config's maxRequestBytes to both).
	if cfg.Discovery.MaxResponseBytes != cfg.Limits.MaxBodyBytes {
		t.Errorf("discovery.max_response_bytes %d, but limits.max_body_bytes %d: Envoy's one max_request_bytes bounds both; keep them equal", cfg.Discovery.MaxResponseBytes, cfg.Limits.MaxBodyBytes)
	}
	raw, ok := k.cm[filepath.Base(cfg.PolicyFile)]
	if !ok {
		t.Fatalf("ConfigMap has no key %q for policy_file %s", filepath.Base(cfg.PolicyFile), cfg.PolicyFile)
	}
	p, err := policy.Parse([]byte(raw))
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", filepath.Base(cfg.PolicyFile), err)
	}
	if lf := p.Lockfile(); lf != "" {
		if _, ok := k.cm[path.Base(lf)]; !ok || (filepath.IsAbs(lf) && filepath.Dir(lf) != k.mountPath) {
			t.Errorf("the policy names lockfile %s, which the ConfigMap does not provide", lf)
		}
	}
	// The example ships the seed policy the demo runs.
	seed, err := policy.Parse(readFile(t, "examples", "demo", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Digest() != seed.Digest() {
		t.Errorf("the ConfigMap's policy (%s) is not examples/demo/policy.yaml (%s); copy it again", p.Digest(), seed.Digest())
	}

	servers := map[string]config.Server{}
	for _, s := range cfg.Servers {
		servers[s.ID] = s
	}
	if u, err := url.Parse(servers["billing"].URL); err != nil || u.Hostname() != "billing.mcp.svc.cluster.local" {
		t.Errorf("server billing: url %q, want the billing Service billing.mcp.svc.cluster.local", servers["billing"].URL)
	}
	// A server the policy classifies tools of but capsnap does not watch
	// can never be called; one capsnap watches but the policy never
	// mentions holds /readyz for nothing.
	var pf struct {
		Tools []struct {
			Server string `yaml:"server"`
		} `yaml:"tools"`
	}
	if err := yaml.Unmarshal([]byte(raw), &pf); err != nil {
		t.Fatal(err)
	}
	inPolicy := map[string]bool{}
	for _, tl := range pf.Tools {
		inPolicy[tl.Server] = true
		if _, ok := servers[tl.Server]; !ok {
			t.Errorf("the policy classifies tools of server %q, which capsnap.yaml does not configure", tl.Server)
		}
	}
	for id := range servers {
		if !inPolicy[id] {
			t.Errorf("capsnap.yaml configures server %q, which the policy never mentions", id)
		}
	}
}

// ---------------------------------------------------------------------------
// Istio

type grpcProvider struct {
	Service                   string `yaml:"service"`
	Port                      uint32 `yaml:"port"`
	Timeout                   string `yaml:"timeout"`
	FailOpen                  *bool  `yaml:"failOpen"`
	StatusOnError             string `yaml:"statusOnError"`
	IncludeRequestBodyInCheck *struct {
		MaxRequestBytes     int   `yaml:"maxRequestBytes"`
		AllowPartialMessage *bool `yaml:"allowPartialMessage"`
		PackAsBytes         *bool `yaml:"packAsBytes"`
	} `yaml:"includeRequestBodyInCheck"`
}

// The fields of Istio's MeshConfig.ExtensionProvider and
// EnvoyExternalAuthorizationGrpcProvider, decoded strictly so that a
// misspelt field (which istiod would reject) fails here.
type istioOperator struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	Spec       struct {
		MeshConfig struct {
			ExtensionProviders []struct {
				Name              string         `yaml:"name"`
				EnvoyExtAuthzGrpc *grpcProvider  `yaml:"envoyExtAuthzGrpc"`
				EnvoyExtAuthzHTTP map[string]any `yaml:"envoyExtAuthzHttp"`
			} `yaml:"extensionProviders"`
		} `yaml:"meshConfig"`
	} `yaml:"spec"`
}

type authorizationPolicy struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	Spec       struct {
		Selector   *labelSelector      `yaml:"selector"`
		TargetRefs []map[string]string `yaml:"targetRefs"`
		Action     string              `yaml:"action"`
		Provider   *struct {
			Name string `yaml:"name"`
		} `yaml:"provider"`
		Rules []struct {
			From []struct {
				Source map[string][]string `yaml:"source"`
			} `yaml:"from"`
			To []struct {
				Operation map[string][]string `yaml:"operation"`
			} `yaml:"to"`
			When []map[string]any `yaml:"when"`
		} `yaml:"rules"`
	} `yaml:"spec"`
}

var (
	istioSourceFields    = []string{"principals", "notPrincipals", "requestPrincipals", "notRequestPrincipals", "namespaces", "notNamespaces", "serviceAccounts", "notServiceAccounts", "ipBlocks", "notIpBlocks", "remoteIpBlocks", "notRemoteIpBlocks"}
	istioOperationFields = []string{"hosts", "notHosts", "ports", "notPorts", "methods", "notMethods", "paths", "notPaths"}
)

type envoyFilter struct {
	APIVersion string     `yaml:"apiVersion"`
	Kind       string     `yaml:"kind"`
	Metadata   objectMeta `yaml:"metadata"`
	Spec       struct {
		WorkloadSelector *struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"workloadSelector"`
		ConfigPatches []struct {
			ApplyTo string `yaml:"applyTo"`
			Match   struct {
				Context            string         `yaml:"context"`
				Proxy              map[string]any `yaml:"proxy"`
				Listener           *listenerMatch `yaml:"listener"`
				RouteConfiguration map[string]any `yaml:"routeConfiguration"`
				Cluster            map[string]any `yaml:"cluster"`
			} `yaml:"match"`
			Patch struct {
				Operation   string         `yaml:"operation"`
				FilterClass string         `yaml:"filterClass"`
				Value       map[string]any `yaml:"value"`
			} `yaml:"patch"`
		} `yaml:"configPatches"`
		Priority int `yaml:"priority"`
	} `yaml:"spec"`
}

// listenerMatch is Istio's EnvoyFilter.ListenerMatch.
type listenerMatch struct {
	PortNumber  uint32 `yaml:"portNumber"`
	PortName    string `yaml:"portName"`
	Name        string `yaml:"name"`
	FilterChain *struct {
		Name                 string `yaml:"name"`
		Sni                  string `yaml:"sni"`
		TransportProtocol    string `yaml:"transportProtocol"`
		ApplicationProtocols string `yaml:"applicationProtocols"`
		DestinationPort      uint32 `yaml:"destinationPort"`
		Filter               *struct {
			Name      string `yaml:"name"`
			SubFilter *struct {
				Name string `yaml:"name"`
			} `yaml:"subFilter"`
		} `yaml:"filter"`
	} `yaml:"filterChain"`
	ListenerFilter string `yaml:"listenerFilter"`
}

// serverIDs returns the server_id each patch sets on the ext_authz filter's
// per-route settings, decoded as Envoy's own ExtAuthzPerRoute so that a
// wrong field name or type URL fails here rather than in istiod's log.
func (f envoyFilter) serverIDs(t *testing.T) []string {
	t.Helper()
	var ids []string
	for i, p := range f.Spec.ConfigPatches {
		cfg, ok := p.Patch.Value["typed_per_filter_config"].(map[string]any)
		if !ok {
			cfg, ok = p.Patch.Value["typedPerFilterConfig"].(map[string]any)
		}
		if !ok {
			continue
		}
		raw, ok := cfg[extAuthzFilter]
		if !ok {
			t.Errorf("EnvoyFilter %s patch %d: typed_per_filter_config has no %s", f.Metadata.Name, i, extAuthzFilter)
			continue
		}
		if p.ApplyTo != "VIRTUAL_HOST" && p.ApplyTo != "HTTP_ROUTE" {
			t.Errorf("EnvoyFilter %s patch %d: applyTo %s; per-route settings go on VIRTUAL_HOST or HTTP_ROUTE", f.Metadata.Name, i, p.ApplyTo)
		}
		if p.Match.Context != "SIDECAR_INBOUND" || p.Patch.Operation != "MERGE" {
			t.Errorf("EnvoyFilter %s patch %d: want context SIDECAR_INBOUND and operation MERGE, have %s %s", f.Metadata.Name, i, p.Match.Context, p.Patch.Operation)
		}
		js, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		var a anypb.Any
		if err := protojson.Unmarshal(js, &a); err != nil {
			t.Errorf("EnvoyFilter %s patch %d: %s: %v", f.Metadata.Name, i, extAuthzFilter, err)
			continue
		}
		var per extauthzv3.ExtAuthzPerRoute
		if err := a.UnmarshalTo(&per); err != nil {
			t.Errorf("EnvoyFilter %s patch %d: not an ExtAuthzPerRoute: %v", f.Metadata.Name, i, err)
			continue
		}
		if err := per.ValidateAll(); err != nil {
			t.Errorf("EnvoyFilter %s patch %d: %v", f.Metadata.Name, i, err)
		}
		id := per.GetCheckSettings().GetContextExtensions()["server_id"]
		if id == "" {
			t.Errorf("EnvoyFilter %s patch %d: sets no context_extensions.server_id", f.Metadata.Name, i)
			continue
		}
		ids = append(ids, id)
	}
	return ids
}

// responsePath is one patch that inserts the response path's ext_proc
// filter, decoded as Envoy's own messages.
type responsePath struct {
	patch   int
	filter  *hcmv3.HttpFilter
	matcher *matchingv3.ExtensionWithMatcher
	proc    *extprocv3.ExternalProcessor
}

// decodeExtProc decodes an HTTP filter as Envoy would: the
// ExtensionWithMatcher and the ExternalProcessor it wraps, each validated.
// It returns a nil matcher and processor, and no error, for a filter that
// is neither; a bare ExternalProcessor is an error, since it would buffer
// every response.
func decodeExtProc(raw any) (*hcmv3.HttpFilter, *matchingv3.ExtensionWithMatcher, *extprocv3.ExternalProcessor, error) {
	js, err := json.Marshal(raw)
	if err != nil {
		return nil, nil, nil, err
	}
	var hf hcmv3.HttpFilter
	if err := protojson.Unmarshal(js, &hf); err != nil {
		return nil, nil, nil, fmt.Errorf("not an HttpFilter: %w", err)
	}
	if err := hf.ValidateAll(); err != nil {
		return nil, nil, nil, err
	}
	if hf.GetTypedConfig().MessageIs(&extprocv3.ExternalProcessor{}) {
		return nil, nil, nil, errors.New("a bare ext_proc filter; wrap it in the ExtensionWithMatcher that skips it unless the request was an allowed tools/list, or it buffers every response")
	}
	var ewm matchingv3.ExtensionWithMatcher
	if !hf.GetTypedConfig().MessageIs(&ewm) {
		return &hf, nil, nil, nil
	}
	if err := hf.GetTypedConfig().UnmarshalTo(&ewm); err != nil {
		return nil, nil, nil, err
	}
	if err := ewm.ValidateAll(); err != nil {
		return nil, nil, nil, err
	}
	var proc extprocv3.ExternalProcessor
	if !ewm.GetExtensionConfig().GetTypedConfig().MessageIs(&proc) {
		return &hf, nil, nil, nil
	}
	if err := ewm.GetExtensionConfig().GetTypedConfig().UnmarshalTo(&proc); err != nil {
		return nil, nil, nil, err
	}
	if err := proc.ValidateAll(); err != nil {
		return nil, nil, nil, err
	}
	return &hf, &ewm, &proc, nil
}

// responsePaths returns the patches that insert the ext_proc filter.
func (f envoyFilter) responsePaths(t *testing.T) []responsePath {
	t.Helper()
	var out []responsePath
	for i, p := range f.Spec.ConfigPatches {
		if p.ApplyTo != "HTTP_FILTER" {
			continue
		}
		hf, ewm, proc, err := decodeExtProc(p.Patch.Value)
		if err != nil {
			t.Errorf("EnvoyFilter %s patch %d: %v", f.Metadata.Name, i, err)
			continue
		}
		if proc != nil {
			out = append(out, responsePath{patch: i, filter: hf, matcher: ewm, proc: proc})
		}
	}
	return out
}

// skipsExtProc evaluates the filter's matcher as Envoy does (the first
// matcher that matches decides, else on_no_match) for a request whose
// ext_authz dynamic metadata has, or lacks, capsnap's decision: whether the
// filter is skipped. It knows only the input, matcher and action the filter
// is written with, and fails on anything else rather than guess.
func skipsExtProc(ewm *matchingv3.ExtensionWithMatcher, decided bool) (bool, error) {
	m := ewm.GetXdsMatcher()
	if m == nil || m.GetMatcherList() == nil {
		return false, errors.New("want an xds_matcher with a matcher_list")
	}
	skip := func(where string, a *anypb.Any) (bool, error) {
		if !a.MessageIs(&skipv3.SkipFilter{}) {
			return false, fmt.Errorf("%s: action %s, want SkipFilter", where, a.GetTypeUrl())
		}
		return true, nil
	}
	for i, fm := range m.GetMatcherList().GetMatchers() {
		sp := fm.GetPredicate().GetSinglePredicate()
		if sp == nil {
			return false, fmt.Errorf("matcher %d: want a single_predicate", i)
		}
		var in netinputv3.DynamicMetadataInput
		if err := sp.GetInput().GetTypedConfig().UnmarshalTo(&in); err != nil {
			return false, fmt.Errorf("matcher %d: input: want DynamicMetadataInput: %v", i, err)
		}
		if in.GetFilter() != extAuthzFilter || len(in.GetPath()) != 1 || in.GetPath()[0].GetKey() != "decision" {
			return false, fmt.Errorf("matcher %d: input reads %s %v, want the key decision of %s's metadata", i, in.GetFilter(), in.GetPath(), extAuthzFilter)
		}
		var mm metadatamatchv3.Metadata
		if err := sp.GetCustomMatch().GetTypedConfig().UnmarshalTo(&mm); err != nil {
			return false, fmt.Errorf("matcher %d: custom_match: want the Metadata input matcher: %v", i, err)
		}
		if !mm.GetValue().GetPresentMatch() {
			return false, fmt.Errorf("matcher %d: want value present_match: true (the decision's value is capsnap's to read)", i)
		}
		if decided == mm.GetInvert() {
			continue // no match
		}
		if fm.GetOnMatch().GetAction() == nil || fm.GetOnMatch().GetKeepMatching() {
			return false, fmt.Errorf("matcher %d: on_match: want an action, and no keep_matching", i)
		}
		return skip(fmt.Sprintf("matcher %d", i), fm.GetOnMatch().GetAction().GetTypedConfig())
	}
	if om := m.GetOnNoMatch(); om != nil {
		if om.GetAction() == nil {
			return false, errors.New("on_no_match: want an action")
		}
		return skip("on_no_match", om.GetAction().GetTypedConfig())
	}
	return false, nil
}

// demoExtProc is the response path's filter in envoy/demo.yaml, which the
// end-to-end tests run against the real Envoy.
func demoExtProc(t *testing.T) *hcmv3.HttpFilter {
	t.Helper()
	var demo struct {
		StaticResources struct {
			Listeners []struct {
				FilterChains []struct {
					Filters []struct {
						Name        string `yaml:"name"`
						TypedConfig struct {
							HTTPFilters []map[string]any `yaml:"http_filters"`
						} `yaml:"typed_config"`
					} `yaml:"filters"`
				} `yaml:"filter_chains"`
			} `yaml:"listeners"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal(readFile(t, "envoy", "demo.yaml"), &demo); err != nil {
		t.Fatalf("envoy/demo.yaml: %v", err)
	}
	var found []*hcmv3.HttpFilter
	for _, l := range demo.StaticResources.Listeners {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				if f.Name != hcmFilter {
					continue
				}
				for _, hf := range f.TypedConfig.HTTPFilters {
					if hf["name"] != extProcFilter {
						continue
					}
					d, _, proc, err := decodeExtProc(hf)
					if err != nil || proc == nil {
						t.Fatalf("envoy/demo.yaml: %s: not a matcher-wrapped ext_proc filter (%v)", extProcFilter, err)
					}
					found = append(found, d)
				}
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("envoy/demo.yaml: %d %s filters, want one", len(found), extProcFilter)
	}
	return found[0]
}

// withoutService is an ext_proc filter with its grpc_service cleared: the
// part that is the same in every Envoy, whatever its cluster for capsnap.
func withoutService(t *testing.T, hf *hcmv3.HttpFilter) *hcmv3.HttpFilter {
	t.Helper()
	out := proto.Clone(hf).(*hcmv3.HttpFilter)
	var ewm matchingv3.ExtensionWithMatcher
	var proc extprocv3.ExternalProcessor
	if err := out.GetTypedConfig().UnmarshalTo(&ewm); err != nil {
		t.Fatal(err)
	}
	if err := ewm.GetExtensionConfig().GetTypedConfig().UnmarshalTo(&proc); err != nil {
		t.Fatal(err)
	}
	proc.GrpcService = nil
	var err error
	if ewm.ExtensionConfig.TypedConfig, err = anypb.New(&proc); err != nil {
		t.Fatal(err)
	}
	if out.ConfigType.(*hcmv3.HttpFilter_TypedConfig).TypedConfig, err = anypb.New(&ewm); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkResponsePath holds one response-path patch to what the response
// path needs, to envoy/demo.yaml's filter, and to the capsnap provider's
// service and port.
func checkResponsePath(t *testing.T, f envoyFilter, rp responsePath, demo *hcmv3.HttpFilter, provider *grpcProvider) {
	t.Helper()
	where := fmt.Sprintf("EnvoyFilter %s patch %d", f.Metadata.Name, rp.patch)
	p := f.Spec.ConfigPatches[rp.patch]

	// Where: in the MCP server's inbound sidecar, right after the ext_authz
	// filter whose metadata it reads. Without the subFilter Istio would
	// append it after the router, where it never runs.
	if p.Match.Context != "SIDECAR_INBOUND" || p.Patch.Operation != "INSERT_AFTER" {
		t.Errorf("%s: want context SIDECAR_INBOUND and operation INSERT_AFTER, have %s %s", where, p.Match.Context, p.Patch.Operation)
	}
	l := p.Match.Listener
	if l == nil || l.FilterChain == nil || l.FilterChain.Filter == nil || l.FilterChain.Filter.Name != hcmFilter ||
		l.FilterChain.Filter.SubFilter == nil || l.FilterChain.Filter.SubFilter.Name != extAuthzFilter {
		t.Errorf("%s: want match.listener.filterChain.filter %s with subFilter %s", where, hcmFilter, extAuthzFilter)
	} else if l.PortNumber != 0 || l.PortName != "" || l.Name != "" || l.FilterChain.Name != "" || l.FilterChain.DestinationPort != 0 ||
		l.FilterChain.Sni != "" || l.FilterChain.TransportProtocol != "" || l.FilterChain.ApplicationProtocols != "" {
		// Every HTTP filter chain that has ext_authz must have ext_proc.
		t.Errorf("%s: the listener match is narrowed; a filter chain with ext_authz and without ext_proc denies every tools/call no_snapshot", where)
	}
	if rp.filter.GetName() != extProcFilter {
		t.Errorf("%s: filter name %q, want %q as in envoy/demo.yaml", where, rp.filter.GetName(), extProcFilter)
	}
	if n := rp.matcher.GetExtensionConfig().GetName(); n != "envoy.filters.http.ext_proc" {
		t.Errorf("%s: extension_config.name %q, want envoy.filters.http.ext_proc", where, n)
	}

	// Which responses: every answer to a request capsnap decided (a
	// listing can come on any stream), and none of those it never saw
	// (its own catalog requests, exempt from the CUSTOM policy).
	absent, err1 := skipsExtProc(rp.matcher, false)
	present, err2 := skipsExtProc(rp.matcher, true)
	switch {
	case err1 != nil || err2 != nil:
		t.Errorf("%s: matcher: %v", where, errors.Join(err1, err2))
	case !absent:
		t.Errorf("%s: the matcher does not skip requests capsnap never decided: its own catalog's listings would be withheld", where)
	case present:
		t.Errorf("%s: the matcher skips answers capsnap decided: a listing on any stream but its own would reach the agent unscreened", where)
	}

	// How.
	proc := rp.proc
	if proc.GetFailureModeAllow() {
		t.Errorf("%s: failure_mode_allow must be false: a list capsnap did not read would reach the agent", where)
	}
	if proc.GetStatusOnError().GetCode() != typev3.StatusCode_ServiceUnavailable {
		t.Errorf("%s: status_on_error %v, want ServiceUnavailable", where, proc.GetStatusOnError().GetCode())
	}
	pm := proc.GetProcessingMode()
	for _, m := range []struct {
		field      string
		have, want fmt.Stringer
	}{
		{"request_header_mode", pm.GetRequestHeaderMode(), extprocv3.ProcessingMode_SKIP},
		{"request_body_mode", pm.GetRequestBodyMode(), extprocv3.ProcessingMode_NONE},
		{"request_trailer_mode", pm.GetRequestTrailerMode(), extprocv3.ProcessingMode_SKIP},
		{"response_header_mode", pm.GetResponseHeaderMode(), extprocv3.ProcessingMode_SEND},
		{"response_body_mode", pm.GetResponseBodyMode(), extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		{"response_trailer_mode", pm.GetResponseTrailerMode(), extprocv3.ProcessingMode_SEND},
	} {
		if m.have != m.want {
			t.Errorf("%s: processing_mode.%s %v, want %v", where, m.field, m.have, m.want)
		}
	}
	if !slices.Contains(proc.GetMetadataOptions().GetForwardingNamespaces().GetUntyped(), extAuthzFilter) {
		t.Errorf("%s: metadata_options.forwarding_namespaces.untyped lacks %s: capsnap would get no listing ticket", where, extAuthzFilter)
	}

	// To whom: the sidecar's cluster for the capsnap provider, which Istio
	// names outbound|<port>||<service>; the authority is the service, since
	// Envoy would send the cluster name, and "|" is no valid authority.
	eg := proc.GetGrpcService().GetEnvoyGrpc()
	if provider != nil {
		if want := fmt.Sprintf("outbound|%d||%s", provider.Port, provider.Service); eg.GetClusterName() != want {
			t.Errorf("%s: cluster_name %q, want %q: the capsnap provider's service and port", where, eg.GetClusterName(), want)
		}
		if eg.GetAuthority() != provider.Service {
			t.Errorf("%s: authority %q, want the provider's service %q", where, eg.GetAuthority(), provider.Service)
		}
	}

	// Everything else as in envoy/demo.yaml, which the end-to-end tests run.
	if have, want := withoutService(t, rp.filter), withoutService(t, demo); !proto.Equal(have, want) {
		hj, _ := protojson.Marshal(have)
		wj, _ := protojson.Marshal(want)
		t.Errorf("%s: apart from grpc_service, the filter is not envoy/demo.yaml's %s; copy it again\nhave %s\nwant %s", where, extProcFilter, hj, wj)
	}
}

func TestIstio(t *testing.T) {
	k := loadK8s(t)
	m := loadManifests(t, "istio")
	demo := demoExtProc(t)

	// The extension provider.
	var op istioOperator
	m.one(t, "IstioOperator").decode(t, &op, true)
	providers := map[string]*grpcProvider{}
	for _, p := range op.Spec.MeshConfig.ExtensionProviders {
		if p.EnvoyExtAuthzGrpc != nil {
			providers[p.Name] = p.EnvoyExtAuthzGrpc
		}
	}
	if len(providers) == 0 {
		t.Fatal("mesh config: no envoyExtAuthzGrpc extension provider")
	}
	var capsnapNS string
	for name, p := range providers {
		host, ns, ok := strings.Cut(strings.TrimSuffix(p.Service, ".svc.cluster.local"), ".")
		if !ok || host != k.svcName || !strings.HasSuffix(p.Service, ".svc.cluster.local") || strings.Contains(ns, ".") {
			t.Errorf("provider %s: service %q, want %s.<namespace>.svc.cluster.local", name, p.Service, k.svcName)
		}
		capsnapNS = ns
		if int(p.Port) != k.capsnap.namedPort(t, "grpc") {
			t.Errorf("provider %s: port %d, want capsnap's grpc port %d", name, p.Port, k.capsnap.namedPort(t, "grpc"))
		}
		if d, err := time.ParseDuration(p.Timeout); err != nil || d <= 0 || d > time.Second {
			t.Errorf("provider %s: timeout %q; set one well under a second (Istio's default is 600s)", name, p.Timeout)
		}
		if p.FailOpen == nil || *p.FailOpen {
			t.Errorf("provider %s: failOpen must be false, and written out", name)
		}
		if p.StatusOnError != "503" {
			t.Errorf("provider %s: statusOnError %q, want \"503\" so that callers can tell an unreachable capsnap from a denial", name, p.StatusOnError)
		}
		b := p.IncludeRequestBodyInCheck
		switch {
		case b == nil:
			t.Errorf("provider %s: includeRequestBodyInCheck is required: capsnap reads the body", name)
		case b.MaxRequestBytes != k.cfg.Limits.MaxBodyBytes:
			t.Errorf("provider %s: maxRequestBytes %d, but capsnap.yaml limits.max_body_bytes is %d", name, b.MaxRequestBytes, k.cfg.Limits.MaxBodyBytes)
		case b.MaxRequestBytes != k.cfg.Discovery.MaxResponseBytes:
			// It also bounds the tools/list response the sidecar buffers
			// for the response path.
			t.Errorf("provider %s: maxRequestBytes %d, but capsnap.yaml discovery.max_response_bytes is %d", name, b.MaxRequestBytes, k.cfg.Discovery.MaxResponseBytes)
		case b.AllowPartialMessage == nil || *b.AllowPartialMessage:
			t.Errorf("provider %s: allowPartialMessage must be false: a prefix of the body is not what the server reads", name)
		case b.PackAsBytes == nil || !*b.PackAsBytes:
			t.Errorf("provider %s: packAsBytes must be true", name)
		}
	}
	capsnapPrincipal := "cluster.local/ns/" + capsnapNS + "/sa/" + k.deploy.Spec.Template.Spec.ServiceAccountName

	// The server_id patches, by namespace and workload labels.
	configured := map[string]bool{}
	for _, s := range k.cfg.Servers {
		configured[s.ID] = true
	}
	named := map[string]string{} // namespace + labels -> server_id
	// The response-path patches, by namespace and workload labels; they are
	// held to the provider once the CUSTOM policy names it.
	type rpPatch struct {
		f  envoyFilter
		rp responsePath
	}
	responsePaths := map[string][]rpPatch{}
	for _, o := range m.all("EnvoyFilter") {
		var f envoyFilter
		o.decode(t, &f, true)
		for _, rp := range f.responsePaths(t) {
			if f.Spec.WorkloadSelector == nil || len(f.Spec.WorkloadSelector.Labels) == 0 {
				t.Errorf("EnvoyFilter %s: no workloadSelector; select the MCP server workload, as its CUSTOM policy does", o.Metadata.Name)
				continue
			}
			key := o.Metadata.Namespace + "/" + fmt.Sprint(f.Spec.WorkloadSelector.Labels)
			responsePaths[key] = append(responsePaths[key], rpPatch{f, rp})
		}
		ids := f.serverIDs(t)
		if len(ids) == 0 {
			continue
		}
		if f.Spec.WorkloadSelector == nil || len(f.Spec.WorkloadSelector.Labels) == 0 {
			t.Errorf("EnvoyFilter %s: no workloadSelector; it would name every workload in %s the same server", o.Metadata.Name, o.Metadata.Namespace)
			continue
		}
		for _, id := range ids {
			if !configured[id] {
				t.Errorf("EnvoyFilter %s: server_id %q is not in capsnap.yaml's servers; capsnap would deny it unknown_server", o.Metadata.Name, id)
			}
			if id != ids[0] {
				t.Errorf("EnvoyFilter %s names two servers for one workload: %v", o.Metadata.Name, ids)
			}
		}
		named[o.Metadata.Namespace+"/"+fmt.Sprint(f.Spec.WorkloadSelector.Labels)] = ids[0]
	}

	// The CUSTOM policies.
	guarded := map[string]bool{}
	var custom int
	for _, o := range m.all("AuthorizationPolicy") {
		var ap authorizationPolicy
		o.decode(t, &ap, true)
		for _, r := range ap.Spec.Rules {
			for _, f := range r.From {
				for key := range f.Source {
					if !slices.Contains(istioSourceFields, key) {
						t.Errorf("AuthorizationPolicy %s: unknown source field %q", o.Metadata.Name, key)
					}
				}
			}
			for _, to := range r.To {
				for key := range to.Operation {
					if !slices.Contains(istioOperationFields, key) {
						t.Errorf("AuthorizationPolicy %s: unknown operation field %q", o.Metadata.Name, key)
					}
				}
			}
		}
		if ap.Spec.Action != "CUSTOM" {
			continue
		}
		custom++
		if ap.Spec.Provider == nil || providers[ap.Spec.Provider.Name] == nil {
			t.Errorf("AuthorizationPolicy %s: provider %+v is not an envoyExtAuthzGrpc provider of the mesh config", o.Metadata.Name, ap.Spec.Provider)
		}
		if ap.Spec.Selector == nil || len(ap.Spec.Selector.MatchLabels) == 0 {
			t.Errorf("AuthorizationPolicy %s: select the MCP server workload", o.Metadata.Name)
			continue
		}
		// A CUSTOM policy checks only what its rules match: no rules checks
		// nothing, and a narrowed rule leaves the rest unchecked. The one
		// exemption is capsnap's own catalog traffic.
		if len(ap.Spec.Rules) == 0 {
			t.Errorf("AuthorizationPolicy %s: a CUSTOM policy without rules sends nothing to capsnap", o.Metadata.Name)
		}
		for i, r := range ap.Spec.Rules {
			if len(r.To) != 0 || len(r.When) != 0 {
				t.Errorf("AuthorizationPolicy %s rule %d: to/when narrow what capsnap checks; everything else would pass unchecked", o.Metadata.Name, i)
			}
			for _, f := range r.From {
				for key, vals := range f.Source {
					if key != "notPrincipals" || !slices.Equal(vals, []string{capsnapPrincipal}) {
						t.Errorf("AuthorizationPolicy %s rule %d: source %s %v; only capsnap itself (notPrincipals [%s]) may be exempt", o.Metadata.Name, i, key, vals, capsnapPrincipal)
					}
				}
			}
		}
		key := o.Metadata.Namespace + "/" + fmt.Sprint(ap.Spec.Selector.MatchLabels)
		guarded[key] = true
		if named[key] == "" {
			t.Errorf("AuthorizationPolicy %s guards %s, which no EnvoyFilter gives a server_id: capsnap would deny all of it (unknown_server)", o.Metadata.Name, key)
		}
		// Exactly one response path: without it nothing is pinned and
		// every tools/call is denied no_snapshot; with two, capsnap would
		// be handed a list it had already rewritten.
		switch rps := responsePaths[key]; len(rps) {
		case 1:
			var provider *grpcProvider
			if ap.Spec.Provider != nil {
				provider = providers[ap.Spec.Provider.Name]
			}
			checkResponsePath(t, rps[0].f, rps[0].rp, demo, provider)
		case 0:
			t.Errorf("AuthorizationPolicy %s guards %s, which no EnvoyFilter gives the response path: nothing would be pinned, and every tools/call denied no_snapshot", o.Metadata.Name, key)
		default:
			t.Errorf("AuthorizationPolicy %s guards %s, which %d EnvoyFilter patches give the response path; want one", o.Metadata.Name, key, len(rps))
		}
	}
	if custom == 0 {
		t.Error("no AuthorizationPolicy with action CUSTOM")
	}
	for key, id := range named {
		if !guarded[key] {
			t.Errorf("EnvoyFilter for %s names server %q, but no CUSTOM policy sends its requests to capsnap", key, id)
		}
	}
	for key, rps := range responsePaths {
		if !guarded[key] {
			t.Errorf("EnvoyFilter %s gives %s the response path, but no CUSTOM policy sends its requests to capsnap", rps[0].f.Metadata.Name, key)
		}
	}

	// capsnap's own policy: Check only from the mesh's MCP servers, by
	// service account (the identities grpc_tls admits outside the mesh),
	// over mutual TLS, and the admin listener read-only.
	grpcPort, adminPort := strconv.Itoa(k.capsnap.namedPort(t, "grpc")), strconv.Itoa(k.capsnap.namedPort(t, "admin"))
	var envoys []string
	for _, id := range k.cfg.GRPCTLS.AllowedClients {
		envoys = append(envoys, strings.TrimPrefix(id, "spiffe://"))
	}
	slices.Sort(envoys)
	checkOwnPeerAuthentication(t, m, k, capsnapNS)
	var own int
	for _, o := range m.all("AuthorizationPolicy") {
		var ap authorizationPolicy
		o.decode(t, &ap, true)
		if ap.Spec.Action != "ALLOW" || ap.Spec.Selector == nil || !hasLabels(k.deploy.Spec.Template.Metadata.Labels, ap.Spec.Selector.MatchLabels) {
			continue
		}
		own++
		if o.Metadata.Namespace != capsnapNS {
			t.Errorf("AuthorizationPolicy %s is in namespace %q, capsnap in %q", o.Metadata.Name, o.Metadata.Namespace, capsnapNS)
		}
		for i, r := range ap.Spec.Rules {
			var ports []string
			for _, to := range r.To {
				ports = append(ports, to.Operation["ports"]...)
			}
			if len(ports) == 0 {
				t.Errorf("AuthorizationPolicy %s rule %d allows every port", o.Metadata.Name, i)
			}
			if slices.Contains(ports, grpcPort) && len(r.From) == 0 {
				t.Errorf("AuthorizationPolicy %s rule %d lets anyone call Check, and claim any principal", o.Metadata.Name, i)
			}
			if slices.Contains(ports, grpcPort) {
				var principals []string
				for _, f := range r.From {
					for key, vals := range f.Source {
						if key != "principals" {
							t.Errorf("AuthorizationPolicy %s rule %d admits callers of Check by %s; name the MCP servers' service accounts in principals", o.Metadata.Name, i, key)
						}
						principals = append(principals, vals...)
					}
				}
				slices.Sort(principals)
				if !slices.Equal(principals, envoys) {
					t.Errorf("AuthorizationPolicy %s rule %d admits %v to Check; capsnap.yaml's grpc_tls.allowed_clients admit %v: keep them the same Envoys", o.Metadata.Name, i, principals, envoys)
				}
			}
			if slices.Contains(ports, adminPort) {
				for _, to := range r.To {
					if m := to.Operation["methods"]; len(m) == 0 || slices.ContainsFunc(m, func(s string) bool { return s != "GET" && s != "HEAD" }) {
						t.Errorf("AuthorizationPolicy %s rule %d allows %v on the admin port, where POST /policy/reload lives", o.Metadata.Name, i, m)
					}
				}
			}
		}
	}
	if own == 0 {
		t.Error("no ALLOW AuthorizationPolicy for capsnap's own workload")
	}
}

// checkOwnPeerAuthentication holds capsnap's grpc port to mutual TLS in
// the mesh: without it a plaintext caller has no principal, which the ALLOW
// policy refuses anyway, but STRICT says so at the handshake.
func checkOwnPeerAuthentication(t *testing.T, m manifests, k *k8s, ns string) {
	t.Helper()
	var found bool
	for _, o := range m.all("PeerAuthentication") {
		var pa struct {
			APIVersion string     `yaml:"apiVersion"`
			Kind       string     `yaml:"kind"`
			Metadata   objectMeta `yaml:"metadata"`
			Spec       struct {
				Selector *labelSelector `yaml:"selector"`
				MTLS     struct {
					Mode string `yaml:"mode"`
				} `yaml:"mtls"`
				PortLevelMTLS map[string]struct {
					Mode string `yaml:"mode"`
				} `yaml:"portLevelMtls"`
			} `yaml:"spec"`
		}
		o.decode(t, &pa, true)
		if o.Metadata.Namespace != ns || pa.Spec.Selector == nil || !hasLabels(k.deploy.Spec.Template.Metadata.Labels, pa.Spec.Selector.MatchLabels) {
			continue
		}
		found = true
		grpc := strconv.Itoa(k.capsnap.namedPort(t, "grpc"))
		mode := pa.Spec.MTLS.Mode
		if p, ok := pa.Spec.PortLevelMTLS[grpc]; ok {
			mode = p.Mode
		}
		if mode != "STRICT" {
			t.Errorf("PeerAuthentication %s: the grpc port %s is %q, want STRICT", o.Metadata.Name, grpc, mode)
		}
	}
	if !found {
		t.Errorf("no PeerAuthentication for capsnap's pods in namespace %s", ns)
	}
}

// ---------------------------------------------------------------------------
// Prometheus

type ruleFile struct {
	Groups []struct {
		Name        string            `yaml:"name"`
		Interval    string            `yaml:"interval"`
		QueryOffset string            `yaml:"query_offset"`
		Limit       int               `yaml:"limit"`
		Labels      map[string]string `yaml:"labels"`
		Rules       []struct {
			Alert         string            `yaml:"alert"`
			Record        string            `yaml:"record"`
			Expr          string            `yaml:"expr"`
			For           string            `yaml:"for"`
			KeepFiringFor string            `yaml:"keep_firing_for"`
			Labels        map[string]string `yaml:"labels"`
			Annotations   map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

var promDuration = regexp.MustCompile(`^([0-9]+y)?([0-9]+w)?([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?([0-9]+ms)?$`)

// balanced reports whether the brackets of a PromQL expression pair up,
// outside string literals.
func balanced(expr string) error {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	var quote rune
	for i, r := range expr {
		switch {
		case quote != 0:
			if r == quote && (i == 0 || expr[i-1] != '\\') {
				quote = 0
			}
		case r == '"' || r == '\'' || r == '`':
			quote = r
		case r == '(' || r == '[' || r == '{':
			stack = append(stack, r)
		case pairs[r] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return fmt.Errorf("unmatched %q at %d", r, i)
			}
			stack = stack[:len(stack)-1]
		}
	}
	if quote != 0 {
		return errors.New("unterminated string")
	}
	if len(stack) != 0 {
		return fmt.Errorf("unclosed %q", stack[len(stack)-1])
	}
	return nil
}

var (
	byClause  = regexp.MustCompile(`\bby\s*\(([^)]*)\)`)
	labelRef  = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	jobMatch  = regexp.MustCompile(`job\s*=\s*"([^"]+)"`)
	alertName = regexp.MustCompile(`^Capsnap[A-Z][A-Za-z]+$`)
)

// alertTemplate parses and runs an annotation as Prometheus does: Go
// templates with $labels and $value defined and its humanize functions.
func alertTemplate(text string) error {
	stub := func(v any) string { return fmt.Sprint(v) }
	tmpl, err := template.New("").Option("missingkey=zero").Funcs(template.FuncMap{
		"humanize": stub, "humanize1024": stub, "humanizeDuration": stub,
		"humanizePercentage": stub, "humanizeTimestamp": stub, "title": stub, "toUpper": strings.ToUpper,
	}).Parse("{{$labels := .Labels}}{{$externalLabels := .ExternalLabels}}{{$value := .Value}}" + text)
	if err != nil {
		return err
	}
	return tmpl.Execute(io.Discard, map[string]any{"Labels": map[string]string{}, "ExternalLabels": map[string]string{}, "Value": 1.0})
}

func scrapeJobs(t *testing.T) []string {
	t.Helper()
	var sc struct {
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
		} `yaml:"scrape_configs"`
	}
	docs := readDocs(t, repoPath("examples", "prometheus", "scrape-config.yaml"))
	docs[0].decode(t, &sc, false)
	var jobs []string
	for _, s := range sc.ScrapeConfigs {
		jobs = append(jobs, s.JobName)
	}
	return jobs
}

func TestPrometheusRules(t *testing.T) {
	var rf ruleFile
	docs := readDocs(t, repoPath("examples", "prometheus", "alerts.yaml"))
	if len(docs) != 1 {
		t.Fatalf("alerts.yaml: %d documents, want one rule file", len(docs))
	}
	docs[0].decode(t, &rf, true) // Prometheus loads rule files strictly too
	jobs := scrapeJobs(t)

	alerts := map[string]string{} // name -> expr
	for _, g := range rf.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("rule group %q: a group needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			name := r.Alert
			if _, dup := alerts[name]; dup {
				t.Errorf("alert %s is defined twice", name)
			}
			alerts[name] = r.Expr
			if !alertName.MatchString(name) {
				t.Errorf("alert %s: name it Capsnap<What>", name)
			}
			if err := balanced(r.Expr); err != nil || strings.TrimSpace(r.Expr) == "" {
				t.Errorf("alert %s: expr %q: %v", name, r.Expr, err)
			}
			for _, d := range []string{r.For, r.KeepFiringFor} {
				if d != "" && !promDuration.MatchString(d) {
					t.Errorf("alert %s: %q is not a Prometheus duration", name, d)
				}
			}
			switch r.Labels["severity"] {
			case "critical", "warning", "info":
			default:
				t.Errorf("alert %s: severity label %q, want critical, warning or info", name, r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s: no %s annotation", name, a)
				}
			}
			// The description tells the operator what to do, not only what
			// happened: it is the runbook.
			if len(r.Annotations["description"]) < 80 {
				t.Errorf("alert %s: the description should say what to do", name)
			}
			for a, text := range r.Annotations {
				if err := alertTemplate(text); err != nil {
					t.Errorf("alert %s: annotation %s: %v", name, a, err)
				}
			}
			// Every job the alert selects is a scrape job that exists.
			for _, m := range jobMatch.FindAllStringSubmatch(r.Expr, -1) {
				if !slices.Contains(jobs, m[1]) {
					t.Errorf("alert %s selects job %q; scrape-config.yaml has %v", name, m[1], jobs)
				}
			}
			if !jobMatch.MatchString(r.Expr) {
				t.Errorf("alert %s: select job=\"capsnap\" so that it does not match other jobs' series", name)
			}
			// An aggregated expression keeps only its by() labels; an
			// annotation that uses any other would print nothing.
			clauses := byClause.FindAllStringSubmatch(r.Expr, -1)
			for _, ref := range refsOf(r.Annotations) {
				for _, c := range clauses {
					if !slices.Contains(splitLabels(c[1]), ref) {
						t.Errorf("alert %s: annotations use $labels.%s, which by (%s) drops", name, ref, c[1])
					}
				}
				if strings.HasPrefix(strings.TrimSpace(r.Expr), "absent(") {
					t.Errorf("alert %s: absent() has no $labels.%s", name, ref)
				}
			}
		}
	}

	// The alerts the brief asks for, each found by what it must watch.
	for what, re := range map[string]string{
		"capsnap down": `\bup\{job="capsnap"\} == 0`,
		"drift spike":  `rate\(capsnap_decisions_total\{[^}]*decision="deny"[^}]*reason=~"` + strings.Join(driftReasons, `\|`) + `"`,
		// Every other reason, 200-mode denials included.
		"denial spike":         `rate\(capsnap_decisions_total\{[^}]*decision="deny"[^}]*reason!~"` + strings.Join(driftReasons, `\|`) + `"`,
		"stale catalog":        `capsnap_catalog_staleness_seconds`,
		"refreshes failing":    `capsnap_catalog_refreshes_total\{[^}]*result="error"`,
		"policy reload failed": `increase\(capsnap_policy_reloads_total\{[^}]*result=~"invalid\|refused_loosening"\}\[10m\]\)\) > 0`,
		"Check latency p99":    `histogram_quantile\(0\.99, [^\n]*rate\(capsnap_check_duration_seconds_bucket`,
		// Summed over the replicas: one issues a ticket, another may
		// redeem it.
		"response path missing": `sum by \(server_id\) \(increase\(capsnap_delivery_unbound_total\{job="capsnap"\}\[10m\]\)\) >= 3`,
	} {
		re := regexp.MustCompile(re)
		found := false
		for _, expr := range alerts {
			found = found || re.MatchString(expr)
		}
		if !found {
			t.Errorf("no alert for %s (an expr matching %s)", what, re)
		}
	}
}

func refsOf(ann map[string]string) []string {
	var out []string
	for _, text := range ann {
		for _, m := range labelRef.FindAllStringSubmatch(text, -1) {
			if !slices.Contains(out, m[1]) {
				out = append(out, m[1])
			}
		}
	}
	slices.Sort(out)
	return out
}

func splitLabels(s string) []string {
	var out []string
	for _, l := range strings.Split(s, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func TestScrapeConfig(t *testing.T) {
	if jobs := scrapeJobs(t); !slices.Contains(jobs, "capsnap") {
		t.Errorf("scrape-config.yaml: jobs %v, want one named capsnap (the alerts select it)", jobs)
	}
}

// ---------------------------------------------------------------------------
// Grafana

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int      `json:"id"`
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Collapsed  bool     `json:"collapsed"`
	GridPos    *gridPos `json:"gridPos"`
	Datasource *dsRef   `json:"datasource"`
	Targets    []struct {
		RefID      string `json:"refId"`
		Expr       string `json:"expr"`
		Datasource *dsRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type gridPos struct{ H, W, X, Y int }

type dashboard struct {
	UID           string `json:"uid"`
	Title         string `json:"title"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []struct {
			Type       string          `json:"type"`
			Name       string          `json:"name"`
			Query      json.RawMessage `json:"query"`
			Datasource *dsRef          `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Annotations struct {
		List []struct {
			Name       string `json:"name"`
			Expr       string `json:"expr"`
			Datasource *dsRef `json:"datasource"`
		} `json:"list"`
	} `json:"annotations"`
	Panels []panel `json:"panels"`
}

var (
	grafanaVar      = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`)
	grafanaBuiltins = []string{"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms", "__auto"}
)

func TestGrafanaDashboard(t *testing.T) {
	data := readFile(t, "examples", "grafana", "capsnap.json")
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("capsnap.json: %v", err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d: want 36 or later (datasource references by uid)", d.SchemaVersion)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard needs a uid and a title")
	}
	vars := map[string]bool{}
	var dsVar string
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "datasource" && string(v.Query) == `"prometheus"` {
			dsVar = v.Name
		}
	}
	if dsVar == "" {
		t.Fatal("templating: no datasource variable of type prometheus")
	}
	okDS := func(ds *dsRef) bool {
		return ds != nil && ds.Type == "prometheus" && (ds.UID == "${"+dsVar+"}" || ds.UID == "$"+dsVar)
	}
	checkExpr := func(where, expr string) {
		if strings.TrimSpace(expr) == "" {
			t.Errorf("%s: empty expr", where)
		}
		if err := balanced(expr); err != nil {
			t.Errorf("%s: %q: %v", where, expr, err)
		}
		for _, m := range grafanaVar.FindAllStringSubmatch(expr, -1) {
			if !vars[m[1]] && !slices.Contains(grafanaBuiltins, m[1]) {
				t.Errorf("%s: $%s is not a dashboard variable", where, m[1])
			}
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			if !okDS(v.Datasource) {
				t.Errorf("variable %s: datasource %+v, want the $%s variable", v.Name, v.Datasource, dsVar)
			}
			var q struct {
				Query string `json:"query"`
			}
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query: %v", v.Name, err)
			}
			checkExpr("variable "+v.Name, q.Query)
		}
	}
	for _, a := range d.Annotations.List {
		if a.Expr != "" {
			if !okDS(a.Datasource) {
				t.Errorf("annotation %s: datasource %+v, want the $%s variable", a.Name, a.Datasource, dsVar)
			}
			checkExpr("annotation "+a.Name, a.Expr)
		}
	}

	var all []panel
	for _, p := range d.Panels {
		all = append(all, p)
		all = append(all, p.Panels...) // a collapsed row keeps its panels inside
	}
	ids := map[int]bool{}
	var placed []panel
	var charts int
	for _, p := range all {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if ids[p.ID] || p.ID == 0 {
			t.Errorf("%s: id missing or not unique", where)
		}
		ids[p.ID] = true
		if g := p.GridPos; g == nil || g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("%s: gridPos %+v outside the 24-column grid", where, p.GridPos)
		} else {
			placed = append(placed, p)
		}
		if p.Type == "row" {
			continue
		}
		charts++
		if p.Title == "" {
			t.Errorf("%s: no title", where)
		}
		if !okDS(p.Datasource) {
			t.Errorf("%s: datasource %+v, want the $%s variable", where, p.Datasource, dsVar)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no targets", where)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("%s: target refId %q missing or repeated", where, tg.RefID)
			}
			refs[tg.RefID] = true
			if !okDS(tg.Datasource) {
				t.Errorf("%s target %s: datasource %+v, want the $%s variable", where, tg.RefID, tg.Datasource, dsVar)
			}
			checkExpr(where+" target "+tg.RefID, tg.Expr)
		}
	}
	if charts == 0 {
		t.Error("the dashboard has no panels")
	}
	for i, a := range placed {
		for _, b := range placed[i+1:] {
			ga, gb := a.GridPos, b.GridPos
			if ga.X < gb.X+gb.W && gb.X < ga.X+ga.W && ga.Y < gb.Y+gb.H && gb.Y < ga.Y+ga.H {
				t.Errorf("panels %q and %q overlap", a.Title, b.Title)
			}
		}
	}

	// The panels the brief asks for, each found by its query.
	var exprs []string
	for _, p := range all {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	joined := strings.Join(exprs, "\n")
	for what, re := range map[string]string{
		"decisions by decision and reason": `by \(decision, reason\) \(rate\(capsnap_decisions_total`,
		"drift denials by reason, server":  `by \(reason, server_id\) \(rate\(capsnap_decisions_total\{[^}]*decision="deny", reason=~"` + strings.Join(driftReasons, `\|`) + `"`,
		"Check latency p50":                `histogram_quantile\(0\.5, [^\n]*capsnap_check_duration_seconds_bucket`,
		"Check latency p99":                `histogram_quantile\(0\.99, [^\n]*capsnap_check_duration_seconds_bucket`,
		"policy digest table":              `capsnap_policy_info`,
	} {
		if !regexp.MustCompile(re).MatchString(joined) {
			t.Errorf("no panel for %s (a query matching %s)", what, re)
		}
	}
}

// ---------------------------------------------------------------------------
// Metric names

var metricName = regexp.MustCompile(`capsnap_[a-z_]+`)

// metricsIn returns the capsnap metric families a file refers to, with a
// histogram's _bucket, _sum and _count series folded into the family.
func metricsIn(t *testing.T, data []byte, where string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, m := range metricName.FindAll(data, -1) {
		name := string(m)
		family := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && knownMetrics[base] == "histogram" {
				family = base
			}
		}
		typ, ok := knownMetrics[family]
		switch {
		case !ok:
			t.Errorf("%s: %s is not a metric capsnap exports", where, name)
		case typ == "histogram" && name == family:
			t.Errorf("%s: %s is a histogram; query its _bucket, _sum or _count series", where, name)
		}
		out[family] = true
	}
	return out
}

func TestMetricNames(t *testing.T) {
	metricsIn(t, readFile(t, "examples", "prometheus", "alerts.yaml"), "alerts.yaml")
	used := metricsIn(t, readFile(t, "examples", "grafana", "capsnap.json"), "capsnap.json")
	for name := range knownMetrics {
		if !used[name] {
			t.Errorf("capsnap.json: no panel shows %s", name)
		}
	}
}

// ---------------------------------------------------------------------------
// Dockerfile

type instruction struct {
	line int
	cmd  string // upper case
	args string
}

type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions, joining
// continuation lines and dropping comments.
func parseDockerfile(t *testing.T, data []byte) []stage {
	t.Helper()
	var stages []stage
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cur strings.Builder
	start, n := 0, 0
	flush := func() {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return
		}
		cmd, args, _ := strings.Cut(text, " ")
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{}
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				default:
					st.from = f[i]
				}
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Errorf("Dockerfile:%d: %s before the first FROM", in.line, in.cmd)
			}
			return
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), "\\"); ok {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil {
		t.Errorf("Dockerfile:%d: %s %s: use the JSON (exec) form: there is no shell in the image", in.line, in.cmd, in.args)
	}
	return v
}

func TestDockerfile(t *testing.T) {
	stages := parseDockerfile(t, readFile(t, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("Dockerfile: %d stages, want a build stage and a final stage", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]

	// The builder is the Go release go.mod asks for.
	gomod := readFile(t, "go.mod")
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod: no go line")
	}
	if want := "golang:" + string(m[1]); build.from != want && !strings.HasPrefix(build.from, want+"-") && !strings.HasPrefix(build.from, want+".") {
		t.Errorf("build stage FROM %s, want %s (go.mod's go %s)", build.from, want, m[1])
	}
	var built bool
	for _, in := range build.ins {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			built = true
			for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=", "./cmd/capsnap"} {
				if !strings.Contains(in.args, want) {
					t.Errorf("Dockerfile:%d: go build lacks %s", in.line, want)
				}
			}
		}
	}
	if !built {
		t.Error("build stage: no RUN go build")
	}
	// -X main.version does nothing, silently, if the variable is gone.
	if !regexp.MustCompile(`(?m)^var version = `).Match(readFile(t, "cmd", "capsnap", "main.go")) {
		t.Error("cmd/capsnap/main.go has no `var version`, which -X main.version sets")
	}

	// The final stage: static, non-root, nothing to run but capsnap.
	if !strings.HasPrefix(final.from, "gcr.io/distroless/static") && final.from != "scratch" {
		t.Errorf("final stage FROM %s, want gcr.io/distroless/static or scratch", final.from)
	}
	var user, entrypoint, cmd []string
	var exposed []string
	var copied, certs bool
	for _, in := range final.ins {
		switch in.cmd {
		case "RUN", "SHELL", "ADD":
			t.Errorf("Dockerfile:%d: %s in the final stage; it has no shell, and only COPY --from belongs there", in.line, in.cmd)
		case "USER":
			user = strings.Split(in.args, ":")
		case "ENTRYPOINT":
			entrypoint = execForm(t, in)
		case "CMD":
			cmd = execForm(t, in)
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		case "COPY":
			if strings.Contains(in.args, "--from="+build.name) && strings.HasSuffix(in.args, " /capsnap") {
				copied = true
			}
			certs = certs || strings.Contains(in.args, "ca-certificates")
		}
	}
	if final.from == "scratch" && !certs {
		t.Error("a scratch image needs the CA certificates copied in, or https MCP server URLs fail")
	}
	if !copied {
		t.Errorf("final stage: no COPY --from=%s of the binary to /capsnap", build.name)
	}
	if len(user) == 0 {
		t.Error("final stage: no USER; the image would run as root")
	} else if uid, err := strconv.Atoi(user[0]); err != nil || uid == 0 {
		t.Errorf("final stage: USER %s; want a numeric uid other than 0, which the kubelet can verify for runAsNonRoot", strings.Join(user, ":"))
	}
	if !slices.Equal(entrypoint, []string{"/capsnap"}) {
		t.Errorf("ENTRYPOINT %q, want [\"/capsnap\"]", entrypoint)
	}
	k := loadK8s(t)
	if !slices.Equal(cmd, k.capsnap.Args) {
		t.Errorf("CMD %q, but the Deployment runs %q; keep them one command", cmd, k.capsnap.Args)
	}
	for _, p := range []int{portOf(t, k.cfg.GRPCAddr), portOf(t, k.cfg.AdminAddr)} {
		if !slices.Contains(exposed, strconv.Itoa(p)) && !slices.Contains(exposed, strconv.Itoa(p)+"/tcp") {
			t.Errorf("EXPOSE %v lacks %d", exposed, p)
		}
	}

	// make image builds the same image without Docker (deploy/image): one
	// user, entrypoint, command and set of ports, whichever built it.
	var image struct {
		Config struct {
			User         string              `json:"User"`
			Entrypoint   []string            `json:"Entrypoint"`
			Cmd          []string            `json:"Cmd"`
			ExposedPorts map[string]struct{} `json:"ExposedPorts"`
		} `json:"config"`
	}
	if err := json.Unmarshal(readFile(t, "deploy", "image", "testdata", "config.golden.json"), &image); err != nil {
		t.Fatal(err)
	}
	ic := image.Config
	if got := strings.Join(user, ":"); got != ic.User {
		t.Errorf("USER %s, but make image's user is %s", got, ic.User)
	}
	if !slices.Equal(entrypoint, ic.Entrypoint) || !slices.Equal(cmd, ic.Cmd) {
		t.Errorf("ENTRYPOINT %q CMD %q, but make image's are %q %q", entrypoint, cmd, ic.Entrypoint, ic.Cmd)
	}
	var dockerPorts []string
	for _, p := range exposed {
		if !strings.Contains(p, "/") {
			p += "/tcp"
		}
		dockerPorts = append(dockerPorts, p)
	}
	if got, want := slices.Sorted(slices.Values(dockerPorts)), slices.Sorted(maps.Keys(ic.ExposedPorts)); !slices.Equal(got, want) {
		t.Errorf("EXPOSE %v, but make image exposes %v", got, want)
	}
}

// ---------------------------------------------------------------------------
// .dockerignore

// ignored reports whether a .dockerignore pattern excludes a slash-separated
// path relative to the build context, or a directory above it. It handles
// what Docker's matcher does for patterns without "!": path.Match per
// segment, and "**" for any number of segments.
func ignored(pattern, p string) bool {
	pat := strings.Split(strings.Trim(path.Clean(pattern), "/"), "/")
	segs := strings.Split(p, "/")
	var match func(pat, segs []string) bool
	match = func(pat, segs []string) bool {
		if len(pat) == 0 {
			return true // the pattern matched a directory above p
		}
		if pat[0] == "**" {
			for i := 0; i <= len(segs); i++ {
				if match(pat[1:], segs[i:]) {
					return true
				}
			}
			return false
		}
		if len(segs) == 0 {
			return false
		}
		ok, err := path.Match(pat[0], segs[0])
		return err == nil && ok && match(pat[1:], segs[1:])
	}
	return match(pat, segs)
}

// buildInputs lists what `go build ./cmd/capsnap` reads from the module:
// go.mod, go.sum, and the non-test Go files and embedded files of every
// package of the module that cmd/capsnap imports, directly or not.
func buildInputs(t *testing.T) []string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^module (\S+)`).FindSubmatch(readFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod: no module line")
	}
	module := string(m[1])
	inputs := []string{"go.mod", "go.sum"}
	seen := map[string]bool{}
	queue := []string{"cmd/capsnap"}
	fset := token.NewFileSet()
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		if seen[dir] {
			continue
		}
		seen[dir] = true
		files, err := filepath.Glob(repoPath(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			rel := dir + "/" + filepath.Base(f)
			inputs = append(inputs, rel)
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(fset, f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if sub, ok := strings.CutPrefix(p, module+"/"); ok {
					queue = append(queue, sub)
				}
			}
			for _, line := range strings.Split(string(src), "\n") {
				if pats, ok := strings.CutPrefix(line, "//go:embed "); ok {
					for _, pat := range strings.Fields(pats) {
						inputs = append(inputs, dir+"/"+pat)
					}
				}
			}
		}
	}
	return inputs
}

func TestDockerignore(t *testing.T) {
	var patterns []string
	for _, line := range strings.Split(string(readFile(t, ".dockerignore")), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") {
			t.Fatalf(".dockerignore: %q: this test does not model exceptions; extend ignored() first", line)
		}
		patterns = append(patterns, line)
	}
	for _, must := range []string{".git", "bin"} {
		if !slices.ContainsFunc(patterns, func(p string) bool { return ignored(p, must) }) {
			t.Errorf(".dockerignore does not exclude %s", must)
		}
	}
	for _, in := range buildInputs(t) {
		for _, p := range patterns {
			if ignored(p, in) {
				t.Errorf(".dockerignore pattern %q excludes %s, which go build ./cmd/capsnap needs", p, in)
			}
		}
	}
}

func TestIgnoredMatcher(t *testing.T) {
	for _, c := range []struct {
		pattern, path string
		want          bool
	}{
		{"bin", "bin/capsnap", true},
		{"bin", "cmd/bin", false},
		{"**/testdata", "config/testdata/valid.yaml", true},
		{"**/testdata", "testdata/x", true},
		{"**/*_test.go", "cmd/capsnap/main_test.go", true},
		{"**/*_test.go", "cmd/capsnap/main.go", false},
		{"**/*.md", "README.md", true},
		{"examples", "examples/deploy/doc.go", true},
		{"examples", "examplesx/a.go", false},
	} {
		if got := ignored(c.pattern, c.path); got != c.want {
			t.Errorf("ignored(%q, %q) = %v, want %v", c.pattern, c.path, got, c.want)
		}
	}
}
