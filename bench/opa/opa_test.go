package opa

import (
	"encoding/json"
	"testing"

	"github.com/capsnap/capsnap/examples/billing"
	"github.com/capsnap/capsnap/pincheck"
)

// data.json's catalog and pins must be what billing serves at baseline,
// or OPA would deny every benchmark request.
func TestCatalogIsBillingBaseline(t *testing.T) {
	var d struct {
		Capsnap struct {
			Catalog map[string]map[string]string `json:"catalog"`
		} `json:"capsnap"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	cat := d.Capsnap.Catalog
	defs := billing.Definitions(billing.Baseline)
	if len(cat["billing"]) != len(defs) {
		t.Fatalf("data.json lists %d billing tools, billing serves %d", len(cat["billing"]), len(defs))
	}
	for _, def := range defs {
		want, err := pincheck.Digest(def)
		if err != nil {
			t.Fatal(err)
		}
		if got := cat["billing"][def.Name]; got != want {
			t.Errorf("data.json: %s at %s, billing serves %s", def.Name, got, want)
		}
	}
}

func TestDataRenamesTheSnapshot(t *testing.T) {
	b, err := Data("ep_live")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Capsnap struct {
			Catalog   map[string]map[string]string `json:"catalog"`
			Snapshots map[string]struct {
				Principal string            `json:"principal"`
				Pins      map[string]string `json:"pins"`
			} `json:"snapshots"`
		} `json:"capsnap"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	snap, ok := d.Capsnap.Snapshots["ep_live"]
	if !ok || len(d.Capsnap.Snapshots) != 1 {
		t.Fatalf("snapshots: %v", d.Capsnap.Snapshots)
	}
	if snap.Principal == "" || snap.Pins["refund"] != d.Capsnap.Catalog["billing"]["refund"] {
		t.Fatalf("snapshot not carried over: %+v", snap)
	}
}
