package testbed

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/capsnap/capsnap/envoy"
)

// tlsDir is where envoy/mtls.yaml and envoy/jwt.yaml expect Envoy's TLS
// files; rendering points it at a PKI's directory.
const tlsDir = "/etc/envoy/tls/"

// jwksDir is the directory envoy/jwt.yaml reads the issuer's key set
// from, JWKSFile in it; rendering points it at a PKI's directory.
const jwksDir = "/etc/envoy/jwks/"

// JWKSFile is the file of the issuer's JSON Web Key Set in jwksDir.
const JWKSFile = "jwks.json"

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
	r, err := JWTFiles(pki, iss)
	if err != nil {
		return nil, err
	}
	return render(envoy.JWT, p, r), nil
}

// JWTFiles writes iss's key set into pki's directory, as JWKSFile, and
// returns what points a configuration that reads envoy/jwt.yaml's files
// (its TLS files under /etc/envoy/tls/ and the key set under
// /etc/envoy/jwks/) at that directory.
func JWTFiles(pki *PKI, iss *Issuer) (*strings.Replacer, error) {
	jwks, err := iss.JWKS()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(pki.Dir, JWKSFile), jwks, 0o600); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	return strings.NewReplacer(tlsDir, pki.Dir+"/", jwksDir, pki.Dir+"/"), nil
}

// RemoteJWKS is cfg, envoy/jwt.yaml, with the issuer's keys fetched
// (its commented remote_jwks and idp cluster) in place of read from a
// file (local_jwks): the alternative the file documents, as an operator
// would uncomment it.
func RemoteJWKS(cfg []byte) ([]byte, error) {
	lines := strings.SplitAfter(string(cfg), "\n")
	var out []string
	uncommented := 0
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		body := strings.TrimLeft(l, " ")
		indent := l[:len(l)-len(body)]
		switch {
		case body == "local_jwks:\n":
			i++ // and its filename
			continue
		case body == "# remote_jwks:\n" || body == "# - name: idp\n":
			// The block: this line and the lines indented under it, each
			// without its "# ".
			out = append(out, indent+strings.TrimPrefix(body, "# "))
			for i+1 < len(lines) && strings.HasPrefix(lines[i+1], indent+"#   ") {
				i++
				out = append(out, indent+strings.TrimPrefix(lines[i], indent+"# "))
			}
			uncommented++
			continue
		}
		out = append(out, l)
	}
	if uncommented != 2 {
		return nil, fmt.Errorf("remote jwks: found %d of the 2 commented blocks (remote_jwks, the idp cluster)", uncommented)
	}
	return []byte(strings.Join(out, "")), nil
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
