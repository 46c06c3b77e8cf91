package testbed

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/capsnap/capsnap/envoy"
)

// tlsDir is where envoy/mtls.yaml and envoy/jwt.yaml expect Envoy's TLS
// files; rendering points it at a PKI's directory.
const tlsDir = "/etc/envoy/tls/"

// jwksPlaceholder is where envoy/jwt.yaml expects the issuer's JWKS.
const jwksPlaceholder = "${JWKS}"

// MTLSEnvoyConfig is envoy/mtls.yaml for a stack on ports p, serving pki's
// server certificate and requiring client certificates from its CA.
func MTLSEnvoyConfig(p Ports, pki *PKI) []byte {
	return render(envoy.MTLS, p, strings.NewReplacer(tlsDir, pki.Dir+"/"))
}

// CapsnapTLS is capsnap's grpc_tls section in envoy/mtls.yaml's deployment,
// as a YAML flow mapping: pki's capsnap certificate, its CA for clients, and
// Envoy's identity the one client allowed; more, if set, adds entries
// ("reload_interval: 100ms").
func CapsnapTLS(pki *PKI, more string) string {
	if more != "" {
		more = ", " + more
	}
	return fmt.Sprintf("{cert_file: %q, key_file: %q, client_ca_file: %q, allowed_clients: [%q]%s}",
		filepath.Join(pki.Dir, CapsnapCertFile), filepath.Join(pki.Dir, CapsnapKeyFile), filepath.Join(pki.Dir, CAFile), EnvoyIdentity, more)
}

// JWTEnvoyConfig is envoy/jwt.yaml for a stack on ports p, serving pki's
// server certificate and accepting the tokens iss signs.
func JWTEnvoyConfig(p Ports, pki *PKI, iss *Issuer) ([]byte, error) {
	jwks, err := iss.JWKS()
	if err != nil {
		return nil, err
	}
	return render(envoy.JWT, p, strings.NewReplacer(tlsDir, pki.Dir+"/", jwksPlaceholder, string(jwks))), nil
}

// render replaces cfg's demo ports by p's, and then its deploy-time values
// by r's.
func render(cfg []byte, p Ports, r *strings.Replacer) []byte {
	for from, to := range map[int]int{
		DemoPorts.Envoy: p.Envoy, DemoPorts.EnvoyAdmin: p.EnvoyAdmin,
		DemoPorts.GRPC: p.GRPC, DemoPorts.Billing: p.Billing, DemoPorts.Payments: p.Payments,
	} {
		cfg = bytes.ReplaceAll(cfg, []byte("port_value: "+strconv.Itoa(from)+"}"), []byte("port_value: "+strconv.Itoa(to)+"}"))
	}
	return []byte(r.Replace(string(cfg)))
}

// TLSRouteURL is server id's MCP endpoint behind an Envoy that terminates
// TLS (envoy/mtls.yaml, envoy/jwt.yaml).
func (s *Stack) TLSRouteURL(id string) string {
	return fmt.Sprintf("https://%s/%s/mcp", s.EnvoyAddr(), id)
}

// EnvoyAddr is the address of Envoy's MCP listener.
func (s *Stack) EnvoyAddr() string { return addr(s.opts.Ports.Envoy) }
