package envoy

import (
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The access log's pins of an allowed call come from the x-capsnap-*
// request headers, copied by header_to_metadata; they are capsnap's only
// if that filter runs on nothing ext_authz did not let through. Each
// configuration is held to what makes that so, to refusing header names
// a server could fold into x-capsnap-*, to its response path running in
// full duplex, and to its access log reading mcp_method and mcp_name from
// capsnap's metadata (an allowed call's tool copied into mcp_name).
func TestPinsReachTheLogOnlyFromCapsnap(t *testing.T) {
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			var doc struct {
				StaticResources struct {
					Listeners []struct {
						FilterChains []struct {
							Filters []struct {
								Name        string  `yaml:"name"`
								TypedConfig manager `yaml:"typed_config"`
							} `yaml:"filters"`
						} `yaml:"filter_chains"`
					} `yaml:"listeners"`
				} `yaml:"static_resources"`
			}
			if err := yaml.Unmarshal(cfg, &doc); err != nil {
				t.Fatal(err)
			}
			managers := 0
			for _, l := range doc.StaticResources.Listeners {
				for _, fc := range l.FilterChains {
					for _, f := range fc.Filters {
						if f.Name == "envoy.filters.network.http_connection_manager" {
							managers++
							checkManager(t, f.TypedConfig)
						}
					}
				}
			}
			if managers == 0 {
				t.Fatal("no http_connection_manager")
			}
		})
	}
}

var configs = map[string][]byte{"demo.yaml": Demo, "mtls.yaml": MTLS, "jwt.yaml": JWT}

// rawMCPHeader matches an Envoy format operator that reads the client's
// Mcp-Method or Mcp-Name header.
var rawMCPHeader = regexp.MustCompile(`(?i)%(REQ|REQUEST_HEADER)\([^)]*\bmcp-(method|name)\b`)

// The access log names the MCP method and what it names as capsnap read
// them from the body, for every protocol version: never from the
// Mcp-Method and Mcp-Name headers, which clients before 2026-07-28 do not
// send and which, on a request capsnap refused (for them, or before it
// read the body), say whatever the client chose.
func TestAccessLogNamesMCPFromCapsnap(t *testing.T) {
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			if m := rawMCPHeader.Find(cfg); m != nil {
				t.Errorf("the config reads the client's MCP header: %s", m)
			}
		})
	}
}

type manager struct {
	AccessLog []struct {
		TypedConfig struct {
			LogFormat struct {
				JSONFormat map[string]any `yaml:"json_format"`
			} `yaml:"log_format"`
		} `yaml:"typed_config"`
	} `yaml:"access_log"`
	Common struct {
		Underscores string `yaml:"headers_with_underscores_action"`
	} `yaml:"common_http_protocol_options"`
	RouteConfig struct {
		VirtualHosts []struct {
			Routes []struct {
				PerFilter map[string]map[string]any `yaml:"typed_per_filter_config"`
			} `yaml:"routes"`
		} `yaml:"virtual_hosts"`
	} `yaml:"route_config"`
	HTTPFilters []struct {
		Name        string         `yaml:"name"`
		TypedConfig map[string]any `yaml:"typed_config"`
	} `yaml:"http_filters"`
}

const (
	extAuthz         = "envoy.filters.http.ext_authz"
	headerToMetadata = "envoy.filters.http.header_to_metadata"
)

func checkManager(t *testing.T, m manager) {
	t.Helper()
	if m.Common.Underscores != "REJECT_REQUEST" {
		t.Errorf("headers_with_underscores_action %q, want REJECT_REQUEST", m.Common.Underscores)
	}
	at := -1
	for i, f := range m.HTTPFilters {
		if f.Name == extAuthz {
			at = i
		}
	}
	if at < 0 || at+1 >= len(m.HTTPFilters) || m.HTTPFilters[at+1].Name != headerToMetadata {
		t.Fatalf("%s must come right after %s", headerToMetadata, extAuthz)
	}
	if fail, ok := m.HTTPFilters[at].TypedConfig["failure_mode_allow"].(bool); !ok || fail {
		t.Errorf("ext_authz failure_mode_allow is %v, want false, set", m.HTTPFilters[at].TypedConfig["failure_mode_allow"])
	}
	rules, _ := m.HTTPFilters[at+1].TypedConfig["request_rules"].([]any)
	if len(rules) == 0 {
		t.Error("header_to_metadata has no request_rules")
	}
	toolNamed := false
	for _, r := range rules {
		r, _ := r.(map[string]any)
		present, _ := r["on_header_present"].(map[string]any)
		h, _ := r["header"].(string)
		if !strings.HasPrefix(h, "x-capsnap-") || present["metadata_namespace"] != extAuthz || r["on_header_missing"] != nil {
			t.Errorf("header_to_metadata rule %v: want an x-capsnap-* header copied, when present, into %s", r, extAuthz)
		}
		// capsnap's metadata of an allowed call says its method, and
		// leaves the tool to the header it pins it in.
		toolNamed = toolNamed || h == "x-capsnap-tool" && present["key"] == "mcp_name" && present["value"] == nil
	}
	if !toolNamed {
		t.Error("header_to_metadata does not copy x-capsnap-tool into mcp_name: an allowed call's row would name no tool")
	}
	if len(m.AccessLog) == 0 {
		t.Error("no access_log")
	}
	for _, l := range m.AccessLog {
		for _, k := range []string{"mcp_method", "mcp_name"} {
			want := "%DYNAMIC_METADATA(" + extAuthz + ":" + k + ")%"
			if got := l.TypedConfig.LogFormat.JSONFormat[k]; got != want {
				t.Errorf("access log %s is %v, want %s", k, got, want)
			}
		}
	}
	// The response path streams a listing to capsnap in full duplex
	// (extproc's one exchange), with the trailers Envoy requires of it.
	// It skips only what capsnap never decided: every answer to a checked
	// request is screened, since a listing can come on any stream.
	mode := map[string]any{}
	var skipUnless any
	for _, f := range m.HTTPFilters {
		if f.Name == "capsnap.ext_proc" {
			ext, _ := f.TypedConfig["extension_config"].(map[string]any)
			proc, _ := ext["typed_config"].(map[string]any)
			mode, _ = proc["processing_mode"].(map[string]any)
			skipUnless = dig(f.TypedConfig, "xds_matcher", "matcher_list", "matchers", 0, "predicate", "single_predicate", "input", "typed_config", "path", 0, "key")
		}
	}
	if mode["response_body_mode"] != "FULL_DUPLEX_STREAMED" || mode["response_trailer_mode"] != "SEND" {
		t.Errorf("capsnap.ext_proc processing_mode %v, want response_body_mode FULL_DUPLEX_STREAMED with response_trailer_mode SEND", mode)
	}
	if skipUnless != "decision" {
		t.Errorf("capsnap.ext_proc is skipped unless the ext_authz metadata has %v, want decision: every answer to a checked request must be screened", skipUnless)
	}
	for _, vh := range m.RouteConfig.VirtualHosts {
		for _, r := range vh.Routes {
			if off, _ := r.PerFilter[extAuthz]["disabled"].(bool); off {
				if off, _ := r.PerFilter[headerToMetadata]["disabled"].(bool); !off {
					t.Errorf("a route turns ext_authz off but not %s", headerToMetadata)
				}
			}
		}
	}
}

// dig walks v by map keys and slice indexes; nil where the path leads
// nowhere.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			s, _ := v.([]any)
			if k >= len(s) {
				return nil
			}
			v = s[k]
		}
	}
	return v
}
