// Package envoy holds capsnap's Envoy configurations, embedded so that the
// demo and the end-to-end tests run exactly the YAML that operators read.
package envoy

import _ "embed"

// Demo is demo.yaml: one listener, the ext_authz filter pointed at capsnap,
// and the billing example server behind it.
//
//go:embed demo.yaml
var Demo []byte

// MTLS is mtls.yaml: the listener requires a client certificate whose URI
// SAN is a SPIFFE ID, and capsnap takes the principal from it.
//
//go:embed mtls.yaml
var MTLS []byte

// JWT is jwt.yaml: jwt_authn verifies a bearer token before ext_authz, and
// capsnap takes the principal from one of its claims.
//
//go:embed jwt.yaml
var JWT []byte
