package deploy

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/url"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	typematcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envoy"
	"github.com/capsnap/capsnap/policy"
	"github.com/capsnap/capsnap/testbed"
)

// jwtAuthnNamespace is where jwt_authn writes the verified payload,
// whatever the filter is named.
const jwtAuthnNamespace = "envoy.filters.http.jwt_authn"

// jwtEnvoy is an Envoy configuration that verifies bearer tokens, decoded:
// its one jwt_authn provider, its ext_authz filter, the server_id of each
// route and its clusters' addresses.
type jwtEnvoy struct {
	b        *bootstrapv3.Bootstrap
	hcm      *hcmv3.HttpConnectionManager
	provider *jwtauthnv3.JwtProvider
	authn    *jwtauthnv3.JwtAuthentication
	authz    *extauthzv3.ExtAuthz
	// servers are the routes' server_ids, by the cluster each routes to.
	servers map[string]string
	// endpoints are each cluster's host:port.
	endpoints map[string]string
}

func decodeJWTEnvoy(t *testing.T, where string, cfg []byte) *jwtEnvoy {
	t.Helper()
	b, err := testbed.DecodeEnvoy(cfg)
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	managers, err := testbed.HTTPManagers(b)
	if err != nil || len(managers) != 1 {
		t.Fatalf("%s: want one HTTP connection manager, have %d (%v)", where, len(managers), err)
	}
	e := &jwtEnvoy{b: b, hcm: managers[0], servers: map[string]string{}, endpoints: map[string]string{}}
	for _, hf := range managers[0].GetHttpFilters() {
		a, z := &jwtauthnv3.JwtAuthentication{}, &extauthzv3.ExtAuthz{}
		switch {
		case hf.GetTypedConfig().UnmarshalTo(a) == nil:
			if e.authn != nil || len(a.GetProviders()) != 1 {
				t.Fatalf("%s: want one jwt_authn filter with one provider", where)
			}
			e.authn = a
			for _, p := range a.GetProviders() {
				e.provider = p
			}
		case hf.GetTypedConfig().UnmarshalTo(z) == nil:
			e.authz = z
		}
	}
	if e.authn == nil || e.authz == nil {
		t.Fatalf("%s: want a jwt_authn and an ext_authz filter", where)
	}
	for _, vh := range managers[0].GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			var per extauthzv3.ExtAuthzPerRoute
			if err := r.GetTypedPerFilterConfig()[extAuthzFilter].UnmarshalTo(&per); err != nil {
				t.Fatalf("%s: route %v: %v", where, r.GetMatch(), err)
			}
			e.servers[r.GetRoute().GetCluster()] = per.GetCheckSettings().GetContextExtensions()["server_id"]
		}
	}
	for _, c := range b.GetStaticResources().GetClusters() {
		a := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		e.endpoints[c.GetName()] = net.JoinHostPort(a.GetAddress(), strconv.Itoa(int(a.GetPortValue())))
	}
	return e
}

// admits says whether some subject the provider admits matches a policy
// rule: exactly id, or any with prefix. It knows the matchers the
// configurations here use, exact and prefix, and fails on any other.
func admits(t *testing.T, sm *typematcherv3.StringMatcher, id, prefix string) bool {
	t.Helper()
	switch {
	case sm == nil:
		return true
	case sm.GetExact() != "":
		return sm.GetExact() == id || prefix != "" && strings.HasPrefix(sm.GetExact(), prefix)
	case sm.GetPrefix() != "":
		return id != "" && strings.HasPrefix(id, sm.GetPrefix()) ||
			prefix != "" && (strings.HasPrefix(prefix, sm.GetPrefix()) || strings.HasPrefix(sm.GetPrefix(), prefix))
	}
	t.Fatalf("subjects %v: this test knows exact and prefix matchers only", sm)
	return false
}

// examples/jwt is capsnap behind envoy/jwt.yaml: its configuration and
// policy load, capsnap reads the principal where that Envoy's jwt_authn
// writes it and its ext_authz passes it, the servers are the routes'
// server_ids at the clusters' addresses, capsnap listens where the capsnap
// cluster dials, and every principal rule of the policy can match a
// subject jwt_authn admits.
func TestJWTSample(t *testing.T) {
	cfg, err := config.Load(repoPath("examples", "jwt", "capsnap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(cfg.PolicyFile)
	if err != nil {
		t.Fatal(err)
	}
	e := decodeJWTEnvoy(t, "envoy/jwt.yaml", readFile(t, "envoy", "jwt.yaml"))

	j := cfg.Principal.JWT
	if cfg.Principal.Source != config.SourceJWT || j.MetadataNamespace != jwtAuthnNamespace || j.PayloadKey != e.provider.GetPayloadInMetadata() {
		t.Errorf("principal %+v: want source jwt from %s, payload_key %q (the provider's payload_in_metadata)", cfg.Principal, jwtAuthnNamespace, e.provider.GetPayloadInMetadata())
	}
	if !slices.Contains(e.authz.GetMetadataContextNamespaces(), j.MetadataNamespace) {
		t.Errorf("envoy/jwt.yaml's ext_authz does not pass %s to capsnap", j.MetadataNamespace)
	}
	if e.endpoints["capsnap"] != cfg.GRPCAddr {
		t.Errorf("grpc_addr %s, but envoy/jwt.yaml's capsnap cluster dials %s", cfg.GRPCAddr, e.endpoints["capsnap"])
	}
	routed := map[string]string{} // server_id -> host:port
	for cluster, id := range e.servers {
		routed[id] = e.endpoints[cluster]
	}
	for _, s := range cfg.Servers {
		u, err := url.Parse(s.URL)
		if err != nil || u.Host != routed[s.ID] {
			t.Errorf("server %s: url %s, but envoy/jwt.yaml routes server_id %s to %q", s.ID, s.URL, s.ID, routed[s.ID])
		}
		delete(routed, s.ID)
	}
	if len(routed) != 0 {
		t.Errorf("envoy/jwt.yaml routes server_ids %v, which capsnap.yaml does not configure (unknown_server)", routed)
	}
	if cfg.Limits.MaxBodyBytes != int(e.authz.GetWithRequestBody().GetMaxRequestBytes()) || cfg.Discovery.MaxResponseBytes != cfg.Limits.MaxBodyBytes {
		t.Errorf("limits.max_body_bytes %d and discovery.max_response_bytes %d, envoy/jwt.yaml's max_request_bytes %d: keep them equal",
			cfg.Limits.MaxBodyBytes, cfg.Discovery.MaxResponseBytes, e.authz.GetWithRequestBody().GetMaxRequestBytes())
	}

	// Every rule can match a subject Envoy admits; one that cannot is
	// dead, and says the policy and the Envoy disagree.
	var file struct {
		Principals []struct {
			ID       string `yaml:"id"`
			IDPrefix string `yaml:"id_prefix"`
		} `yaml:"principals"`
	}
	if err := yaml.Unmarshal(readFile(t, "examples", "jwt", "policy.yaml"), &file); err != nil {
		t.Fatal(err)
	}
	for _, r := range file.Principals {
		if !admits(t, e.provider.GetSubjects(), r.ID, r.IDPrefix) {
			t.Errorf("policy principal %q%q: envoy/jwt.yaml admits no such subject (subjects %v)", r.ID, r.IDPrefix, e.provider.GetSubjects())
		}
	}
	// What the sample says its rules mean: one agent by its exact subject
	// may refund; any other agent only reads.
	for _, tt := range []struct {
		subject, server string
		want            []string
	}{
		{"spiffe://acme/agent/support-refund", "billing", []string{"lookup_order", "refund"}},
		{"spiffe://acme/agent/support-refund", "payments", []string{"refund"}},
		{"spiffe://acme/agent/any-other", "billing", []string{"lookup_order"}},
		{"spiffe://acme/agent/any-other", "payments", []string{"lookup_order"}},
		{"spiffe://acme/service/billing", "billing", nil},
	} {
		got := pol.Allowed(tt.subject, tt.server)
		slices.Sort(got)
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s on %s may call %v, want %v", tt.subject, tt.server, got, tt.want)
		}
	}
}

// checkJWKS holds a sample key set to what jwt_authn verifies with: public
// signing keys only, each named (kid) and of a strong kind.
func checkJWKS(t *testing.T, where string, data []byte) {
	t.Helper()
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&set); err != nil || len(set.Keys) == 0 {
		t.Fatalf("%s: not a JSON Web Key Set with keys (%v)", where, err)
	}
	for i, k := range set.Keys {
		for _, private := range []string{"d", "p", "q", "dp", "dq", "qi", "k"} {
			if _, ok := k[private]; ok {
				t.Errorf("%s: key %d has the private member %q: publish public keys only", where, i, private)
			}
		}
		if k["kid"] == "" || k["use"] != "sig" {
			t.Errorf("%s: key %d: want a kid and use sig", where, i)
		}
		switch k["kty"] {
		case "RSA":
			n, err := base64.RawURLEncoding.DecodeString(k["n"])
			if err != nil || len(n)*8 < 2048 || !slices.Contains([]string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}, k["alg"]) {
				t.Errorf("%s: key %d: want an RSA key of at least 2048 bits for an RS or PS alg (%v)", where, i, err)
			}
		case "EC":
			if !slices.Contains([]string{"ES256", "ES384", "ES512"}, k["alg"]) || k["x"] == "" || k["y"] == "" {
				t.Errorf("%s: key %d: want an EC key (x, y) for an ES alg", where, i)
			}
		default:
			t.Errorf("%s: key %d: kty %q, want RSA or EC", where, i, k["kty"])
		}
	}
}

// gatewayCluster is c without what a deployment sets per place: how the
// address is found and what it is.
func gatewayCluster(c *clusterv3.Cluster) *clusterv3.Cluster {
	c = proto.Clone(c).(*clusterv3.Cluster)
	c.ClusterDiscoveryType, c.LoadAssignment = nil, nil
	return c
}

// examples/kubernetes/jwt is envoy/jwt.yaml run as a gateway in front of
// the MCP servers of examples/kubernetes: the same listener, jwt_authn,
// ext_authz, response path and access log; envoy/mtls.yaml's authenticated
// hop to capsnap's Service; the servers capsnap lists; and every file it
// reads mounted where it reads it, the keys from a generated ConfigMap.
func TestKubernetesJWTGateway(t *testing.T) {
	k := loadK8s(t)
	m := loadManifests(t, "kubernetes/jwt")
	var kz kustomization
	readDocs(t, repoPath("examples", "kubernetes", "jwt", "kustomization.yaml"))[0].decode(t, &kz, true)

	var d deployment
	m.one(t, "Deployment").decode(t, &d, false)
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("gateway: want one container (envoy), have %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	checkHardened(t, pod.SecurityContext, c)
	if !hasLabels(d.Spec.Template.Metadata.Labels, d.Spec.Selector.MatchLabels) {
		t.Errorf("gateway: selector %v does not select its pods", d.Spec.Selector.MatchLabels)
	}
	if sa := m.one(t, "ServiceAccount").Metadata.Name; pod.ServiceAccountName != sa {
		t.Errorf("gateway: serviceAccountName %q, want %q (its identity to capsnap)", pod.ServiceAccountName, sa)
	}

	// mounted says what volume is mounted at dir: a ConfigMap's or a
	// Secret's name.
	mounted := func(dir string) (configMap, secret string) {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath != dir {
				continue
			}
			if vm.SubPath != "" || !vm.ReadOnly {
				t.Errorf("gateway: %s is mounted with subPath or read-write", dir)
			}
			for _, v := range pod.Volumes {
				switch {
				case v.Name != vm.Name:
				case v.ConfigMap != nil:
					return v.ConfigMap.Name, ""
				case v.Secret != nil:
					return "", v.Secret.SecretName
				}
			}
		}
		t.Fatalf("gateway: nothing is mounted at %s", dir)
		return "", ""
	}

	// The configuration: -c's file, from a ConfigMap of this directory.
	i := slices.Index(c.Args, "-c")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("gateway: args %q name no configuration (-c FILE)", c.Args)
	}
	cfgPath := c.Args[i+1]
	cmName, _ := mounted(path.Dir(cfgPath))
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	o, ok := m["ConfigMap"]["/"+cmName]
	if !ok {
		t.Fatalf("gateway: ConfigMap %q (mounted at %s) is not in examples/kubernetes/jwt", cmName, path.Dir(cfgPath))
	}
	o.decode(t, &cm, false)
	raw, ok := cm.Data[path.Base(cfgPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s", cmName, path.Base(cfgPath))
	}
	gw := decodeJWTEnvoy(t, "the gateway's envoy.yaml", []byte(raw))
	ref := decodeJWTEnvoy(t, "envoy/jwt.yaml", readFile(t, "envoy", "jwt.yaml"))
	mt, err := testbed.DecodeEnvoy(readFile(t, "envoy", "mtls.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	// envoy/jwt.yaml's, which the end-to-end tests run.
	if !proto.Equal(gw.hcm, ref.hcm) {
		t.Error("the gateway's HTTP connection manager (filters, routes, access log) is not envoy/jwt.yaml's; copy it again")
	}
	if !proto.Equal(gw.b.GetAdmin(), ref.b.GetAdmin()) {
		t.Error("the gateway's admin listener is not envoy/jwt.yaml's (loopback)")
	}
	gl, rl := gw.b.GetStaticResources().GetListeners(), ref.b.GetStaticResources().GetListeners()
	if len(gl) != 1 || len(rl) != 1 || !proto.Equal(gl[0].GetFilterChains()[0].GetTransportSocket(), rl[0].GetFilterChains()[0].GetTransportSocket()) {
		t.Fatal("the gateway's listener does not terminate TLS as envoy/jwt.yaml's does")
	}
	sa := gl[0].GetAddress().GetSocketAddress()
	if sa.GetAddress() != "0.0.0.0" || int(sa.GetPortValue()) != c.namedPort(t, "https") {
		t.Errorf("the gateway listens on %s:%d, want 0.0.0.0 on the container port https %d", sa.GetAddress(), sa.GetPortValue(), c.namedPort(t, "https"))
	}
	var svc service
	m.one(t, "Service").decode(t, &svc, false)
	if !hasLabels(d.Spec.Template.Metadata.Labels, svc.Spec.Selector) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.value != "https" {
		t.Errorf("the gateway's Service does not send its port to the pods' https port: %+v", svc.Spec)
	}

	// The hop to capsnap: envoy/mtls.yaml's cluster, to capsnap's Service
	// by the name its certificate carries.
	var mtlsCapsnap *clusterv3.Cluster
	for _, cl := range mt.GetStaticResources().GetClusters() {
		if cl.GetName() == "capsnap" {
			mtlsCapsnap = cl
		}
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, cl := range gw.b.GetStaticResources().GetClusters() {
		clusters[cl.GetName()] = cl
	}
	if gc := clusters["capsnap"]; gc == nil || !proto.Equal(gatewayCluster(gc), gatewayCluster(mtlsCapsnap)) {
		t.Error("the gateway's capsnap cluster is not envoy/mtls.yaml's (mutual TLS, the gateway's SVID, capsnap's name verified)")
	}
	tc := &tlsv3.UpstreamTlsContext{}
	if err := clusters["capsnap"].GetTransportSocket().GetTypedConfig().UnmarshalTo(tc); err != nil {
		t.Fatal(err)
	}
	if want := net.JoinHostPort(tc.GetSni(), strconv.Itoa(k.capsnap.namedPort(t, "grpc"))); gw.endpoints["capsnap"] != want || !strings.HasPrefix(tc.GetSni(), k.svcName+".") {
		t.Errorf("the gateway dials capsnap at %s, want its Service %s.<namespace> by the name its certificate carries, %s", gw.endpoints["capsnap"], k.svcName, want)
	}
	// The servers: the URLs capsnap lists, so agents reach the catalog
	// capsnap watches.
	for _, s := range k.cfg.Servers {
		u, err := url.Parse(s.URL)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for cluster, id := range gw.servers {
			if id == s.ID {
				found = true
				if gw.endpoints[cluster] != u.Host || clusters[cluster].GetType() != clusterv3.Cluster_STRICT_DNS {
					t.Errorf("the gateway routes server_id %s to %s (%v), but capsnap lists it at %s", s.ID, gw.endpoints[cluster], clusters[cluster].GetType(), u.Host)
				}
			}
		}
		if !found {
			t.Errorf("the gateway has no route for server %s", s.ID)
		}
	}
	if len(clusters) != len(k.cfg.Servers)+1 {
		t.Errorf("the gateway has clusters %v, want capsnap and one per server", slices.Sorted(maps.Keys(clusters)))
	}

	// The issuer's keys: a generated ConfigMap (a new key set rolls the
	// pods), mounted where local_jwks reads them.
	jwksFile := gw.provider.GetLocalJwks().GetFilename()
	jwksCM, _ := mounted(path.Dir(jwksFile))
	generated := false
	for _, g := range kz.ConfigMapGenerator {
		if g.Name == jwksCM && slices.Contains(g.Files, path.Base(jwksFile)) {
			generated = true
			checkJWKS(t, "examples/kubernetes/jwt/"+path.Base(jwksFile), readFile(t, "examples", "kubernetes", "jwt", path.Base(jwksFile)))
		}
	}
	if !generated {
		t.Errorf("%s is mounted from ConfigMap %q, which no configMapGenerator of kustomization.yaml makes from %s: a new key would not roll the gateway", jwksFile, jwksCM, path.Base(jwksFile))
	}
	// capsnap check --envoy's verdict on the gateway, held to the
	// capsnap it fronts, its principal taken from the token as the
	// README's step 1 has it: no error. Its warnings are what a cluster
	// maps (a Service's DNS name and port), logged.
	fronted := k.cfg
	fronted.Principal.Source, fronted.Principal.JWT.PayloadKey, fronted.Principal.JWT.Claim = config.SourceJWT, "jwt_payload", "sub"
	findings, err := envoy.Check([]byte(raw), fronted.Envoy())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings {
		if f.Error {
			t.Errorf("capsnap check --envoy refuses the gateway: %s", f)
		} else {
			t.Logf("capsnap check --envoy warns: %s", f)
		}
	}
	// The TLS files, from a Secret.
	for _, f := range regexp.MustCompile(`filename: (/etc/envoy/tls/[^}\s]+)`).FindAllStringSubmatch(raw, -1) {
		if _, secret := mounted(path.Dir(f[1])); secret == "" {
			t.Errorf("%s is not in a Secret", f[1])
		}
	}
}

// examples/istio/jwt gives every workload a CUSTOM policy guards (and no
// other) envoy/jwt.yaml's token verification right before the policy's
// ext_authz filter, and that filter the namespace the payload is in;
// nothing else of Istio's filter is changed.
func TestIstioJWT(t *testing.T) {
	ref := decodeJWTEnvoy(t, "envoy/jwt.yaml", readFile(t, "envoy", "jwt.yaml"))
	guarded := map[string]bool{}
	for _, o := range loadManifests(t, "istio").all("AuthorizationPolicy") {
		var ap authorizationPolicy
		o.decode(t, &ap, true)
		if ap.Spec.Action == "CUSTOM" && ap.Spec.Selector != nil {
			guarded[o.Metadata.Namespace+"/"+fmt.Sprint(ap.Spec.Selector.MatchLabels)] = true
		}
	}
	verified := map[string]bool{}
	for _, o := range loadManifests(t, "istio/jwt").all("EnvoyFilter") {
		var f envoyFilter
		o.decode(t, &f, true)
		if f.Spec.WorkloadSelector == nil || len(f.Spec.WorkloadSelector.Labels) == 0 {
			t.Errorf("EnvoyFilter %s: no workloadSelector; select the workload its CUSTOM policy does", o.Metadata.Name)
			continue
		}
		key := o.Metadata.Namespace + "/" + fmt.Sprint(f.Spec.WorkloadSelector.Labels)
		if verified[key] || !guarded[key] {
			t.Errorf("EnvoyFilter %s: %s is verified twice, or guarded by no CUSTOM policy", o.Metadata.Name, key)
		}
		verified[key] = true
		var authn, merged bool
		for i, p := range f.Spec.ConfigPatches {
			where := fmt.Sprintf("EnvoyFilter %s patch %d", o.Metadata.Name, i)
			l := p.Match.Listener
			if p.ApplyTo != "HTTP_FILTER" || p.Match.Context != "SIDECAR_INBOUND" || l == nil || l.FilterChain == nil || l.FilterChain.Filter == nil ||
				l.FilterChain.Filter.Name != hcmFilter || l.FilterChain.Filter.SubFilter == nil || l.FilterChain.Filter.SubFilter.Name != extAuthzFilter {
				t.Errorf("%s: want an HTTP_FILTER patch at the inbound %s", where, extAuthzFilter)
				continue
			}
			js, err := json.Marshal(p.Patch.Value)
			if err != nil {
				t.Fatal(err)
			}
			var hf hcmv3.HttpFilter
			if err := protojson.Unmarshal(js, &hf); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			switch p.Patch.Operation {
			case "INSERT_BEFORE":
				authn = true
				checkSidecarJWTAuthn(t, where, &hf, ref.provider)
			case "MERGE":
				merged = true
				var z extauthzv3.ExtAuthz
				if err := hf.GetTypedConfig().UnmarshalTo(&z); err != nil || hf.GetName() != extAuthzFilter {
					t.Fatalf("%s: want %s's ExtAuthz (%v)", where, extAuthzFilter, err)
				}
				if !proto.Equal(&z, &extauthzv3.ExtAuthz{MetadataContextNamespaces: []string{jwtAuthnNamespace}}) {
					t.Errorf("%s: merges %v into Istio's ext_authz; want metadata_context_namespaces [%s] and nothing else", where, &z, jwtAuthnNamespace)
				}
			default:
				t.Errorf("%s: operation %s", where, p.Patch.Operation)
			}
		}
		if !authn || !merged {
			t.Errorf("EnvoyFilter %s: want the jwt_authn filter inserted before ext_authz and ext_authz passing %s", o.Metadata.Name, jwtAuthnNamespace)
		}
	}
	for key := range guarded {
		if !verified[key] {
			t.Errorf("%s is guarded by a CUSTOM policy but verifies no token: capsnap would deny it all no_principal", key)
		}
	}
}

// checkSidecarJWTAuthn holds the sidecar's jwt_authn filter to envoy/jwt.yaml's
// provider, but for the keys (inline: istiod pushes them) and a missing
// token (allowed: capsnap's own catalog requests carry none).
func checkSidecarJWTAuthn(t *testing.T, where string, hf *hcmv3.HttpFilter, want *jwtauthnv3.JwtProvider) {
	t.Helper()
	var a jwtauthnv3.JwtAuthentication
	if err := hf.GetTypedConfig().UnmarshalTo(&a); err != nil {
		t.Fatalf("%s: not a jwt_authn filter: %v", where, err)
	}
	if err := a.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	if hf.GetName() == "envoy.filters.http.jwt_authn" {
		t.Errorf("%s: name it apart from the jwt_authn filter Istio builds from a RequestAuthentication", where)
	}
	if len(a.GetProviders()) != 1 {
		t.Fatalf("%s: want one provider", where)
	}
	for name, p := range a.GetProviders() {
		checkJWKS(t, where, []byte(p.GetLocalJwks().GetInlineString()))
		sample := readFile(t, "examples", "kubernetes", "jwt", "jwks.json")
		var x, y any
		if json.Unmarshal(sample, &x) != nil || json.Unmarshal([]byte(p.GetLocalJwks().GetInlineString()), &y) != nil || !reflect.DeepEqual(x, y) {
			t.Errorf("%s: the inline key set is not examples/kubernetes/jwt/jwks.json, the one sample", where)
		}
		p, w := proto.Clone(p).(*jwtauthnv3.JwtProvider), proto.Clone(want).(*jwtauthnv3.JwtProvider)
		p.JwksSourceSpecifier, w.JwksSourceSpecifier = nil, nil
		if !proto.Equal(p, w) {
			t.Errorf("%s: provider %s is not envoy/jwt.yaml's (apart from its keys)\nhave %v\nwant %v", where, name, p, w)
		}
		rules := a.GetRules()
		requires := &jwtauthnv3.JwtRequirement{RequiresType: &jwtauthnv3.JwtRequirement_RequiresAny{RequiresAny: &jwtauthnv3.JwtRequirementOrList{
			Requirements: []*jwtauthnv3.JwtRequirement{
				{RequiresType: &jwtauthnv3.JwtRequirement_ProviderName{ProviderName: name}},
				{RequiresType: &jwtauthnv3.JwtRequirement_AllowMissing{AllowMissing: &emptypb.Empty{}}},
			},
		}}}
		if len(rules) != 1 || rules[0].GetMatch().GetPrefix() != "/" || !proto.Equal(rules[0].GetRequires(), requires) {
			t.Errorf("%s: rules %v: want every request's token, if any, verified by %s (a failed one refused: not allow_missing_or_failed)", where, rules, name)
		}
	}
}
