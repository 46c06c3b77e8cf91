package deploy

import (
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	typematcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/config"
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
	e := &jwtEnvoy{b: b, servers: map[string]string{}, endpoints: map[string]string{}}
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
