package envoy

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Expect is what capsnap's configuration asks of the Envoy in front of it
// (config.Config.Envoy fills it).
type Expect struct {
	// Servers are the server ids capsnap guards (servers[].id): the ones
	// a route may name in context_extensions.server_id.
	Servers []string
	// GRPCAddr is where capsnap serves ext_authz and ext_proc
	// (grpc_addr); empty skips the check of the clusters that call it.
	GRPCAddr string
	// GRPCTLS says grpc_addr takes only TLS clients with a certificate
	// (grpc_tls).
	GRPCTLS bool
	// MaxBodyBytes is the largest body capsnap reads
	// (limits.max_body_bytes), which ext_authz's max_request_bytes must
	// equal; zero skips that check.
	MaxBodyBytes int
	// Principal is where capsnap reads the caller's identity
	// (principal.source).
	Principal PrincipalFrom
	// JWTNamespace and JWTPayloadKey, with Principal "jwt", are where
	// capsnap reads the verified payload (principal.jwt.metadata_namespace
	// and payload_key).
	JWTNamespace, JWTPayloadKey string
	// ResponsePath says capsnap binds the lists agents are delivered
	// (discovery.bind delivered), so every answer must come back to it
	// through ext_proc.
	ResponsePath bool
}

// PrincipalFrom is where Envoy hands capsnap the caller's identity.
type PrincipalFrom int

const (
	// PrincipalElsewhere checks nothing of it (a development header).
	PrincipalElsewhere PrincipalFrom = iota
	// PrincipalFromPeer is the listener's verified client certificate.
	PrincipalFromPeer
	// PrincipalFromJWT is a payload jwt_authn wrote into metadata.
	PrincipalFromJWT
)

// A Finding is one place where a bootstrap and capsnap's configuration
// disagree.
type Finding struct {
	// Error says the setup cannot work as it is: every request, or every
	// request on a route, fails, is denied or goes unchecked. A warning
	// is what may be made right where this check cannot see (xDS, a
	// Service that maps a port, a matcher it cannot evaluate) or what
	// weakens without breaking.
	Error bool
	// Path is the field of the bootstrap, from its root:
	// static_resources.listeners[0].filter_chains[0]..., a key that has
	// dots in it in brackets and quotes, as in
	// typed_per_filter_config["envoy.filters.http.ext_authz"].
	Path string
	// Message says what is there, what capsnap expects and what follows.
	Message string
}

func (f Finding) String() string { return f.Path + ": " + f.Message }

// Check holds an Envoy bootstrap (YAML or JSON) to capsnap's
// configuration, and says where they disagree: each HTTP connection
// manager of its static listeners that runs the ext_authz filter, its
// routes, the listener's TLS where the principal is the client
// certificate's, and the clusters that carry capsnap's gRPC; and with
// ResponsePath, the response path: an ext_proc filter after ext_authz,
// reaching the same service, forwarding the listing ticket and opening its
// streams with it, sending the response's headers and whole body, skipped
// for no listing and disabled on no route. Listeners, routes
// and clusters from xDS are not read: it says so where it meets them.
func Check(bootstrap []byte, want Expect) ([]Finding, error) {
	doc, err := parse(bootstrap)
	if err != nil {
		return nil, err
	}
	c := &checker{doc: doc, want: want, reached: map[string]bool{}}
	guarded := eachGuarded(doc, func(m httpManager, f filters) {
		c.extAuthz(f)
		c.principal(m, f)
		c.routes(m, f)
		if want.ResponsePath {
			c.findings = append(c.findings, responsePath(m, f)...)
		}
	})
	if !guarded {
		c.findings = append(c.findings, noAuthz)
	}
	return c.findings, nil
}

// noAuthz is the finding of a bootstrap none of whose static HTTP
// connection managers calls capsnap.
var noAuthz = Finding{Path: "static_resources.listeners", Message: "no HTTP connection manager in static_resources runs the ext_authz filter: nothing to check (listeners from xDS, or Istio's EnvoyFilters, are not read)"}

func parse(bootstrap []byte) (map[string]any, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	return doc, nil
}

// httpManager is an HTTP connection manager of a static listener, and
// where it sits.
type httpManager struct {
	// listener is the listener's name; chain the filter chain the manager
	// is a filter of.
	listener string
	chain    any
	chainAt  path
	// hcm is the manager's typed_config.
	hcm any
	at  path
}

// filters is what of capsnap an HTTP connection manager runs: its first
// ext_authz filter, and the ext_proc filter that answers it.
type filters struct {
	// all are the manager's http_filters.
	all []any
	at  path
	// authz and proc index all, -1 for none.
	authz, proc         int
	authzName, procName string
	// authzCfg is the ext_authz filter's typed_config; procCfg the
	// ext_proc filter's own, inside its matcher if it has one.
	authzCfg, procCfg any
	authzAt, procAt   path
	// matcher is the ext_proc filter's ExtensionWithMatcher, if it has one.
	matcher      any
	matcherAt    path
	procDisabled bool
}

// eachGuarded calls fn for each HTTP connection manager of doc's static
// listeners that runs the ext_authz filter, and reports whether there was
// one.
func eachGuarded(doc map[string]any, fn func(httpManager, filters)) bool {
	guarded := false
	listeners := path("static_resources").key("listeners")
	for i, l := range list(field(doc, "static_resources", "listeners")) {
		name, _ := field(l, "name").(string)
		for j, fc := range list(field(l, "filter_chains")) {
			chainAt := listeners.index(i).key("filter_chains").index(j)
			for k, f := range list(field(fc, "filters")) {
				fname, _ := field(f, "name").(string)
				tc := field(f, "typed_config")
				if fname != hcmName && typeOf(tc) != hcmType {
					continue
				}
				m := httpManager{listener: name, chain: fc, chainAt: chainAt, hcm: tc, at: chainAt.key("filters").index(k).key("typed_config")}
				fs := filtersOf(m)
				if fs.authz < 0 {
					continue
				}
				guarded = true
				fn(m, fs)
			}
		}
	}
	return guarded
}

// filtersOf finds capsnap's filters among m's http_filters: the first
// ext_authz filter, and the ext_proc filter after it that calls the same
// service (or, failing one after, before it).
func filtersOf(m httpManager) filters {
	f := filters{all: list(field(m.hcm, "http_filters")), at: m.at.key("http_filters"), authz: -1, proc: -1}
	for i, hf := range f.all {
		name, _ := field(hf, "name").(string)
		tc := field(hf, "typed_config")
		at := f.at.index(i).key("typed_config")
		switch typeOf(tc) {
		case extAuthzType:
			if f.authz < 0 {
				f.authz, f.authzName, f.authzCfg, f.authzAt = i, name, tc, at
			}
		case extProcType, withMatcher:
			cfg, cfgAt, matcher := tc, at, any(nil)
			if typeOf(tc) == withMatcher {
				cfg, cfgAt = field(tc, "extension_config", "typed_config"), at.key("extension_config").key("typed_config")
				if typeOf(cfg) != extProcType {
					continue
				}
				matcher = tc
			}
			if f.authz >= 0 && !sameService(f.authzCfg, cfg) {
				continue
			}
			if f.proc < 0 || (f.proc < f.authz && i > f.authz) {
				f.proc, f.procName, f.procCfg, f.procAt, f.matcher, f.matcherAt = i, name, cfg, cfgAt, matcher, at
				f.procDisabled, _ = field(hf, "disabled").(bool)
			}
		}
	}
	return f
}

// path is where a value sits in a bootstrap, as a Finding names it.
type path string

// key is p's field k.
func (p path) key(k string) path {
	switch {
	case k == "" || strings.ContainsAny(k, `.[]"' `):
		return path(fmt.Sprintf("%s[%q]", p, k))
	case p == "":
		return path(k)
	}
	return p + "." + path(k)
}

// keys is p's field ks[0], its field ks[1], and so on.
func (p path) keys(ks ...string) path {
	for _, k := range ks {
		p = p.key(k)
	}
	return p
}

// index is p's i'th element.
func (p path) index(i int) path { return path(fmt.Sprintf("%s[%d]", p, i)) }
