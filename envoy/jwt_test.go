package envoy_test

import (
	"bytes"
	"net/url"
	"slices"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"

	"github.com/capsnap/capsnap/envoy"
	"github.com/capsnap/capsnap/testbed"
)

// jwtAuthnNamespace is the dynamic metadata namespace jwt_authn writes the
// verified payload into, whatever the filter is named.
const jwtAuthnNamespace = "envoy.filters.http.jwt_authn"

// jwtFilters returns the one jwt_authn and the one ext_authz filter of
// cfg's HTTP connection managers, each validated, and its clusters by name.
func jwtFilters(t *testing.T, cfg []byte) (*jwtauthnv3.JwtAuthentication, *extauthzv3.ExtAuthz, map[string]*clusterv3.Cluster) {
	t.Helper()
	b, err := testbed.DecodeEnvoy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	managers, err := testbed.HTTPManagers(b)
	if err != nil {
		t.Fatal(err)
	}
	var authn []*jwtauthnv3.JwtAuthentication
	var authz []*extauthzv3.ExtAuthz
	for _, m := range managers {
		for _, hf := range m.GetHttpFilters() {
			a, z := &jwtauthnv3.JwtAuthentication{}, &extauthzv3.ExtAuthz{}
			switch {
			case hf.GetTypedConfig().UnmarshalTo(a) == nil:
				if err := a.ValidateAll(); err != nil {
					t.Fatal(err)
				}
				authn = append(authn, a)
			case hf.GetTypedConfig().UnmarshalTo(z) == nil:
				if err := z.ValidateAll(); err != nil {
					t.Fatal(err)
				}
				authz = append(authz, z)
			}
		}
	}
	if len(authn) != 1 || len(authz) != 1 {
		t.Fatalf("%d jwt_authn and %d ext_authz filters, want one of each", len(authn), len(authz))
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	return authn[0], authz[0], clusters
}

// jwt.yaml runs as shipped, and with the remote_jwks it documents: the
// token is verified (issuer, audience, subject, a bounded lifetime, the
// issuer's keys from a file or from the issuer), on every route, before
// ext_authz, which passes the verified payload to capsnap; the token
// itself goes no further.
func TestJWTProvider(t *testing.T) {
	remote, err := testbed.RemoteJWKS(envoy.JWT)
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string][]byte{"as shipped": envoy.JWT, "remote_jwks": remote} {
		t.Run(name, func(t *testing.T) {
			if bytes.Contains(cfg, []byte("${")) {
				t.Error("the config has a ${...} placeholder: it must run as shipped, with its files mounted")
			}
			authn, authz, clusters := jwtFilters(t, cfg)
			if len(authn.GetProviders()) != 1 {
				t.Fatalf("%d providers, want one", len(authn.GetProviders()))
			}
			for pname, p := range authn.GetProviders() {
				if p.GetIssuer() == "" || len(p.GetAudiences()) == 0 || p.GetSubjects() == nil {
					t.Errorf("provider %s: want an issuer, audiences and subjects", pname)
				}
				if d := p.GetMaxLifetime().AsDuration(); d <= 0 || d > time.Hour {
					t.Errorf("provider %s: max_lifetime %s, want at most an hour", pname, d)
				}
				if p.GetForward() || p.GetForwardPayloadHeader() != "" || len(p.GetClaimToHeaders()) != 0 {
					t.Errorf("provider %s forwards the token or its claims upstream", pname)
				}
				if p.GetPayloadInMetadata() == "" {
					t.Errorf("provider %s: no payload_in_metadata, so capsnap gets no claim", pname)
				}
				switch name {
				case "as shipped":
					if f := p.GetLocalJwks().GetFilename(); f != "/etc/envoy/jwks/jwks.json" {
						t.Errorf("provider %s: local_jwks filename %q, want /etc/envoy/jwks/jwks.json", pname, f)
					}
				case "remote_jwks":
					checkRemoteJWKS(t, p.GetRemoteJwks(), clusters)
				}
				rules := authn.GetRules()
				if len(rules) != 1 || rules[0].GetMatch().GetPrefix() != "/" || rules[0].GetRequires().GetProviderName() != pname {
					t.Errorf("rules %v: want every request to require provider %s", rules, pname)
				}
			}
			if !slices.Contains(authz.GetMetadataContextNamespaces(), jwtAuthnNamespace) {
				t.Errorf("ext_authz metadata_context_namespaces %v lacks %s: capsnap would see no claim", authz.GetMetadataContextNamespaces(), jwtAuthnNamespace)
			}
		})
	}
}

// checkRemoteJWKS holds the documented remote_jwks to fetching over
// verified TLS from the issuer's host, in the background.
func checkRemoteJWKS(t *testing.T, r *jwtauthnv3.RemoteJwks, clusters map[string]*clusterv3.Cluster) {
	t.Helper()
	if r == nil {
		t.Fatal("no remote_jwks")
	}
	if r.GetAsyncFetch() == nil || r.GetCacheDuration() == nil {
		t.Error("remote_jwks: want async_fetch and a cache_duration")
	}
	u, err := url.Parse(r.GetHttpUri().GetUri())
	if err != nil || u.Scheme != "https" {
		t.Errorf("remote_jwks uri %q: want https", r.GetHttpUri().GetUri())
	}
	c, ok := clusters[r.GetHttpUri().GetCluster()]
	if !ok {
		t.Fatalf("remote_jwks names cluster %q, which the config does not define", r.GetHttpUri().GetCluster())
	}
	tc := &tlsv3.UpstreamTlsContext{}
	if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(tc); err != nil {
		t.Fatalf("cluster %s: no TLS: %v", c.GetName(), err)
	}
	vc := tc.GetCommonTlsContext().GetValidationContext()
	if tc.GetSni() != u.Hostname() || vc.GetTrustedCa() == nil || len(vc.GetMatchTypedSubjectAltNames()) == 0 {
		t.Errorf("cluster %s: want TLS to %s (sni), its certificate verified and matched", c.GetName(), u.Hostname())
	}
	addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	if addr.GetAddress() != u.Hostname() {
		t.Errorf("cluster %s dials %s, not the issuer's host %s", c.GetName(), addr.GetAddress(), u.Hostname())
	}
}

// Every configuration here decodes strictly as Envoy's Bootstrap without
// an Envoy, so that a misspelt field or type URL fails plain go test.
func TestConfigsDecode(t *testing.T) {
	for name, cfg := range map[string][]byte{"demo.yaml": envoy.Demo, "mtls.yaml": envoy.MTLS, "jwt.yaml": envoy.JWT} {
		if _, err := testbed.DecodeEnvoy(cfg); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
