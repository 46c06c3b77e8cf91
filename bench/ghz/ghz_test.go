package ghz

import (
	"bytes"
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
)

// testdata/report-200.json is a real ghz v0.93.0 report: 200 Checks of
// the floor at concurrency 4.
func TestParseReport(t *testing.T) {
	b, err := os.ReadFile("testdata/report-200.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	// This report's own percentiles, average and rate are those taken
	// again from its details.
	if r.Count != 200 || r.P50 != 1202400 || r.P99 != 9385689 || r.Mean != 2113069 || int(r.RPS) != 1760 {
		t.Fatalf("parsed %+v", r)
	}
	if err := r.Failed(); err != nil {
		t.Fatal(err)
	}
	// A report that lost details cannot be merged faithfully.
	if _, err := Parse(bytes.Replace(b, []byte(`"count": 200`), []byte(`"count": 201`), 1)); err == nil {
		t.Fatal("parsed a report with fewer details than requests")
	}
}

func TestParseRejectsGarbage(t *testing.T) {
	if _, err := Parse([]byte("Summary:\n  Count: 3")); err == nil {
		t.Fatal("parsed ghz's summary format")
	}
	if _, err := Parse([]byte(`{"count":3,"details":[]}`)); err == nil {
		t.Fatal("parsed a report without details")
	}
}

// The protoset must stand on its own: every import is in it, before the
// files that import it, and it has the Check method ghz calls.
func TestProtosetIsComplete(t *testing.T) {
	b, err := Protoset()
	if err != nil {
		t.Fatal(err)
	}
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		t.Fatalf("the protoset does not resolve: %v", err)
	}
	seen := map[string]bool{}
	for _, f := range set.File {
		for _, dep := range f.Dependency {
			if !seen[dep] {
				t.Errorf("%s comes before its import %s", f.GetName(), dep)
			}
		}
		seen[f.GetName()] = true
	}
	d, err := files.FindDescriptorByName("envoy.service.auth.v3.Authorization.Check")
	if err != nil {
		t.Fatalf("no Check method: %v", err)
	}
	if d.FullName() != Call {
		t.Fatalf("found %s", d.FullName())
	}
}
