package envoy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
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
)

// CheckResponsePath reads an Envoy bootstrap (YAML or JSON, its
// static_resources) and says, one warning each, where a tools/list capsnap
// allows on the response path would not come back to capsnap: an HTTP
// connection manager whose ext_authz filter has no ext_proc filter after
// it that reaches the same service, forwards the ext_authz metadata (the
// listing ticket), sends the response's headers and whole body and is not
// skipped for a listing; or a route that disables it. capsnap then never
// sees the response: the agent is delivered the server's list unfiltered
// and every call it makes is denied no_snapshot. It knows the shapes
// envoy/demo.yaml is written in, and says so where it cannot tell.
func CheckResponsePath(bootstrap []byte) ([]string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(bootstrap, &doc); err != nil {
		return nil, fmt.Errorf("envoy: %w", err)
	}
	var warn []string
	guarded := 0
	for _, l := range list(field(doc, "static_resources", "listeners")) {
		lname, _ := field(l, "name").(string)
		for _, fc := range list(field(l, "filter_chains")) {
			for _, f := range list(field(fc, "filters")) {
				name, _ := field(f, "name").(string)
				tc := field(f, "typed_config")
				if name != hcmName && typeOf(tc) != hcmType {
					continue
				}
				w, ok := checkHTTPManager(tc)
				if !ok {
					continue
				}
				guarded++
				for _, s := range w {
					warn = append(warn, fmt.Sprintf("listener %q: %s", lname, s))
				}
			}
		}
	}
	if guarded == 0 {
		warn = append(warn, "no HTTP connection manager in static_resources runs the ext_authz filter: nothing to check (listeners from xDS, or Istio's EnvoyFilters, are not read)")
	}
	return warn, nil
}

// checkHTTPManager checks one HTTP connection manager; ok is false when it
// runs no ext_authz filter, and so no capsnap.
func checkHTTPManager(hcm any) (warn []string, ok bool) {
	filters := list(field(hcm, "http_filters"))
	authz, proc := -1, -1
	var procName, authzName string
	var procCfg, matcher any
	var procDisabled bool
	for i, f := range filters {
		name, _ := field(f, "name").(string)
		tc := field(f, "typed_config")
		switch typeOf(tc) {
		case extAuthzType:
			if authz < 0 {
				authz, authzName = i, name
			}
		case extProcType, withMatcher:
			cfg, m := tc, any(nil)
			if typeOf(tc) == withMatcher {
				cfg = field(tc, "extension_config", "typed_config")
				if typeOf(cfg) != extProcType {
					continue
				}
				m = tc
			}
			if authz >= 0 && !sameService(field(filters[authz], "typed_config"), cfg) {
				continue
			}
			if proc < 0 || (proc < authz && i > authz) {
				proc, procName, procCfg, matcher = i, name, cfg, m
				procDisabled, _ = field(f, "disabled").(bool)
			}
		}
	}
	if authz < 0 {
		return nil, false
	}
	service := serviceOf(field(filters[authz], "typed_config"))
	if proc < 0 {
		return []string{fmt.Sprintf("the ext_authz filter sends Checks to %s, but no ext_proc filter sends it responses: add capsnap's (capsnap.ext_proc in envoy/demo.yaml) after ext_authz", service)}, true
	}
	where := fmt.Sprintf("ext_proc filter %q", procName)
	if proc < authz {
		warn = append(warn, where+" comes before the ext_authz filter: put it after, where the listing ticket is set")
	}
	ns := stringsOf(field(procCfg, "metadata_options", "forwarding_namespaces", "untyped"))
	if !slices.Contains(ns, extAuthzName) {
		warn = append(warn, where+" does not forward the listing ticket: set metadata_options.forwarding_namespaces.untyped to ["+extAuthzName+"]")
	}
	if !opensWithTicket(field(procCfg, "grpc_service", "initial_metadata")) {
		warn = append(warn, where+" does not open its streams with the listing ticket: add to its grpc_service initial_metadata "+
			`{key: x-capsnap-listing, value: "%DYNAMIC_METADATA(`+extAuthzName+`:listing)%"}, or a listing the server resets at once is counted as one whose response path is missing`)
	}
	mode := field(procCfg, "processing_mode")
	if h, _ := field(mode, "response_header_mode").(string); h == "SKIP" {
		warn = append(warn, where+": processing_mode.response_header_mode SKIP sends capsnap no response: want SEND")
	}
	if b, _ := field(mode, "response_body_mode").(string); b != "FULL_DUPLEX_STREAMED" && b != "BUFFERED" {
		if b == "" {
			b = "NONE (the default)"
		}
		warn = append(warn, fmt.Sprintf("%s: processing_mode.response_body_mode %s sends capsnap no list: want FULL_DUPLEX_STREAMED (or BUFFERED)", where, b))
	}
	if matcher != nil {
		switch skipped, onlyListings, err := skipsListing(matcher); {
		case err != nil:
			warn = append(warn, fmt.Sprintf("%s: cannot tell whether its matcher skips a listing (%v): skip only requests whose %s metadata has no decision key, as envoy/demo.yaml does", where, err, extAuthzName))
		case skipped:
			warn = append(warn, fmt.Sprintf("%s: its matcher skips the filter for a request whose %s metadata has a listing ticket, which is every listing capsnap allows", where, extAuthzName))
		case onlyListings:
			warn = append(warn, fmt.Sprintf("%s: its matcher skips every answer but a listing's own, so a listing on another stream (the GET stream, another request's) reaches the agent unscreened: skip only requests whose %s metadata has no decision key, as envoy/demo.yaml does", where, extAuthzName))
		}
	}
	warn = append(warn, checkRoutes(hcm, authzName, procName, procDisabled)...)
	return warn, true
}

// checkRoutes finds the routes that run ext_authz but not ext_proc.
func checkRoutes(hcm any, authzName, procName string, procDisabled bool) []string {
	rc := field(hcm, "route_config")
	if rc == nil {
		if field(hcm, "rds") != nil {
			return []string{"routes come from RDS: check that no route disables the ext_proc filter " + fmt.Sprintf("%q", procName) + " in its typed_per_filter_config"}
		}
		return nil
	}
	var warn []string
	for _, vh := range list(field(rc, "virtual_hosts")) {
		vname, _ := field(vh, "name").(string)
		vhCfg := field(vh, "typed_per_filter_config")
		for _, r := range list(field(vh, "routes")) {
			rCfg := field(r, "typed_per_filter_config")
			per := func(name string) any {
				if c := field(rCfg, name); c != nil {
					return c
				}
				return field(vhCfg, name)
			}
			if disables(per(authzName)) {
				continue // no Check, so no ticket
			}
			if field(r, "route") == nil {
				continue // a redirect or a direct response: no server answers
			}
			server, _ := field(per(authzName), "check_settings", "context_extensions", "server_id").(string)
			name := fmt.Sprintf("route %s of virtual host %q", describeMatch(field(r, "match")), vname)
			if server != "" {
				name += fmt.Sprintf(" (server_id %s)", server)
			}
			pc := per(procName)
			switch {
			case disables(pc):
				warn = append(warn, fmt.Sprintf("%s disables the ext_proc filter %q in its typed_per_filter_config: its listings never come back to capsnap", name, procName))
			case procDisabled && pc == nil:
				warn = append(warn, fmt.Sprintf("%s: the ext_proc filter %q is disabled in http_filters and this route does not enable it", name, procName))
			}
		}
	}
	return warn
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
func field(v any, path ...string) any {
	for _, k := range path {
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
