package envoy

import "testing"

func TestPathKeys(t *testing.T) {
	for _, tt := range []struct {
		p    path
		want string
	}{
		{path("").key("static_resources").key("listeners").index(0), "static_resources.listeners[0]"},
		{path("a").key("envoy.filters.http.ext_authz").key("disabled"), `a["envoy.filters.http.ext_authz"].disabled`},
		{path("a").key(`say "hi"`), `a["say \"hi\""]`},
		{path("a").key(""), `a[""]`},
	} {
		if string(tt.p) != tt.want {
			t.Errorf("%s, want %s", tt.p, tt.want)
		}
	}
}
