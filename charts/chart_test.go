package charts

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/rs/zerolog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/policy"
)

const (
	chart = "./capsnap"
	// Not "capsnap": the objects are "<release>-capsnap", and nothing may
	// take the release's name for capsnap's.
	release    = "guard"
	namespace  = "capsnap"
	policyFile = "../examples/demo/policy.yaml"
	// approvalPolicyFile holds calls for approval and puts a server under
	// change control: capsnap refuses it without the approval listener.
	approvalPolicyFile = "testdata/approval-policy.yaml"
	// capsnapShutdown is how long capsnap may take after its drain:
	// in-flight Checks, then the admin listener (cmd/capsnap/serve.go).
	capsnapShutdown = 2 * 10 * time.Second
)

// The API types every object the chart renders must decode into, strictly:
// a field the type lacks, a duplicate or a wrong case is an error, as with
// the API server's strict field validation.
var apiTypes = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"networking.k8s.io/v1/Ingress":            func() any { return &networkingv1.Ingress{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// decodeStrict decodes one YAML document into v as the API server would
// with strict field validation.
func decodeStrict(doc []byte, v any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(js, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// helm runs $CAPSNAP_HELM with nothing of the machine's: no repositories,
// plugins or kubeconfig.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin := os.Getenv("CAPSNAP_HELM")
	if bin == "" {
		t.Skip("CAPSNAP_HELM is not set: make chart-test builds Helm and sets it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	home := t.TempDir()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out, nil
}

// scenario is a values file of testdata and what it must render to.
type scenario struct {
	values string
	// policy is the file given with --set-file policy=.
	policy string
	// image is the Deployment's image reference.
	image string
	// secrets are where the files capsnap.yaml names come from:
	// "Secret/key" by capsnap.yaml field.
	secrets map[string]string
	// kinds counts the objects of each kind.
	kinds map[string]int
	// opens are the names of capsnap's ports its NetworkPolicy opens.
	opens []string
}

// grpcTLSSecrets are the files of the defaults' Secrets: the admin token,
// and mutual TLS on the grpc port.
var grpcTLSSecrets = map[string]string{
	"admin.token_file":        "capsnap-admin-token/token",
	"grpc_tls.cert_file":      "capsnap-tls/tls.crt",
	"grpc_tls.key_file":       "capsnap-tls/tls.key",
	"grpc_tls.client_ca_file": "capsnap-tls/ca.crt",
}

func union(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		maps.Copy(out, m)
	}
	return out
}

var scenarios = []scenario{
	{
		values: "mtls.yaml",
		policy: policyFile,
		image:  "registry.example.com/capsnap:0.1.0",
		secrets: union(grpcTLSSecrets, map[string]string{
			"snapshots.redis.secret_file": "capsnap-snapshot-key/snapshot.key",
		}),
		kinds: map[string]int{"ConfigMap": 2, "Deployment": 1, "NetworkPolicy": 2, "PodDisruptionBudget": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
		opens: []string{"admin", "grpc"},
	},
	{
		values: "jwt-istio.yaml",
		policy: policyFile,
		image:  "ghcr.io/capsnap/capsnap@sha256:2313dd3eefb2ce04ac21d22452ecc8aecc83c02d57c01d811bbc20b66d21c3db",
		secrets: map[string]string{
			"admin.token_file":              "capsnap-admin-token/token",
			"snapshots.redis.secret_file":   "capsnap-snapshot-key/snapshot.key",
			"snapshots.redis.password_file": "capsnap-redis-password/password",
			"snapshots.redis.tls.ca_file":   "redis-ca/ca.crt",
			"snapshots.redis.tls.cert_file": "capsnap-redis-client/tls.crt",
			"snapshots.redis.tls.key_file":  "capsnap-redis-client/tls.key",
			"envelope.key_files[0]":         "capsnap-envelope-keys/envelope-2026.pem",
			"envelope.key_files[1]":         "capsnap-envelope-keys/envelope-2025.pem",
		},
		kinds: map[string]int{"ConfigMap": 2, "Deployment": 1, "NetworkPolicy": 1, "PodDisruptionBudget": 1, "PrometheusRule": 1, "Service": 1, "ServiceAccount": 1, "ServiceMonitor": 1},
		opens: []string{"admin", "grpc"},
	},
	{
		values:  "single.yaml",
		policy:  policyFile,
		image:   "registry.example.com/capsnap:0.1.0",
		secrets: grpcTLSSecrets,
		kinds:   map[string]int{"ConfigMap": 2, "Deployment": 1, "Service": 1, "ServiceAccount": 1},
	},
	{
		values: "approvals.yaml",
		policy: approvalPolicyFile,
		image:  "registry.example.com/capsnap:0.1.0",
		secrets: union(grpcTLSSecrets, map[string]string{
			"snapshots.redis.secret_file": "capsnap-snapshot-key/snapshot.key",
			"approvals.auth.jwks_file":    "guard-capsnap-approvers/jwks.json",
		}),
		kinds: map[string]int{"ConfigMap": 2, "Deployment": 1, "Ingress": 1, "NetworkPolicy": 2, "PodDisruptionBudget": 1, "Secret": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
		opens: []string{"admin", "approvals", "grpc"},
	},
	{
		values: "approvals-existing-secret.yaml",
		policy: approvalPolicyFile,
		image:  "registry.example.com/capsnap:0.1.0",
		secrets: union(grpcTLSSecrets, map[string]string{
			"approvals.auth.dev_tokens_file": "capsnap-approver-tokens/tokens.yaml",
		}),
		kinds: map[string]int{"ConfigMap": 2, "Deployment": 1, "NetworkPolicy": 1, "PodDisruptionBudget": 1, "Service": 1, "ServiceAccount": 1},
		opens: []string{"admin", "approvals", "grpc"},
	},
}

// rendered is a release as helm template renders it, decoded.
type rendered struct {
	objects []any
}

func render(t *testing.T, values string, args ...string) rendered {
	t.Helper()
	out, err := helm(t, append([]string{"template", release, chart, "--namespace", namespace,
		"-f", filepath.Join("testdata", values), "--set-file", "policy=" + policyFile}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return decodeRelease(t, out)
}

func decodeRelease(t *testing.T, out []byte) rendered {
	t.Helper()
	var r rendered
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if tm.Kind == "" {
			if len(stripComments(doc)) != 0 {
				t.Fatalf("a document without a kind:\n%s", doc)
			}
			continue
		}
		newObject, ok := apiTypes[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s %s: a kind this test does not know; add its API type", tm.APIVersion, tm.Kind)
		}
		obj := newObject()
		if err := decodeStrict(doc, obj); err != nil {
			t.Errorf("%s: %v\n%s", tm.Kind, err, doc)
			continue
		}
		m := obj.(metav1.Object)
		if m.GetName() == "" || m.GetNamespace() != "" {
			t.Errorf("%s %q: want a name and no namespace (helm install -n sets it)", tm.Kind, m.GetName())
		}
		r.objects = append(r.objects, obj)
	}
	return r
}

func stripComments(doc []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) != 0 && t[0] != '#' && string(t) != "---" {
			out = append(out, line...)
		}
	}
	return out
}

// all returns the objects of type T; one, the only one.
func all[T any](r rendered) []*T {
	var out []*T
	for _, o := range r.objects {
		if v, ok := o.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

func one[T any](t *testing.T, r rendered) *T {
	t.Helper()
	objs := all[T](r)
	if len(objs) != 1 {
		t.Fatalf("%d objects of type %T, want one", len(objs), *new(T))
	}
	return objs[0]
}

// find returns the object of type T named name, or nil; named, the
// object, which must be there.
func find[T any](r rendered, name string) *T {
	for _, o := range all[T](r) {
		if any(o).(metav1.Object).GetName() == name {
			return o
		}
	}
	return nil
}

func named[T any](t *testing.T, r rendered, name string) *T {
	t.Helper()
	o := find[T](r, name)
	if o == nil {
		t.Fatalf("no %T named %q", *new(T), name)
	}
	return o
}

func kinds(r rendered) map[string]int {
	n := map[string]int{}
	for _, o := range r.objects {
		n[reflect.TypeOf(o).Elem().Name()]++
	}
	return n
}

func selects(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	if sel == nil || len(sel.MatchLabels)+len(sel.MatchExpressions) == 0 {
		t.Errorf("an empty selector selects everything")
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return s.Matches(labels.Set(podLabels))
}

func capsnapDeployment(t *testing.T, r rendered) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d := one[appsv1.Deployment](t, r)
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "capsnap" {
		t.Fatalf("Deployment %s: want the one container capsnap", d.Name)
	}
	return d, &cs[0]
}

// mountOf finds the volume mounted at dir and checks that it is mounted
// as capsnap must read it: read-only, the whole volume, no subPath (which
// never sees an update).
func mountOf(t *testing.T, d *appsv1.Deployment, c *corev1.Container, dir string) *corev1.Volume {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		if !m.ReadOnly || m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("volume %s at %s: want it read-only, without subPath", m.Name, dir)
		}
		for i, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name {
				return &d.Spec.Template.Spec.Volumes[i]
			}
		}
		t.Fatalf("volume mount %s: no such volume", m.Name)
	}
	return nil
}

// configOf returns the capsnap.yaml the Deployment runs with, parsed by
// capsnap, and the policy ConfigMap's data, which must be the policy in
// wantPolicy.
func configOf(t *testing.T, r rendered, wantPolicy string) (config.Config, map[string]string) {
	t.Helper()
	d, c := capsnapDeployment(t, r)
	args := c.Args
	if len(c.Command) != 0 || len(args) != 3 || args[0] != "serve" || args[1] != "--config" {
		t.Fatalf("args %q: want the image's entrypoint with serve --config FILE", args)
	}
	cfgData := configMapAt(t, r, d, c, args[2])
	cfg, err := config.Parse([]byte(cfgData))
	if err != nil {
		t.Fatalf("capsnap.yaml: %v\n%s", err, cfgData)
	}
	policyData := configMapAt(t, r, d, c, cfg.PolicyFile)
	p, err := policy.Parse([]byte(policyData))
	if err != nil {
		t.Fatalf("policy_file %s: %v", cfg.PolicyFile, err)
	}
	want, err := policy.Load(wantPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if p.Digest() != want.Digest() {
		t.Errorf("policy %s is not %s, the one given with --set-file", p.Digest(), wantPolicy)
	}
	// As capsnap serve refuses it (cmd/capsnap/approvals_serve.go).
	if (p.HoldsForApproval() || p.UnderChangeControl()) && cfg.Approvals.Addr == "" {
		t.Errorf("policy %s holds calls or tool changes for approval, but approvals.addr is not set", wantPolicy)
	}
	v := mountOf(t, d, c, path.Dir(cfg.PolicyFile))
	return cfg, named[corev1.ConfigMap](t, r, v.ConfigMap.Name).Data
}

// configMapAt is the content of file as a ConfigMap mounted at its
// directory holds it.
func configMapAt(t *testing.T, r rendered, d *appsv1.Deployment, c *corev1.Container, file string) string {
	t.Helper()
	v := mountOf(t, d, c, path.Dir(file))
	if v == nil || v.ConfigMap == nil {
		t.Fatalf("%s: no ConfigMap is mounted at %s", file, path.Dir(file))
	}
	data, ok := named[corev1.ConfigMap](t, r, v.ConfigMap.Name).Data[path.Base(file)]
	if !ok {
		t.Fatalf("%s: ConfigMap %s has no key %s", file, v.ConfigMap.Name, path.Base(file))
	}
	return data
}

// secretFiles are the files capsnap.yaml names that hold secrets.
func secretFiles(cfg config.Config) map[string]string {
	files := map[string]string{
		"admin.token_file":              cfg.Admin.TokenFile,
		"grpc_tls.cert_file":            cfg.GRPCTLS.CertFile,
		"grpc_tls.key_file":             cfg.GRPCTLS.KeyFile,
		"grpc_tls.client_ca_file":       cfg.GRPCTLS.ClientCAFile,
		"snapshots.redis.secret_file":   cfg.Snapshots.Redis.SecretFile,
		"snapshots.redis.password_file": cfg.Snapshots.Redis.PasswordFile,
		"snapshots.redis.tls.ca_file":   cfg.Snapshots.Redis.TLS.CAFile,
		"snapshots.redis.tls.cert_file": cfg.Snapshots.Redis.TLS.CertFile,
		"snapshots.redis.tls.key_file":  cfg.Snapshots.Redis.TLS.KeyFile,
	}
	for i, f := range cfg.Envelope.KeyFiles {
		files[fmt.Sprintf("envelope.key_files[%d]", i)] = f
	}
	files["approvals.auth.jwks_file"] = cfg.Approvals.Auth.JWKSFile
	files["approvals.auth.dev_tokens_file"] = cfg.Approvals.Auth.DevTokensFile
	maps.DeleteFunc(files, func(_, f string) bool { return f == "" })
	return files
}

// imageUser is the uid and gid make image's image runs as
// (deploy/image/testdata/config.golden.json).
func imageUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	data, err := os.ReadFile("../deploy/image/testdata/config.golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var img struct {
		Config struct {
			User string `json:"User"`
		} `json:"config"`
	}
	if err := json.Unmarshal(data, &img); err != nil {
		t.Fatal(err)
	}
	u, g, _ := strings.Cut(img.Config.User, ":")
	uid, err = strconv.ParseInt(u, 10, 64)
	if err == nil {
		gid, err = strconv.ParseInt(g, 10, 64)
	}
	if err != nil {
		t.Fatalf("image user %q: %v", img.Config.User, err)
	}
	return uid, gid
}

func TestChartRenders(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.values, func(t *testing.T) {
			r := render(t, sc.values, "--set-file", "policy="+sc.policy)
			if got := kinds(r); !maps.Equal(got, sc.kinds) {
				t.Errorf("objects %v, want %v", got, sc.kinds)
			}
			cfg, _ := configOf(t, r, sc.policy)
			d, c := capsnapDeployment(t, r)
			checkDeployment(t, r, cfg, d, c)
			if c.Image != sc.image {
				t.Errorf("image %s, want %s", c.Image, sc.image)
			}

			got := map[string]string{}
			for field, file := range secretFiles(cfg) {
				v := mountOf(t, d, c, path.Dir(file))
				if v == nil || v.Secret == nil || len(v.Secret.Items) != 0 {
					t.Errorf("%s %s: not in a whole Secret mounted at %s", field, file, path.Dir(file))
					continue
				}
				got[field] = v.Secret.SecretName + "/" + path.Base(file)
				renderedSecretFile(t, r, d, c, file)
			}
			if !maps.Equal(got, sc.secrets) {
				t.Errorf("secret files %v\nwant %v", got, sc.secrets)
			}

			checkService(t, r, d)
			checkStore(t, r, cfg, d)
			for _, pdb := range all[policyv1.PodDisruptionBudget](r) {
				if !selects(t, pdb.Spec.Selector, d.Spec.Template.Labels) || (pdb.Spec.MinAvailable == nil) == (pdb.Spec.MaxUnavailable == nil) {
					t.Errorf("PodDisruptionBudget %s: want it to select capsnap's pods, with one of minAvailable and maxUnavailable", pdb.Name)
				}
			}
			var opens []string
			for _, np := range all[networkingv1.NetworkPolicy](r) {
				opens = append(opens, checkNetworkPolicy(t, r, np)...)
			}
			slices.Sort(opens)
			if !slices.Equal(opens, sc.opens) {
				t.Errorf("the NetworkPolicies open capsnap's ports %v, want %v", opens, sc.opens)
			}
			checkApprovals(t, r, cfg)
			if sm := all[monitoringv1.ServiceMonitor](r); len(sm) != 0 {
				checkServiceMonitor(t, r, sm[0])
			}
			if pr := all[monitoringv1.PrometheusRule](r); len(pr) != 0 {
				checkPrometheusRule(t, pr[0])
			}
		})
	}
}

func checkDeployment(t *testing.T, r rendered, cfg config.Config, d *appsv1.Deployment, c *corev1.Container) {
	t.Helper()
	pod := d.Spec.Template.Spec
	if !selects(t, d.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the pod template's labels %v", d.Spec.Selector, d.Spec.Template.Labels)
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas > 1 && cfg.Snapshots.Store != config.StoreRedis {
		t.Errorf("%v replicas on snapshots.store %s: a call that reaches another replica than its tools/list is denied no_snapshot", d.Spec.Replicas, cfg.Snapshots.Store)
	}
	if ru := d.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("strategy %+v: want maxUnavailable 0, so that a configuration capsnap refuses stalls the rollout", d.Spec.Strategy)
	}
	if sa := one[corev1.ServiceAccount](t, r); pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName %q, want the chart's ServiceAccount %q", pod.ServiceAccountName, sa.Name)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= cfg.Drain+capsnapShutdown {
		t.Errorf("terminationGracePeriodSeconds must exceed capsnap's drain and shutdown (%s)", cfg.Drain+capsnapShutdown)
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	listeners := map[string]string{"grpc": cfg.GRPCAddr, "admin": cfg.AdminAddr}
	if cfg.Approvals.Addr != "" {
		listeners["approvals"] = cfg.Approvals.Addr
	}
	if len(ports) != len(listeners) {
		t.Errorf("container ports %v, want one for each of capsnap's listeners %v", ports, listeners)
	}
	for name, addr := range listeners {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if strconv.Itoa(int(ports[name])) != port || host != "0.0.0.0" {
			t.Errorf("container port %s %d, capsnap.yaml listens on %s", name, ports[name], addr)
		}
	}
	for _, p := range []struct {
		name string
		pr   *corev1.Probe
		path string
	}{{"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if p.pr == nil || p.pr.HTTPGet == nil || p.pr.HTTPGet.Path != p.path || p.pr.HTTPGet.Port.String() != "admin" {
			t.Errorf("%s: want httpGet %s on the admin port", p.name, p.path)
		}
	}

	uid, gid := imageUser(t)
	for name, sc := range map[string]struct {
		nonRoot     *bool
		user, group *int64
	}{
		"pod":       {pod.SecurityContext.RunAsNonRoot, pod.SecurityContext.RunAsUser, pod.SecurityContext.RunAsGroup},
		"container": {c.SecurityContext.RunAsNonRoot, c.SecurityContext.RunAsUser, c.SecurityContext.RunAsGroup},
	} {
		if sc.nonRoot == nil || !*sc.nonRoot || sc.user == nil || *sc.user != uid || sc.group == nil || *sc.group != gid {
			t.Errorf("%s securityContext: want runAsNonRoot and the image's user %d:%d", name, uid, gid)
		}
	}
	if fs := pod.SecurityContext.FSGroup; fs == nil || *fs != gid {
		t.Errorf("pod securityContext: fsGroup must be capsnap's group %d, or it cannot read its Secrets (mode 0440)", gid)
	}
	csc := c.SecurityContext
	if csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
		csc.Capabilities == nil || !slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) != 0 {
		t.Errorf("container securityContext %+v: want a read-only root file system, no privilege escalation, every capability dropped", csc)
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want a memory request and limit (GOMEMLIMIT follows the limit)", c.Resources)
	}
}

func checkService(t *testing.T, r rendered, d *appsv1.Deployment) {
	t.Helper()
	_, c := capsnapDeployment(t, r)
	s := named[corev1.Service](t, r, d.Name)
	if !selects(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, d.Spec.Template.Labels) {
		t.Errorf("Service %s does not select capsnap's pods", s.Name)
	}
	for _, ss := range all[appsv1.StatefulSet](r) {
		if selects(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, ss.Spec.Template.Labels) {
			t.Errorf("Service %s selects %s's pods too", s.Name, ss.Name)
		}
	}
	want := map[string]int32{}
	for _, p := range c.Ports {
		want[p.Name] = p.ContainerPort
	}
	got := map[string]int32{}
	for _, p := range s.Spec.Ports {
		if p.TargetPort.String() != p.Name {
			t.Errorf("Service port %s targets %s, want the container port of its name", p.Name, p.TargetPort.String())
		}
		got[p.Name] = p.Port
	}
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Errorf("Service ports %v, want one for each of the container's %v", got, want)
	}
	// Envoy's filters and Prometheus dial capsnap's own numbers; the
	// approvals port is the Service's to choose (approvals.service.port).
	for _, name := range []string{"grpc", "admin"} {
		if got[name] != want[name] {
			t.Errorf("Service port %s %d, want the container's %d", name, got[name], want[name])
		}
	}
}

// checkStore checks that capsnap reaches the bundled Redis, when there is
// one, and only capsnap does.
func checkStore(t *testing.T, r rendered, cfg config.Config, d *appsv1.Deployment) {
	t.Helper()
	ss := all[appsv1.StatefulSet](r)
	if len(ss) == 0 {
		return
	}
	redis := ss[0]
	host, port, err := net.SplitHostPort(cfg.Snapshots.Redis.Addr)
	if err != nil {
		t.Fatal(err)
	}
	svc := named[corev1.Service](t, r, host)
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, redis.Spec.Template.Labels) {
		t.Errorf("snapshots.redis.addr %s: Service %s does not select the bundled Redis", cfg.Snapshots.Redis.Addr, host)
	}
	if len(svc.Spec.Ports) != 1 || strconv.Itoa(int(svc.Spec.Ports[0].Port)) != port {
		t.Errorf("snapshots.redis.addr %s: Service %s ports %+v", cfg.Snapshots.Redis.Addr, host, svc.Spec.Ports)
	}
	for _, np := range all[networkingv1.NetworkPolicy](r) {
		if !selects(t, &np.Spec.PodSelector, redis.Spec.Template.Labels) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, from := range rule.From {
				if from.PodSelector == nil || !selects(t, from.PodSelector, d.Spec.Template.Labels) || from.NamespaceSelector != nil {
					t.Errorf("NetworkPolicy %s admits %+v; want capsnap's pods alone", np.Name, from)
				}
			}
			if len(rule.Ports) != 1 || rule.Ports[0].Port.String() != strconv.Itoa(int(redis.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort)) {
				t.Errorf("NetworkPolicy %s ports %+v, want Redis's", np.Name, rule.Ports)
			}
		}
		return
	}
	t.Errorf("no NetworkPolicy keeps the bundled Redis to capsnap")
}

// checkNetworkPolicy refuses a rule that admits everyone (one with no
// peers) or any port; the one for capsnap must open its grpc port, and
// may open only its own ports, whose names it returns.
func checkNetworkPolicy(t *testing.T, r rendered, np *networkingv1.NetworkPolicy) []string {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Ingress) == 0 {
		t.Errorf("NetworkPolicy %s: want Ingress rules", np.Name)
	}
	d, c := capsnapDeployment(t, r)
	ports := map[string]bool{}
	names := map[string]string{}
	var grpc string
	for _, p := range c.Ports {
		ports[strconv.Itoa(int(p.ContainerPort))] = false
		names[strconv.Itoa(int(p.ContainerPort))] = p.Name
		if p.Name == "grpc" {
			grpc = strconv.Itoa(int(p.ContainerPort))
		}
	}
	for i, rule := range np.Spec.Ingress {
		if len(rule.From) == 0 || len(rule.Ports) == 0 {
			t.Errorf("NetworkPolicy %s: rule %d admits every peer or every port", np.Name, i)
		}
		for _, p := range rule.Ports {
			if _, ok := ports[p.Port.String()]; ok {
				ports[p.Port.String()] = true
			} else if selects(t, &np.Spec.PodSelector, d.Spec.Template.Labels) {
				t.Errorf("NetworkPolicy %s opens port %s, which capsnap does not listen on", np.Name, p.Port.String())
			}
		}
	}
	if !selects(t, &np.Spec.PodSelector, d.Spec.Template.Labels) {
		return nil
	}
	if !ports[grpc] {
		t.Errorf("NetworkPolicy %s does not open the grpc port: no Envoy could reach capsnap", np.Name)
	}
	var opened []string
	for port, open := range ports {
		if open {
			opened = append(opened, names[port])
		}
	}
	return opened
}

// renderedSecretFile is the content of file, a key of the Secret mounted
// at its directory, when that Secret is one the chart renders; ok is false
// when it is the operator's.
func renderedSecretFile(t *testing.T, r rendered, d *appsv1.Deployment, c *corev1.Container, file string) (data []byte, ok bool) {
	t.Helper()
	v := mountOf(t, d, c, path.Dir(file))
	if v == nil || v.Secret == nil {
		t.Fatalf("%s: no Secret is mounted at %s", file, path.Dir(file))
	}
	s := find[corev1.Secret](r, v.Secret.SecretName)
	if s == nil {
		return nil, false
	}
	data, ok = s.Data[path.Base(file)]
	if !ok {
		t.Fatalf("%s: Secret %s has no key %s", file, s.Name, path.Base(file))
	}
	return data, true
}

// checkApprovals checks the approval listener's wiring: the base URL
// approvers are sent to, the Service port or Ingress it leads to, and the
// approvers' files the chart renders, loaded as capsnap serve loads them.
func checkApprovals(t *testing.T, r rendered, cfg config.Config) {
	t.Helper()
	d, c := capsnapDeployment(t, r)
	ingresses := all[networkingv1.Ingress](r)
	a := cfg.Approvals
	if a.Addr == "" {
		if len(ingresses) != 0 {
			t.Errorf("an Ingress, with approvals off")
		}
		return
	}
	svc := named[corev1.Service](t, r, d.Name)
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "approvals" {
			port = p.Port
		}
	}
	base, err := url.Parse(a.BaseURL)
	if err != nil {
		t.Fatal(err)
	}
	switch len(ingresses) {
	case 0:
		if want := fmt.Sprintf("%s.%s.svc.cluster.local:%d", svc.Name, namespace, port); base.Scheme != "http" || base.Host != want {
			t.Errorf("approvals.base_url %s without an Ingress, want the Service's http://%s", a.BaseURL, want)
		}
	case 1:
		checkApprovalsIngress(t, ingresses[0], svc, base)
	default:
		t.Errorf("%d Ingresses, want one at most", len(ingresses))
	}

	if f := a.Auth.DevTokensFile; f != "" {
		if data, ok := renderedSecretFile(t, r, d, c, f); ok {
			if _, err := approval.LoadDevTokens(tempFile(t, data), zerolog.Nop()); err != nil {
				t.Errorf("approvals.auth.dev_tokens_file: %v", err)
			}
		}
	}
	if f := a.Auth.JWKSFile; f != "" {
		if data, ok := renderedSecretFile(t, r, d, c, f); ok {
			if _, err := approval.NewJWT(approval.JWTConfig{JWKSFile: tempFile(t, data), Issuer: a.Auth.Issuer, Audience: a.Auth.Audience}); err != nil {
				t.Errorf("approvals.auth.jwks_file: %v", err)
			}
		}
	}
}

// checkApprovalsIngress: the Ingress serves the base URL's host, over TLS
// if and only if the base URL is https (where the sign-in cookie is
// Secure), and sends the approval routes, and only them, to the Service's
// approvals port.
func checkApprovalsIngress(t *testing.T, ing *networkingv1.Ingress, svc *corev1.Service, base *url.URL) {
	t.Helper()
	if len(ing.Spec.Rules) != 1 || ing.Spec.Rules[0].Host != base.Host || ing.Spec.Rules[0].HTTP == nil {
		t.Fatalf("Ingress %s rules %+v, want one for approvals.base_url's host %s", ing.Name, ing.Spec.Rules, base.Host)
	}
	tls := false
	for _, x := range ing.Spec.TLS {
		tls = tls || slices.Contains(x.Hosts, base.Host)
	}
	if tls != (base.Scheme == "https") {
		t.Errorf("Ingress %s: TLS for %s %v, and approvals.base_url is %s", ing.Name, base.Host, tls, base)
	}
	var paths []string
	for _, p := range ing.Spec.Rules[0].HTTP.Paths {
		paths = append(paths, p.Path)
		b := p.Backend.Service
		if p.PathType == nil || *p.PathType != networkingv1.PathTypePrefix || b == nil || b.Name != svc.Name || b.Port.Name != "approvals" {
			t.Errorf("Ingress %s path %s: want a Prefix to Service %s's port approvals", ing.Name, p.Path, svc.Name)
		}
	}
	if want := []string{"/approvals", "/api/approvals"}; !slices.Equal(paths, want) {
		t.Errorf("Ingress %s paths %v, want the approval routes %v", ing.Name, paths, want)
	}
}

func tempFile(t *testing.T, data []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func checkServiceMonitor(t *testing.T, r rendered, sm *monitoringv1.ServiceMonitor) {
	t.Helper()
	d := one[appsv1.Deployment](t, r)
	s := named[corev1.Service](t, r, d.Name)
	if !selects(t, &sm.Spec.Selector, s.Labels) {
		t.Errorf("ServiceMonitor selector %v does not select the Service's labels %v", sm.Spec.Selector, s.Labels)
	}
	// The alert rules select job="capsnap".
	if s.Labels[sm.Spec.JobLabel] != "capsnap" {
		t.Errorf("ServiceMonitor jobLabel %q: the Service's is %q, want capsnap, the job the alerts select", sm.Spec.JobLabel, s.Labels[sm.Spec.JobLabel])
	}
	if !slices.Equal(sm.Spec.NamespaceSelector.MatchNames, []string{namespace}) {
		t.Errorf("ServiceMonitor namespaceSelector %+v, want the release's namespace", sm.Spec.NamespaceSelector)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %+v, want the admin port's /metrics", sm.Spec.Endpoints)
	}
}

// checkPrometheusRule holds the rule to examples/prometheus/alerts.yaml.
func checkPrometheusRule(t *testing.T, pr *monitoringv1.PrometheusRule) {
	t.Helper()
	data, err := os.ReadFile("../examples/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var want monitoringv1.PrometheusRuleSpec
	if err := decodeStrict(data, &want); err != nil {
		t.Fatalf("examples/prometheus/alerts.yaml: %v", err)
	}
	if len(want.Groups) == 0 || !reflect.DeepEqual(pr.Spec, want) {
		t.Errorf("PrometheusRule %s is not examples/prometheus/alerts.yaml", pr.Name)
	}
}

// TestChartReload: a change to capsnap.yaml rolls the pods (capsnap reads
// it at start only); a change to the policy does not, since capsnap polls
// it, unless policyRolloutOnChange asks for that.
func TestChartReload(t *testing.T) {
	edited := filepath.Join(t.TempDir(), "policy.yaml")
	data, err := os.ReadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(edited, append(data, "# edited\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	type pod struct{ config, policy, policyData string }
	state := func(r rendered) pod {
		t.Helper()
		d, _ := capsnapDeployment(t, r)
		_, pdata := configOf(t, r, policyFile)
		a := d.Spec.Template.Annotations
		return pod{a["checksum/config"], a["checksum/policy"], pdata["policy.yaml"]}
	}
	base := state(render(t, "mtls.yaml"))
	if base.config == "" {
		t.Fatal("no checksum/config annotation")
	}
	if base.policy != "" {
		t.Error("checksum/policy without policyRolloutOnChange: a policy edit would restart capsnap instead of being polled")
	}
	if s := state(render(t, "mtls.yaml", "--set", "config.drain=6s")); s.config == base.config {
		t.Error("checksum/config did not change with capsnap.yaml")
	}
	policyEdit := state(render(t, "mtls.yaml", "--set-file", "policy="+edited))
	if policyEdit.policyData == base.policyData {
		t.Fatal("the policy ConfigMap did not change with the policy")
	}
	if policyEdit.config != base.config {
		t.Error("checksum/config changed with the policy alone")
	}

	rollout := state(render(t, "mtls.yaml", "--set", "policyRolloutOnChange=true"))
	rolloutEdit := state(render(t, "mtls.yaml", "--set", "policyRolloutOnChange=true", "--set-file", "policy="+edited))
	if rollout.policy == "" || rollout.policy == rolloutEdit.policy {
		t.Error("policyRolloutOnChange: checksum/policy does not follow the policy")
	}
}

// TestChartApproversReload: capsnap reads development tokens at start
// only, so a change to the inline ones rolls the pods; a JWKS it reads
// again by itself, and a new one rolls nothing. Either reaches the pods as
// a file capsnap loads.
func TestChartApproversReload(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		t.Helper()
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	tokens := write("tokens.yaml", "tokens:\n  - {token: chart-test-oncall-0001, approver: oncall@acme.example, groups: [billing-oncall]}\n")
	rotated := write("rotated.yaml", "tokens:\n  - {token: chart-test-oncall-0002, approver: oncall@acme.example, groups: [billing-oncall]}\n")
	// RFC 8037's Ed25519 public key.
	jwks := write("jwks.json", `{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "approvers", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`)
	type pod struct{ approvers, config string }
	state := func(args ...string) pod {
		t.Helper()
		r := render(t, "mtls.yaml", append([]string{"--set", "approvals.enabled=true"}, args...)...)
		cfg, _ := configOf(t, r, policyFile)
		checkApprovals(t, r, cfg)
		d, _ := capsnapDeployment(t, r)
		a := d.Spec.Template.Annotations
		return pod{a["checksum/approvers"], a["checksum/config"]}
	}

	base := state("--set-file", "approvals.auth.devTokens="+tokens)
	if base.approvers == "" {
		t.Fatal("no checksum/approvers annotation with inline development tokens")
	}
	if s := state("--set-file", "approvals.auth.devTokens="+rotated); s.approvers == base.approvers || s.config != base.config {
		t.Errorf("development tokens changed: checksum/approvers %s -> %s, checksum/config %s -> %s; want only the first to change",
			base.approvers, s.approvers, base.config, s.config)
	}
	s := state("--set", "approvals.auth.issuer=https://login.acme.example/", "--set", "approvals.auth.audience=capsnap-approvals",
		"--set-file", "approvals.auth.jwks="+jwks)
	if s.approvers != "" {
		t.Error("checksum/approvers with a JWKS: a new key would restart capsnap, which reads the JWKS again by itself")
	}
}

// TestChartRefuses: what would deploy a capsnap that cannot work, or one
// less guarded than it looks, does not render.
func TestChartRefuses(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Approvals on, with what the chart needs of them to render.
	devTokens := []string{"--set", "approvals.enabled=true", "--set", "approvals.auth.devTokens=tokens"}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no servers", []string{"--set-json", "servers=[]"}, "/servers"},
		{"a server with neither url nor catalog_file", []string{"--set-json", `servers=[{"id":"billing"}]`}, "/servers/0"},
		{"no policy", []string{"--set-file", "policy=" + empty}, "/policy"},
		{"grpc TLS admitting no one", []string{"--set-json", "grpcTLS.allowedClients=[]"}, "/grpcTLS/allowedClients"},
		{"a grpc rule admitting everyone", []string{"--set-json", "networkPolicy.grpcFrom=[]"}, "/networkPolicy/grpcFrom"},
		{"external Redis without an address", []string{"--set", "redis.mode=external"}, "/redis/external/addr"},
		{"the memory store on three replicas", []string{"--set", "redis.mode=none"}, "redis.mode none"},
		{"a listener in config", []string{"--set", "config.grpc_addr=127.0.0.1:9001"}, "config.grpc_addr is set by the chart"},
		{"the store in config", []string{"--set", "config.snapshots.store=memory"}, "config.snapshots.store is set by the chart"},
		{"the store's secret in config", []string{"--set", "config.snapshots.redis.secret_file=/tmp/key"}, "config.snapshots.redis.secret_file is set by the chart"},
		{"envelope keys in config", []string{"--set-json", `config.envelope.key_files=["/tmp/k.pem"]`}, "config.envelope.key_files is set by the chart"},
		{"envelope keys without their Secret", []string{"--set-json", `envelope.keys=["k.pem"]`}, "/envelope/keysSecret"},
		{"an image digest that is none", []string{"--set", "image.digest=latest"}, "/image/digest"},
		{"an unknown value", []string{"--set", "replicas=3"}, "replicas"},
		{"approvals without approvers' tokens", []string{"--set", "approvals.enabled=true"}, "approvals.enabled: no approvers' tokens"},
		{"approvers' tokens from two sources", append(devTokens, "--set", "approvals.auth.jwksURL=https://login.acme.example/jwks"), "more than one source of the approvers' tokens (jwksURL, devTokens)"},
		{"inline tokens and an existing Secret", append(devTokens, "--set", "approvals.auth.existingSecret.name=approvers"), "existingSecret and the inline jwks or devTokens are both set"},
		{"a key without its Secret", []string{"--set", "approvals.enabled=true", "--set", "approvals.auth.existingSecret.devTokensKey=tokens.yaml"}, "a key is set without the Secret's name"},
		{"a JWKS without issuer and audience", []string{"--set", "approvals.enabled=true", "--set", "approvals.auth.jwksURL=https://login.acme.example/jwks"}, "approvals.auth.issuer and approvals.auth.audience are required"},
		{"the approvals listener in config", append(devTokens, "--set", "config.approvals.addr=0.0.0.0:9003"), "config.approvals.addr is set by the chart"},
		{"the approvers' files in config", append(devTokens, "--set", "config.approvals.auth.dev_tokens_file=/tmp/tokens"), "config.approvals.auth is set by the chart"},
		{"approvals config with approvals off", []string{"--set", "config.approvals.pending_ttl=30m"}, "config.approvals is set, but approvals.enabled is false"},
		{"an approvals Ingress with approvals off", []string{"--set", "approvals.ingress.enabled=true", "--set", "approvals.ingress.host=approvals.acme.example"}, "the Ingress would lead nowhere"},
		{"an approvals Ingress without a host", append(devTokens, "--set", "approvals.ingress.enabled=true"), "/approvals/ingress/host"},
		{"the approvals port on the admin port", append(devTokens, "--set", "approvals.port=9002"), "approvals.port 9002 is capsnap's grpc or admin port"},
		{"a privileged approvals port", append(devTokens, "--set", "approvals.port=443"), "/approvals/port"},
		{"a base URL with a path", append(devTokens, "--set", "approvals.baseURL=https://acme.example/approvals"), "/approvals/baseURL"},
		{"an approvers' key with a directory", []string{"--set", "approvals.auth.existingSecret.jwksKey=keys/jwks.json"}, "/approvals/auth/existingSecret/jwksKey"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := helm(t, append([]string{"template", release, chart, "-f", "testdata/mtls.yaml", "--set-file", "policy=" + policyFile}, c.args...)...)
			if err == nil {
				t.Fatalf("rendered:\n%s", out)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("the error does not name %q:\n%v", c.want, err)
			}
		})
	}
}

// TestChartLint runs helm lint --strict on each values file, and on the
// chart alone, which must fail for want of servers and a policy.
func TestChartLint(t *testing.T) {
	for _, sc := range scenarios {
		if out, err := helm(t, "lint", "--strict", chart, "-f", filepath.Join("testdata", sc.values), "--set-file", "policy="+sc.policy); err != nil {
			t.Errorf("%s: %v\n%s", sc.values, err, out)
		}
	}
	out, err := helm(t, "lint", "--strict", chart)
	if err == nil || !strings.Contains(err.Error(), "/servers") || !strings.Contains(err.Error(), "/policy") {
		t.Errorf("helm lint without servers and a policy: %v\n%s", err, out)
	}
}

// TestAlertsAreTheExamples: the chart's PrometheusRule is
// examples/prometheus/alerts.yaml, which examples/deploy tests.
func TestAlertsAreTheExamples(t *testing.T) {
	chartRules, err := os.ReadFile("capsnap/files/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	examples, err := os.ReadFile("../examples/prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chartRules, examples) {
		t.Error("charts/capsnap/files/alerts.yaml differs from examples/prometheus/alerts.yaml; copy it again")
	}
}
