package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/testbed"
)

// Two replicas on one Redis watch one policy file. A looser file is
// refused by both; capsnap policy reload --allow-loosening on one puts it
// in force there, and the other finds the acceptance and follows, audited
// on each with who and why. A file looser still is refused by both.
func TestPolicyReloadLoosensTheFleet(t *testing.T) {
	dir := t.TempDir()
	policy, err := os.ReadFile("testdata/budgets-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := filepath.Abs("testdata/tools.json")
	if err != nil {
		t.Fatal(err)
	}
	write := func(limit string) {
		t.Helper()
		if err := testbed.ReplaceFile(filepath.Join(dir, "policy.yaml"), bytes.Replace(policy, []byte("limit: 500"), []byte("limit: "+limit), 1)); err != nil {
			t.Fatal(err)
		}
	}
	write("500")
	cfgFile := filepath.Join(dir, "capsnap.yaml")
	yaml := "policy_file: policy.yaml\npolicy_poll_interval: 100ms\ndiscovery: {bind: catalog}\nservers:\n  - {id: billing, catalog_file: " + tools + "}\n" +
		"snapshots:\n  store: redis\n  redis: {addr: " + testbed.StartRedis(t).Addr() + ", secret_file: " + secretFile(t) + "}\n"
	if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	a, b := inProcess(t, cfg), inProcess(t, cfg)
	before := inForce(t, a)

	write("900")
	waitFor(t, "both replicas to refuse the looser file", func() bool {
		return strings.Contains(a.stderr.String(), "policy reload refused") && strings.Contains(b.stderr.String(), "policy reload refused")
	})
	if inForce(t, a) != before || inForce(t, b) != before {
		t.Fatal("a replica put the looser file in force on its own")
	}
	var stdout bytes.Buffer
	o := reloadOptions{adminOptions: adminOptions{admin: a.adminLis.Addr().String()}, loosen: true,
		by: "alice@acme.example", reason: "INC-42: USD 900 for the recall"}
	if err := policyReload(o, &stdout); err != nil || stdout.String() != "policy reload: ok\n" {
		t.Fatalf("policy reload --allow-loosening: %v\n%s", err, &stdout)
	}
	if inForce(t, a) == before {
		t.Fatal("the replica asked did not put the looser file in force")
	}
	waitFor(t, "the other replica to follow", func() bool { return inForce(t, b) == inForce(t, a) })
	for name, svc := range map[string]running{"A": a, "B": b} {
		trail, err := os.ReadFile(svc.cfg.Audit.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(trail, []byte(`"event":"policy_loosened"`)) || !bytes.Contains(trail, []byte(`"by":"alice@acme.example"`)) {
			t.Errorf("%s's audit trail lacks the loosening:\n%s", name, trail)
		}
	}

	accepted := inForce(t, a)
	write("1000")
	waitFor(t, "both replicas to refuse a file looser still", func() bool {
		return strings.Count(a.stderr.String(), "policy reload refused") == 2 && strings.Count(b.stderr.String(), "policy reload refused") == 2
	})
	if inForce(t, a) != accepted || inForce(t, b) != accepted {
		t.Fatal("a file no one accepted was put in force")
	}
}

// inForce is the digest of the policy svc holds in force, as its metrics
// say.
func inForce(t *testing.T, svc running) string {
	t.Helper()
	resp, err := http.Get("http://" + svc.adminLis.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`capsnap_policy_info\{digest="([^"]+)"\} 1`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no capsnap_policy_info in\n%s", body)
	}
	return string(m[1])
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
