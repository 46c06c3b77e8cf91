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
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

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
	// capsnapShutdown is how long capsnap may take after its drain:
	// in-flight Checks, then the admin listener (cmd/capsnap/serve.go).
	capsnapShutdown = 2 * 10 * time.Second
)

// The API types every object the chart renders must decode into, strictly:
// a field the type lacks, a duplicate or a wrong case is an error, as with
// the API server's strict field validation.
var apiTypes = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                       func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget":           func() any { return &policyv1.PodDisruptionBudget{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
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
	// image is the Deployment's image reference.
	image string
	// secrets are where the files capsnap.yaml names come from:
	// "Secret/key" by capsnap.yaml field.
	secrets map[string]string
	// kinds counts the objects of each kind.
	kinds map[string]int
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
		image:  "registry.example.com/capsnap:0.1.0",
		secrets: union(grpcTLSSecrets, map[string]string{
			"snapshots.redis.secret_file": "capsnap-snapshot-key/snapshot.key",
		}),
		kinds: map[string]int{"ConfigMap": 2, "Deployment": 1, "NetworkPolicy": 2, "PodDisruptionBudget": 1, "Service": 2, "ServiceAccount": 1, "StatefulSet": 1},
	},
	{
		values: "jwt-istio.yaml",
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
	},
	{
		values:  "single.yaml",
		image:   "registry.example.com/capsnap:0.1.0",
		secrets: grpcTLSSecrets,
		kinds:   map[string]int{"ConfigMap": 2, "Deployment": 1, "Service": 1, "ServiceAccount": 1},
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

func named[T any](t *testing.T, r rendered, name string) *T {
	t.Helper()
	for _, o := range all[T](r) {
		if any(o).(metav1.Object).GetName() == name {
			return o
		}
	}
	t.Fatalf("no %T named %q", *new(T), name)
	return nil
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
// capsnap, and the policy ConfigMap's data.
func configOf(t *testing.T, r rendered) (config.Config, map[string]string) {
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
	want, err := policy.Load(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	if p.Digest() != want.Digest() {
		t.Errorf("policy %s is not %s, the one given with --set-file", p.Digest(), policyFile)
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
			r := render(t, sc.values)
			if got := kinds(r); !maps.Equal(got, sc.kinds) {
				t.Errorf("objects %v, want %v", got, sc.kinds)
			}
			cfg, _ := configOf(t, r)
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
			for _, np := range all[networkingv1.NetworkPolicy](r) {
				checkNetworkPolicy(t, r, np)
			}
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
	for name, addr := range map[string]string{"grpc": cfg.GRPCAddr, "admin": cfg.AdminAddr} {
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
		if want[p.TargetPort.String()] != p.Port {
			t.Errorf("Service port %s: %d -> %s, want the container port of that name", p.Name, p.Port, p.TargetPort.String())
		}
		got[p.Name] = p.Port
	}
	if !maps.Equal(got, want) {
		t.Errorf("Service ports %v, want the container's %v", got, want)
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
// may open only its own ports.
func checkNetworkPolicy(t *testing.T, r rendered, np *networkingv1.NetworkPolicy) {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Ingress) == 0 {
		t.Errorf("NetworkPolicy %s: want Ingress rules", np.Name)
	}
	d, c := capsnapDeployment(t, r)
	ports := map[string]bool{}
	var grpc string
	for _, p := range c.Ports {
		ports[strconv.Itoa(int(p.ContainerPort))] = false
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
	if selects(t, &np.Spec.PodSelector, d.Spec.Template.Labels) && !ports[grpc] {
		t.Errorf("NetworkPolicy %s does not open the grpc port: no Envoy could reach capsnap", np.Name)
	}
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
		_, pdata := configOf(t, r)
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

// TestChartRefuses: what would deploy a capsnap that cannot work, or one
// less guarded than it looks, does not render.
func TestChartRefuses(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
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
		if out, err := helm(t, "lint", "--strict", chart, "-f", filepath.Join("testdata", sc.values), "--set-file", "policy="+policyFile); err != nil {
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
