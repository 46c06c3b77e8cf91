package envoy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Names and type URLs the response path is made of.
const (
	hcmName       = "envoy.filters.network.http_connection_manager"
	extAuthzName  = "envoy.filters.http.ext_authz"
	typePrefix    = "type.googleapis.com/"
	hcmType       = typePrefix + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	extAuthzType  = typePrefix + "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
	extProcType   = typePrefix + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
	withMatcher   = typePrefix + "envoy.extensions.common.matching.v3.ExtensionWithMatcher"
	metadataInput = typePrefix + "envoy.extensions.matching.common_inputs.network.v3.DynamicMetadataInput"
	metadataMatch = typePrefix + "envoy.extensions.matching.input_matchers.metadata.v3.Metadata"
	skipFilter    = typePrefix + "envoy.extensions.filters.common.matcher.action.v3.SkipFilter"
	filterConfig  = typePrefix + "envoy.config.route.v3.FilterConfig"
)

// responsePath checks that the HTTP connection manager m sends capsnap
// the answer to every request its ext_authz filter let capsnap decide.
// What leaves a listing unbound on every request is an error; what
// leaves one unaccounted for, or that it cannot evaluate, a warning.
func responsePath(m httpManager, f filters) []Finding {
	if f.proc < 0 {
		return []Finding{{Error: true, Path: string(f.at), Message: fmt.Sprintf("the ext_authz filter sends Checks to %s, but no ext_proc filter sends it responses: add capsnap's (capsnap.ext_proc in envoy/demo.yaml) after ext_authz", serviceOf(f.authzCfg))}}
	}
	var out []Finding
	add := func(err bool, at path, msg string) {
		out = append(out, Finding{Error: err, Path: string(at), Message: msg})
	}
	where := fmt.Sprintf("ext_proc filter %q", f.procName)
	if f.proc < f.authz {
		add(false, f.at.index(f.proc), where+" comes before the ext_authz filter: put it after, where the listing ticket is set")
	}
	ns := stringsOf(field(f.procCfg, "metadata_options", "forwarding_namespaces", "untyped"))
	if !slices.Contains(ns, extAuthzName) {
		add(true, f.procAt.keys("metadata_options", "forwarding_namespaces", "untyped"), where+" does not forward the listing ticket: set metadata_options.forwarding_namespaces.untyped to ["+extAuthzName+"]")
	}
	if !opensWithTicket(field(f.procCfg, "grpc_service", "initial_metadata")) {
		add(false, f.procAt.keys("grpc_service", "initial_metadata"), where+" does not open its streams with the listing ticket: add to its grpc_service initial_metadata "+
			`{key: x-capsnap-listing, value: "%DYNAMIC_METADATA(`+extAuthzName+`:listing)%"}, or a listing the server resets at once is counted as one whose response path is missing`)
	}
	mode := field(f.procCfg, "processing_mode")
	modeAt := f.procAt.key("processing_mode")
	if h, _ := field(mode, "response_header_mode").(string); h == "SKIP" {
		add(true, modeAt.key("response_header_mode"), where+": processing_mode.response_header_mode SKIP sends capsnap no response: want SEND")
	}
	if b, _ := field(mode, "response_body_mode").(string); b != "FULL_DUPLEX_STREAMED" && b != "BUFFERED" {
		if b == "" {
			b = "NONE (the default)"
		}
		add(true, modeAt.key("response_body_mode"), fmt.Sprintf("%s: processing_mode.response_body_mode %s sends capsnap no list: want FULL_DUPLEX_STREAMED (or BUFFERED)", where, b))
	}
	if f.matcher != nil {
		at := f.matcherAt.key("xds_matcher")
		if field(f.matcher, "xds_matcher") == nil && field(f.matcher, "matcher") != nil {
			at = f.matcherAt.key("matcher")
		}
		switch skipped, onlyListings, err := skipsListing(f.matcher); {
		case err != nil:
			add(false, at, fmt.Sprintf("%s: cannot tell whether its matcher skips a listing (%v): skip only requests whose %s metadata has no decision key, as envoy/demo.yaml does", where, err, extAuthzName))
		case skipped:
			add(true, at, fmt.Sprintf("%s: its matcher skips the filter for a request whose %s metadata has a listing ticket, which is every listing capsnap allows", where, extAuthzName))
		case onlyListings:
			add(false, at, fmt.Sprintf("%s: its matcher skips every answer but a listing's own, so a listing on another stream (the GET stream, another request's) reaches the agent unscreened: skip only requests whose %s metadata has no decision key, as envoy/demo.yaml does", where, extAuthzName))
		}
	}
	return append(out, responsePathRoutes(m, f)...)
}

// responsePathRoutes finds the routes that run ext_authz but not ext_proc.
func responsePathRoutes(m httpManager, f filters) []Finding {
	routes, rds := routesOf(m)
	if rds {
		return []Finding{{Path: string(m.at.key("rds")), Message: "routes come from RDS: check that no route disables the ext_proc filter " + fmt.Sprintf("%q", f.procName) + " in its typed_per_filter_config"}}
	}
	var out []Finding
	for _, r := range routes {
		if c, _ := r.config(f.authzName); disables(c) {
			continue // no Check, so no ticket
		}
		if field(r.r, "route") == nil {
			continue // a redirect or a direct response: no server answers
		}
		name := r.name
		if server, _ := serverID(r, f.authzName); server != nil {
			name += fmt.Sprintf(" (server_id %v)", server)
		}
		switch pc, at := r.config(f.procName); {
		case disables(pc):
			out = append(out, Finding{Error: true, Path: string(at), Message: fmt.Sprintf("%s disables the ext_proc filter %q in its typed_per_filter_config: its listings never come back to capsnap", name, f.procName)})
		case f.procDisabled && pc == nil:
			out = append(out, Finding{Error: true, Path: string(at), Message: fmt.Sprintf("%s: the ext_proc filter %q is disabled in http_filters and this route does not enable it", name, f.procName)})
		}
	}
	return out
}

// route is a route of an HTTP connection manager's inline route_config.
type route struct {
	r  any
	at path
	// name is the route as a finding names it.
	name string
	// per are the typed_per_filter_config of the route, its virtual host
	// and the route configuration, most specific first, and where each
	// sits.
	per   [3]any
	perAt [3]path
}

// config is the most specific per-route configuration of the filter
// named filter, and where it sits; nil, and where the route's own would
// sit, if there is none.
func (r route) config(filter string) (any, path) {
	for i, p := range r.per {
		if c := field(p, filter); c != nil {
			return c, r.perAt[i].key(filter)
		}
	}
	return nil, r.perAt[0].key(filter)
}

// routesOf lists m's routes; rds says they come from RDS instead, and so
// cannot be read here.
func routesOf(m httpManager) (routes []route, rds bool) {
	rc := field(m.hcm, "route_config")
	if rc == nil {
		return nil, field(m.hcm, "rds") != nil
	}
	rcAt := m.at.key("route_config")
	for v, vh := range list(field(rc, "virtual_hosts")) {
		vname, _ := field(vh, "name").(string)
		vhAt := rcAt.key("virtual_hosts").index(v)
		for i, r := range list(field(vh, "routes")) {
			at := vhAt.key("routes").index(i)
			routes = append(routes, route{
				r: r, at: at,
				name:  fmt.Sprintf("route %s of virtual host %q", describeMatch(field(r, "match")), vname),
				per:   [3]any{field(r, "typed_per_filter_config"), field(vh, "typed_per_filter_config"), field(rc, "typed_per_filter_config")},
				perAt: [3]path{at.key("typed_per_filter_config"), vhAt.key("typed_per_filter_config"), rcAt.key("typed_per_filter_config")},
			})
		}
	}
	return routes, false
}

// serverID is the server_id the Checks of route r carry, and where it is
// set: context_extensions merge from the route configuration down to the
// route, the most specific winning. nil, and where the route's own would
// be, if none.
func serverID(r route, authzName string) (any, path) {
	var own path
	for i, per := range r.per {
		cfg, at := perRoute(field(per, authzName), r.perAt[i].key(authzName))
		at = at.keys("check_settings", "context_extensions", "server_id")
		if i == 0 {
			own = at
		}
		if id := field(cfg, "check_settings", "context_extensions", "server_id"); id != nil {
			return id, at
		}
	}
	return nil, own
}

// perRoute is the filter's own per-route configuration in cfg (at at): a
// FilterConfig's config, if it is one.
func perRoute(cfg any, at path) (any, path) {
	if typeOf(cfg) == filterConfig {
		return field(cfg, "config"), at.key("config")
	}
	return cfg, at
}

// disables reports whether a typed_per_filter_config entry turns its
// filter off: a FilterConfig or the filter's own per-route config with
// disabled set.
func disables(cfg any) bool {
	d, _ := field(cfg, "disabled").(bool)
	return d
}

// skipsListing evaluates an ExtensionWithMatcher for a request whose
// ext_authz metadata has the listing key (and so capsnap's decision), as
// Envoy does: the first matcher that matches decides, else on_no_match.
// onlyListings reports a matcher keyed on the listing ticket, which skips
// every other answer capsnap decided. It knows only the inputs and
// matchers of envoy/demo.yaml and errs on any other.
func skipsListing(ewm any) (skipped, onlyListings bool, err error) {
	m := field(ewm, "xds_matcher")
	if m == nil {
		m = field(ewm, "matcher")
	}
	if m == nil {
		return false, false, errors.New("no xds_matcher")
	}
	skip := func(onMatch any) (bool, bool, error) {
		switch typeOf(field(onMatch, "action", "typed_config")) {
		case skipFilter:
			return true, onlyListings, nil
		case "":
			return false, false, errors.New("an on_match without an action")
		default:
			return false, onlyListings, nil
		}
	}
	for i, mm := range list(field(m, "matcher_list", "matchers")) {
		sp := field(mm, "predicate", "single_predicate")
		in := field(sp, "input", "typed_config")
		if typeOf(in) != metadataInput || field(in, "filter") != extAuthzName {
			return false, false, fmt.Errorf("matcher %d reads something other than %s's metadata", i, extAuthzName)
		}
		path := list(field(in, "path"))
		key := ""
		if len(path) == 1 {
			key, _ = field(path[0], "key").(string)
		}
		if key != "listing" && key != "decision" {
			return false, false, fmt.Errorf("matcher %d reads a key other than decision or listing", i)
		}
		onlyListings = onlyListings || key == "listing"
		cm := field(sp, "custom_match", "typed_config")
		if typeOf(cm) != metadataMatch {
			return false, false, fmt.Errorf("matcher %d matches otherwise than by the Metadata input matcher", i)
		}
		if present, _ := field(cm, "value", "present_match").(bool); !present {
			return false, false, fmt.Errorf("matcher %d matches the ticket's value, not its presence", i)
		}
		invert, _ := field(cm, "invert").(bool)
		if invert { // matches a request without the key
			continue
		}
		return skip(field(mm, "on_match"))
	}
	if om := field(m, "on_no_match"); om != nil {
		return skip(om)
	}
	return false, onlyListings, nil
}

// sameService reports whether an ext_proc filter's configuration calls the
// service the ext_authz filter's does, or either names none Envoy-side.
func sameService(authz, proc any) bool {
	a, p := serviceOf(authz), serviceOf(proc)
	return a == "" || p == "" || a == p
}

// serviceOf names a filter's gRPC service: its Envoy cluster or Google
// gRPC target.
func serviceOf(cfg any) string {
	if c, ok := field(cfg, "grpc_service", "envoy_grpc", "cluster_name").(string); ok {
		return "cluster " + c
	}
	if u, ok := field(cfg, "grpc_service", "google_grpc", "target_uri").(string); ok {
		return "target " + u
	}
	return ""
}

func describeMatch(m any) string {
	for _, k := range []string{"prefix", "path", "path_separated_prefix"} {
		if v, ok := field(m, k).(string); ok {
			return fmt.Sprintf("%s %q", k, v)
		}
	}
	return "(a match on something else)"
}

func typeOf(cfg any) string {
	t, _ := field(cfg, "@type").(string)
	return t
}

// field walks maps by key, nil at the first step that is not there.
func field(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

func list(v any) []any {
	l, _ := v.([]any)
	return l
}

func stringsOf(v any) []string {
	var out []string
	for _, e := range list(v) {
		if s, ok := e.(string); ok {
			out = append(out, strings.TrimSpace(s))
		}
	}
	return out
}

// opensWithTicket reports whether an ext_proc filter's grpc_service
// initial_metadata carries the listing ticket (extproc.ListingMetadata).
func opensWithTicket(md any) bool {
	list, _ := md.([]any)
	for _, kv := range list {
		k, _ := field(kv, "key").(string)
		v, _ := field(kv, "value").(string)
		if strings.EqualFold(k, "x-capsnap-listing") && v == "%DYNAMIC_METADATA("+extAuthzName+":listing)%" {
			return true
		}
	}
	return false
}
