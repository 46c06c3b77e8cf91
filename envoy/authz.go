package envoy

import (
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/capsnap/capsnap/internal/spelling"
)

// Names and type URLs of what the Check path is made of.
const (
	jwtAuthnName  = "envoy.filters.http.jwt_authn"
	jwtAuthnType  = typePrefix + "envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"
	downstreamTLS = typePrefix + "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
	upstreamTLS   = typePrefix + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
)

// checker collects the findings of Check.
type checker struct {
	doc      map[string]any
	want     Expect
	findings []Finding
	// reached are the gRPC services already held to grpc_addr.
	reached map[string]bool
}

func (c *checker) add(err bool, at path, format string, args ...any) {
	c.findings = append(c.findings, Finding{Error: err, Path: string(at), Message: fmt.Sprintf(format, args...)})
}

// extAuthz checks the ext_authz filter's own settings: capsnap decides
// every request, over gRPC, at grpc_addr, failing closed, on its whole
// body.
func (c *checker) extAuthz(f filters) {
	cfg, at := f.authzCfg, f.authzAt
	if b, _ := field(cfg, "failure_mode_allow").(bool); b {
		c.add(true, at.key("failure_mode_allow"), "true, want false: with capsnap unreachable, Envoy lets every request through unchecked")
	}
	if hs := field(cfg, "http_service"); hs != nil {
		c.add(true, at.key("http_service"), "set, want grpc_service: capsnap answers ext_authz over gRPC only, and every request fails")
	}
	if wrb := field(cfg, "with_request_body"); wrb == nil {
		c.add(true, at.key("with_request_body"), "absent, want {max_request_bytes: %d, allow_partial_message: false, pack_as_bytes: true}: capsnap gets no body, and denies every request malformed_request", c.want.MaxBodyBytes)
	} else {
		c.body(at.key("with_request_body"), wrb)
	}
	c.reach(at, cfg)
	if c.want.ResponsePath && f.proc >= 0 {
		c.reach(f.procAt, f.procCfg)
	}
}

// body checks a with_request_body (at at): capsnap gets the whole body,
// as bytes, up to exactly its own limit.
func (c *checker) body(at path, wrb any) {
	if want := c.want.MaxBodyBytes; want > 0 {
		v := field(wrb, "max_request_bytes")
		if n, ok := number(v); !ok || n != want {
			c.add(true, at.key("max_request_bytes"), "%s, want %d (capsnap's limits.max_body_bytes): keep them equal, or a body between the two is refused by one and let through by the other", show(v), want)
		}
	}
	if b, _ := field(wrb, "allow_partial_message").(bool); b {
		c.add(true, at.key("allow_partial_message"), "true, want false: a body over max_request_bytes reaches capsnap cut short, and is denied malformed_request where Envoy would refuse it (413)")
	}
	if v := field(wrb, "pack_as_bytes"); v != true {
		c.add(false, at.key("pack_as_bytes"), "%s, want true: capsnap gets the body as a UTF-8 string, so a body that is not UTF-8 reaches it altered, not as the bytes the server parses", show(v))
	}
}

// reach checks that the gRPC service of a filter's configuration cfg (at
// at) reaches capsnap's grpc_addr, once a service.
func (c *checker) reach(at path, cfg any) {
	lhost, lport, ok := hostPort(c.want.GRPCAddr)
	if !ok {
		return
	}
	svc := at.key("grpc_service")
	if name, ok := field(cfg, "grpc_service", "envoy_grpc", "cluster_name").(string); ok {
		if !c.reached["cluster "+name] {
			c.reached["cluster "+name] = true
			c.reachCluster(svc.keys("envoy_grpc", "cluster_name"), name, lhost, lport)
		}
		return
	}
	target, ok := field(cfg, "grpc_service", "google_grpc", "target_uri").(string)
	if !ok || c.reached["target "+target] {
		return
	}
	c.reached["target "+target] = true
	at = svc.keys("google_grpc", "target_uri")
	// A target is host:port, after a scheme such as dns:/// if it has one.
	host, port, ok := hostPort(target[strings.LastIndex(target, "/")+1:])
	if !ok {
		c.add(false, at, "%q, want capsnap's grpc_addr %s: cannot tell whether it is", target, c.want.GRPCAddr)
		return
	}
	c.judge([]endpoint{{host, port, at, at}}, "target "+target, lhost, lport)
}

// endpoint is an address Envoy dials, and where its host and port are set.
type endpoint struct {
	host           string
	port           int
	hostAt, portAt path
}

// reachCluster checks the static cluster name, which the filter names at
// at, against grpc_addr lhost:lport.
func (c *checker) reachCluster(at path, name, lhost string, lport int) {
	for i, cl := range list(field(c.doc, "static_resources", "clusters")) {
		if field(cl, "name") != name {
			continue
		}
		clAt := path("static_resources").key("clusters").index(i)
		c.clusterTLS(clAt, cl, name)
		laAt := clAt.key("load_assignment")
		var eps []endpoint
		for e, le := range list(field(cl, "load_assignment", "endpoints")) {
			for l, lb := range list(field(le, "lb_endpoints")) {
				sa := field(lb, "endpoint", "address", "socket_address")
				saAt := laAt.key("endpoints").index(e).key("lb_endpoints").index(l).keys("endpoint", "address", "socket_address")
				host, _ := field(sa, "address").(string)
				if port, ok := number(field(sa, "port_value")); ok && host != "" {
					eps = append(eps, endpoint{host, port, saAt.key("address"), saAt.key("port_value")})
				}
			}
		}
		if len(eps) == 0 {
			c.add(false, laAt, "no endpoint with a socket address, want capsnap's grpc_addr %s: cannot tell whether cluster %q reaches it (endpoints from EDS are not read)", c.want.GRPCAddr, name)
			return
		}
		c.judge(eps, fmt.Sprintf("cluster %q", name), lhost, lport)
		return
	}
	if field(c.doc, "dynamic_resources", "cds_config") != nil {
		c.add(false, at, "%q is not in static_resources.clusters: cannot tell whether it reaches capsnap's grpc_addr %s (clusters from CDS are not read)", name, c.want.GRPCAddr)
		return
	}
	c.add(true, at, "%q, want a cluster of static_resources.clusters that reaches capsnap's grpc_addr %s: there is none of that name, and no CDS", name, c.want.GRPCAddr)
}

// clusterTLS checks that cluster cl (at at), named name, speaks to
// capsnap as grpc_addr listens: TLS with a client certificate under
// grpc_tls, plaintext otherwise.
func (c *checker) clusterTLS(at path, cl any, name string) {
	at = at.key("transport_socket")
	tls := field(cl, "transport_socket", "typed_config")
	switch t := typeOf(tls); {
	case c.want.GRPCTLS && t != upstreamTLS:
		c.add(true, at, "%s, want an UpstreamTlsContext with a client certificate capsnap's grpc_tls admits: grpc_addr takes only TLS, so every request through cluster %q fails", typeOr(t), name)
	case c.want.GRPCTLS && !slices.ContainsFunc([]string{"tls_certificates", "tls_certificate_sds_secret_configs", "tls_certificate_provider_instance",
		"tls_certificate_certificate_provider", "tls_certificate_certificate_provider_instance"}, func(k string) bool { return field(tls, "common_tls_context", k) != nil }):
		c.add(true, at.keys("typed_config", "common_tls_context", "tls_certificates"), "absent, want Envoy's client certificate, for one of capsnap's grpc_tls.allowed_clients: capsnap refuses a client without one in the handshake, so every request through cluster %q fails", name)
	case !c.want.GRPCTLS && t == upstreamTLS:
		c.add(false, at, "an UpstreamTlsContext, want none: capsnap's grpc_addr is plaintext (no grpc_tls), so unless something in between ends the TLS, every request through cluster %q fails", name)
	}
}

// typeOr is a typed_config's type as a finding quotes it: "absent" if none.
func typeOr(t string) string {
	if t == "" {
		return "absent"
	}
	return t
}

// judge reports the endpoints of service when none of them reaches
// lhost:lport: as errors if none can, as warnings if something Envoy's
// configuration does not show (a Service, NAT) could make one.
func (c *checker) judge(eps []endpoint, service, lhost string, lport int) {
	certain := true
	for _, e := range eps {
		ok, sure := reaches(e.host, e.port, lhost, lport)
		if ok {
			return
		}
		certain = certain && sure
	}
	listen := net.JoinHostPort(lhost, strconv.Itoa(lport))
	for _, e := range eps {
		switch {
		case e.port == lport:
			c.add(certain, e.hostAt, "%q, want a loopback address: capsnap listens on grpc_addr %s, loopback only, so %s never reaches it and every request fails", e.host, listen, service)
		case certain:
			c.add(true, e.portAt, "%d, want %d: capsnap listens on grpc_addr %s, so %s never reaches it and every request fails", e.port, lport, listen, service)
		default:
			c.add(false, e.portAt, "%d, want %d (capsnap's grpc_addr %s), unless a Service or NAT in between maps the one to the other: otherwise %s never reaches capsnap and every request fails", e.port, lport, listen, service)
		}
	}
}

// reaches says whether Envoy dialing host:port reaches a listener on
// lhost:lport; and if not, whether that is sure: nothing between Envoy
// and a loopback listener, or the listener's own address, maps a port,
// and a loopback listener answers no other address.
func reaches(host string, port int, lhost string, lport int) (ok, sure bool) {
	ip, lip := net.ParseIP(host), net.ParseIP(lhost)
	loop := host == "localhost" || ip != nil && ip.IsLoopback()
	lloop := lhost == "localhost" || lip != nil && lip.IsLoopback()
	switch {
	case lloop && ip != nil && !loop:
		return false, true
	case lloop && loop, ip != nil && lip != nil && ip.Equal(lip):
		return port == lport, true
	}
	// Any other address may be a name, a Service or a mapped port that
	// reaches capsnap: only the port can be told.
	return port == lport, false
}

// principal checks that Envoy gives capsnap the principal where its
// principal.source reads it.
func (c *checker) principal(m httpManager, f filters) {
	switch c.want.Principal {
	case PrincipalFromPeer:
		c.peerCertificate(m)
	case PrincipalFromJWT:
		c.jwt(f)
	}
}

// peerCertificate checks that the filter chain of m verifies a client
// certificate, whose identity Envoy then reports as the peer principal
// (attributes.source.principal, what capsnap reads).
func (c *checker) peerCertificate(m httpManager) {
	at := m.chainAt.key("transport_socket")
	tls := field(m.chain, "transport_socket", "typed_config")
	if t := typeOf(tls); t != downstreamTLS {
		c.add(true, at, "%s, want a DownstreamTlsContext that requires a client certificate: without one Envoy reports no peer principal, and capsnap (principal.source mtls) denies every request no_principal", typeOr(t))
		return
	}
	at = at.key("typed_config")
	ctx := field(tls, "common_tls_context")
	if !slices.ContainsFunc([]string{"validation_context", "validation_context_sds_secret_config", "combined_validation_context",
		"validation_context_certificate_provider", "validation_context_certificate_provider_instance"}, func(k string) bool { return field(ctx, k) != nil }) {
		c.add(true, at.keys("common_tls_context", "validation_context"), "absent, want the CA (or SPIFFE validator) that verifies client certificates: without one Envoy asks no client for a certificate, and capsnap denies every request no_principal")
	}
	if v := field(tls, "require_client_certificate"); v != true {
		c.add(false, at.key("require_client_certificate"), "%s, want true: a client without a certificate gets through to capsnap, which denies it no_principal, where the handshake would refuse it", show(v))
	}
}

// jwt checks that a jwt_authn filter before ext_authz writes the verified
// payload where capsnap reads it, and that ext_authz passes it on.
func (c *checker) jwt(f filters) {
	ns := c.want.JWTNamespace
	if v := field(f.authzCfg, "metadata_context_namespaces"); !slices.Contains(stringsOf(v), ns) {
		c.add(true, f.authzAt.key("metadata_context_namespaces"), "%s, want %s in it (capsnap's principal.jwt.metadata_namespace): capsnap gets no verified token, and denies every request no_principal", show(v), ns)
	}
	j := slices.IndexFunc(f.all, func(hf any) bool { return typeOf(field(hf, "typed_config")) == jwtAuthnType })
	switch {
	case ns != jwtAuthnName && j >= 0:
		c.add(true, f.at.index(j), "jwt_authn writes the verified payload under %s, whatever its name, want %s (capsnap's principal.jwt.metadata_namespace): capsnap denies every request no_principal", jwtAuthnName, ns)
		return
	case ns != jwtAuthnName:
		c.add(false, f.at, "no jwt_authn filter, and capsnap's principal.jwt.metadata_namespace is %s: cannot tell which filter writes it", ns)
		return
	case j < 0:
		c.add(true, f.at, "no jwt_authn filter, want one before ext_authz that writes the verified payload under %s: capsnap denies every request no_principal", jwtAuthnName)
		return
	case j > f.authz:
		c.add(true, f.at.index(j), "jwt_authn after ext_authz (http_filters[%d]), want it before: capsnap is asked before the token is verified, and denies every request no_principal", f.authz)
	}
	c.payloadKey(f.at.index(j).keys("typed_config", "providers"), field(f.all[j], "typed_config", "providers"))
}

// payloadKey checks that the jwt_authn providers (at at) write the
// verified payload under capsnap's principal.jwt.payload_key: an error
// if none does, a warning for each that does not if one does.
func (c *checker) payloadKey(at path, providers any) {
	key := c.want.JWTPayloadKey
	ps, _ := providers.(map[string]any)
	if len(ps) == 0 {
		c.add(true, at, "absent, want a provider with payload_in_metadata: %s (capsnap's principal.jwt.payload_key): capsnap denies every request no_principal", key)
		return
	}
	names := slices.Sorted(maps.Keys(ps))
	some := slices.ContainsFunc(names, func(n string) bool { return field(ps[n], "payload_in_metadata") == key })
	for _, n := range names {
		v := field(ps[n], "payload_in_metadata")
		switch {
		case v == key:
		case some:
			c.add(false, at.key(n).key("payload_in_metadata"), "%s, want %s (capsnap's principal.jwt.payload_key): a token this provider verifies reaches capsnap without its payload, and is denied no_principal", show(v), key)
		default:
			c.add(true, at.key(n).key("payload_in_metadata"), "%s, want %s (capsnap's principal.jwt.payload_key): capsnap finds no verified payload, and denies every request no_principal", show(v), key)
		}
	}
}

// routes checks the routes of m: each that sends capsnap Checks names one
// of its servers and sends it the whole body, and none to an MCP server
// skips it.
func (c *checker) routes(m httpManager, f filters) {
	routes, rds := routesOf(m)
	if rds {
		c.add(false, m.at.key("rds"), "routes come from RDS: check that each names one of capsnap's servers (%s) in context_extensions.server_id, and that none to an MCP server disables the ext_authz filter %q", strings.Join(c.want.Servers, ", "), f.authzName)
		return
	}
	// servers are the MCP servers by the cluster a checked route sends
	// their requests to.
	servers := map[string]string{}
	for _, r := range routes {
		cfg, _ := r.config(f.authzName)
		id, _ := serverID(r, f.authzName)
		if s, ok := id.(string); ok && clusterOf(r) != "" && !disables(cfg) {
			servers[clusterOf(r)] = s
		}
	}
	for _, r := range routes {
		if field(r.r, "route") == nil {
			continue // a redirect or a direct response: no server answers
		}
		cfg, at := r.config(f.authzName)
		if disables(cfg) {
			cluster := clusterOf(r)
			server, mcp := servers[cluster]
			if !mcp && slices.Contains(c.want.Servers, cluster) {
				server, mcp = cluster, true
			}
			if mcp {
				c.add(true, at.key("disabled"), "true on %s, to cluster %q, which serves server %s: its requests reach the MCP server unchecked; want the ext_authz filter on every route to an MCP server", r.name, cluster, server)
			}
			continue
		}
		c.serverID(r, f)
		settings, sAt := perRoute(cfg, at)
		cs, csAt := field(settings, "check_settings"), sAt.key("check_settings")
		if b, _ := field(cs, "disable_request_body_buffering").(bool); b {
			c.add(true, csAt.key("disable_request_body_buffering"), "true on %s, want false: capsnap gets no body, and denies every request on it malformed_request", r.name)
		}
		if wrb := field(cs, "with_request_body"); wrb != nil {
			c.body(csAt.key("with_request_body"), wrb)
		}
	}
}

// serverID checks that route r names a server capsnap guards.
func (c *checker) serverID(r route, f filters) {
	id, at := serverID(r, f.authzName)
	s, ok := id.(string)
	if ok && slices.Contains(c.want.Servers, s) {
		return
	}
	found := show(id)
	if ok {
		if meant := spelling.Closest(s, c.want.Servers); meant != "" {
			found += " (did you mean " + meant + "?)"
		}
	}
	c.add(true, at, "%s, want one of capsnap's servers (%s): every request on %s is denied unknown_server", found, strings.Join(c.want.Servers, ", "), r.name)
}

// clusterOf is the cluster route r sends its requests to, if it names one.
func clusterOf(r route) string {
	c, _ := field(r.r, "route", "cluster").(string)
	return c
}

// hostPort splits an address as grpc_addr and socket addresses write it.
func hostPort(addr string) (string, int, bool) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, false
	}
	n, err := strconv.Atoi(port)
	return host, n, err == nil
}

// number is a whole number of the bootstrap, however YAML or JSON wrote it
// (protobuf's JSON takes a 64-bit integer as a string too).
func number(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case uint64:
		return int(n), n <= math.MaxInt
	case float64:
		return int(n), n == math.Trunc(n) && math.Abs(n) < 1<<53
	case string:
		i, err := strconv.Atoi(n)
		return i, err == nil
	}
	return 0, false
}

// show is a value of the bootstrap as a finding quotes it.
func show(v any) string {
	switch v := v.(type) {
	case nil:
		return "absent"
	case string:
		return fmt.Sprintf("%q", v)
	case []any:
		s := make([]string, len(v))
		for i, e := range v {
			s[i] = show(e)
		}
		return "[" + strings.Join(s, ", ") + "]"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprint(v)
}
