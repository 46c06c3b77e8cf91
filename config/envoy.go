package config

import "github.com/capsnap/capsnap/envoy"

// Envoy is what c asks of the Envoy in front of capsnap, for
// envoy.Check (capsnap check --envoy).
func (c Config) Envoy() envoy.Expect {
	e := envoy.Expect{
		Servers:       c.ServerIDs(),
		GRPCAddr:      c.GRPCAddr,
		GRPCTLS:       c.GRPCTLS.Enabled(),
		MaxBodyBytes:  c.Limits.MaxBodyBytes,
		JWTNamespace:  c.Principal.JWT.MetadataNamespace,
		JWTPayloadKey: c.Principal.JWT.PayloadKey,
		ResponsePath:  c.Discovery.Bind == BindDelivered,
	}
	switch c.Principal.Source {
	case SourceMTLS:
		e.Principal = envoy.PrincipalFromPeer
	case SourceJWT:
		e.Principal = envoy.PrincipalFromJWT
	}
	return e
}
