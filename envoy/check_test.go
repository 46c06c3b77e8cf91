package envoy_test

import (
	"strings"
	"testing"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envoy"
)

// responsePathFindings are what Check finds in a variant of demo.yaml,
// held to the capsnap the demo runs behind it: the demo as shipped is
// clean, so each is the variant's.
func responsePathFindings(t *testing.T, bootstrap []byte) []string {
	t.Helper()
	cfg, err := config.Load("testdata/capsnap-demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	found, err := envoy.Check(bootstrap, cfg.Envoy())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range found {
		out = append(out, f.String())
	}
	return out
}

// edit replaces old, which must be in demo.yaml once, with new.
func edit(t *testing.T, old, new string) []byte {
	t.Helper()
	cfg := string(envoy.Demo)
	if strings.Count(cfg, old) != 1 {
		t.Fatalf("demo.yaml has %d of %q", strings.Count(cfg, old), old)
	}
	return []byte(strings.Replace(cfg, old, new, 1))
}

// withoutExtProc is demo.yaml without its ext_proc filter.
func withoutExtProc(t *testing.T) []byte {
	t.Helper()
	cfg := string(envoy.Demo)
	from := strings.Index(cfg, "          - name: capsnap.ext_proc\n")
	to := strings.Index(cfg, "          - name: envoy.filters.http.router\n")
	if from < 0 || to < from {
		t.Fatal("demo.yaml: the ext_proc filter is not where expected")
	}
	return []byte(cfg[:from] + cfg[to:])
}

const billingRoute = `                    check_settings:
                      # The server a request really goes to comes from the
                      # route, never from the body.
                      context_extensions: {server_id: billing}
`

func TestCheckResponsePath(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(t *testing.T) []byte
		// want are substrings of the one warning expected; none if empty.
		want []string
	}{
		{"no ext_proc filter", withoutExtProc, []string{"listeners[0]", "http_filters", "no ext_proc filter", "cluster capsnap"}},
		{"disabled on a route", func(t *testing.T) []byte {
			return edit(t, billingRoute, billingRoute+`                  capsnap.ext_proc:
                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    disabled: true
`)
		}, []string{`route prefix "/billing/"`, "server_id billing", "disables the ext_proc filter"}},
		{"disabled on a route that has no ext_authz either", func(t *testing.T) []byte {
			return edit(t, billingRoute, billingRoute+`                    disabled: true
                  capsnap.ext_proc:
                    "@type": type.googleapis.com/envoy.config.route.v3.FilterConfig
                    disabled: true
`)
			// No response path to miss: the route itself is the finding.
		}, []string{`route prefix "/billing/"`, "reach the MCP server unchecked"}},
		{"disabled in http_filters", func(t *testing.T) []byte {
			return edit(t, "          - name: capsnap.ext_proc\n", "          - name: capsnap.ext_proc\n            disabled: true\n")
		}, nil}, // one warning per route: checked below
		{"ticket not forwarded", func(t *testing.T) []byte {
			return edit(t, "forwarding_namespaces: {untyped: [envoy.filters.http.ext_authz]}", "forwarding_namespaces: {untyped: [other]}")
		}, []string{`ext_proc filter "capsnap.ext_proc"`, "does not forward the listing ticket"}},
		{"ticket not on the stream", func(t *testing.T) []byte {
			return edit(t, "- {key: x-capsnap-listing,", "- {key: x-other,")
		}, []string{`ext_proc filter "capsnap.ext_proc"`, "does not open its streams with the listing ticket"}},
		{"no body", func(t *testing.T) []byte {
			return edit(t, "response_body_mode: FULL_DUPLEX_STREAMED", "response_body_mode: NONE")
		}, []string{"response_body_mode NONE"}},
		{"headers skipped", func(t *testing.T) []byte {
			return edit(t, "response_header_mode: SEND", "response_header_mode: SKIP")
		}, []string{"response_header_mode SKIP"}},
		{"matcher skips a listing", func(t *testing.T) []byte {
			return edit(t, "invert: true", "invert: false")
		}, []string{"its matcher skips the filter", "listing ticket"}},
		{"matcher on something else", func(t *testing.T) []byte {
			return edit(t, "path: [{key: decision}]", "path: [{key: reason}]")
		}, []string{"cannot tell whether its matcher skips a listing"}},
		{"matcher on the listing ticket alone", func(t *testing.T) []byte {
			return edit(t, "path: [{key: decision}]", "path: [{key: listing}]")
		}, []string{"a listing on another stream"}},
		{"another service", func(t *testing.T) []byte {
			return edit(t, "                  grpc_service:\n                    envoy_grpc: {cluster_name: capsnap}\n", "                  grpc_service:\n                    envoy_grpc: {cluster_name: elsewhere}\n")
		}, []string{"no ext_proc filter sends it responses"}},
		{"no ext_authz", func(t *testing.T) []byte {
			return edit(t, "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz\n", "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC\n")
		}, []string{"runs the ext_authz filter: nothing to check"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			warn := responsePathFindings(t, tt.cfg(t))
			if tt.name == "disabled in http_filters" {
				if len(warn) != 2 || !strings.Contains(warn[0], "server_id billing") || !strings.Contains(warn[1], "server_id payments") {
					t.Fatalf("warnings %q, want one for each route", warn)
				}
				return
			}
			if len(tt.want) == 0 {
				if len(warn) != 0 {
					t.Fatalf("warnings %q, want none", warn)
				}
				return
			}
			if len(warn) != 1 {
				t.Fatalf("warnings %q, want one", warn)
			}
			for _, w := range tt.want {
				if !strings.Contains(warn[0], w) {
					t.Errorf("warning %q does not say %q", warn[0], w)
				}
			}
		})
	}
}
