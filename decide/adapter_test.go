package decide_test

import (
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/extauthz"
)

func init() {
	decide.Envoy = func(s *decide.Server) authv3.AuthorizationServer { return extauthz.New(s, nil) }
}
