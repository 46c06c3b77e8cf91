package testbed

import (
	"encoding/json"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	// The extensions envoy/*.yaml and the examples' Envoy configurations
	// name, for protojson to resolve their type URLs.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/common/matching/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/matcher/action/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/input_matchers/metadata/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// DecodeEnvoy decodes an Envoy bootstrap, YAML or JSON, as Envoy does:
// as the v3 Bootstrap message, every field and extension known (strict),
// then validated by the message's own rules. It needs no Envoy, so that
// plain go test holds configurations to Envoy's API; the end-to-end tests
// also run them through envoy --mode validate.
func DecodeEnvoy(cfg []byte) (*bootstrapv3.Bootstrap, error) {
	var v any
	if err := yaml.Unmarshal(cfg, &v); err != nil {
		return nil, fmt.Errorf("decode envoy: %w", err)
	}
	js, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("decode envoy: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("decode envoy: %w", err)
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("decode envoy: %w", err)
	}
	return &b, nil
}

// HTTPManagers are the HTTP connection managers of b's static listeners,
// in order.
func HTTPManagers(b *bootstrapv3.Bootstrap) ([]*hcmv3.HttpConnectionManager, error) {
	var out []*hcmv3.HttpConnectionManager
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				m := &hcmv3.HttpConnectionManager{}
				if !f.GetTypedConfig().MessageIs(m) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(m); err != nil {
					return nil, fmt.Errorf("listener %s: %w", l.GetName(), err)
				}
				out = append(out, m)
			}
		}
	}
	return out, nil
}
