// Package envoy holds capsnap's Envoy configurations, embedded so that the
// demo and the end-to-end tests run exactly the YAML that operators read.
package envoy

import _ "embed"

// Demo is demo.yaml: one listener, the ext_authz filter pointed at capsnap,
// and the billing example server behind it.
//
//go:embed demo.yaml
var Demo []byte
