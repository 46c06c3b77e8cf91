package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/envoy"
)

func TestWithoutExtAuthz(t *testing.T) {
	out, err := withoutExtAuthz(envoy.Demo)
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz\n") || strings.Contains(s, "cluster_name: capsnap\n                timeout") {
		t.Fatalf("the ext_authz filter is still there:\n%s", s)
	}
	for _, keep := range []string{"envoy.filters.http.router", "prefix: \"/billing/\"", "cluster: billing", "json_format"} {
		if !strings.Contains(s, keep) {
			t.Errorf("lost %q", keep)
		}
	}
	if _, err := withoutExtAuthz(out); err == nil {
		t.Fatal("removed an ext_authz filter from a configuration without one")
	}
}

func TestEnvoyRelease(t *testing.T) {
	line := "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/envoy/_bin/envoy  version: 9e5580933739775e8bce696a57a2e1bc99368f23/1.40.0/Clean/RELEASE/BoringSSL"
	if got := envoyRelease(line); got != "Envoy 1.40.0" {
		t.Fatalf("got %q", got)
	}
}

func TestCheckRequestCarriesTheBody(t *testing.T) {
	req := checkRequest(refundBody, "ep_1")
	h := req.GetAttributes().GetRequest().GetHttp()
	if string(h.GetRawBody()) != refundBody || h.GetHeaders()[epochKey] != "ep_1" || h.GetHeaders()["content-length"] != strconv.Itoa(len(refundBody)) {
		t.Fatalf("%v", h)
	}
	if req.GetAttributes().GetSource().GetPrincipal() != agent || req.GetAttributes().GetContextExtensions()["server_id"] != serverID {
		t.Fatalf("%v", req.GetAttributes())
	}
	if _, ok := checkRequest(listBody, "").GetAttributes().GetRequest().GetHttp().GetHeaders()[epochKey]; ok {
		t.Fatal("an epoch header without an epoch")
	}
}
