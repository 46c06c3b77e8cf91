package decide

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/lockfile"
	"github.com/capsnap/capsnap/mcpparse"
	"github.com/capsnap/capsnap/store"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

const readonly = "spiffe://acme/agent/support-readonly"

// packFixture is a fixture under the seed's policy (testdata/pack).
func packFixture(t testing.TB, opts ...func(*Options)) *fixture {
	t.Helper()
	opts = append([]func(*Options){func(o *Options) { o.Rules = mustRules(t, "testdata/pack/policy.yaml") }}, opts...)
	f := newFixture(t, opts...)
	f.billing.push(t, "testdata/pack/catalog.json", nil)
	return f
}

func argsCall(tool string, args string) checkCase {
	return checkCase{Principal: support, Body: fmt.Sprintf(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args)}
}

const lookup = `{"order_id":"A-100"}`

func TestArgumentsAndConstraints(t *testing.T) {
	tests := []struct {
		name, args string
		want       deny.Reason
		detail     string
	}{
		{"the worked example", `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`, "", ""},
		{"at the cap", `{"order_id":"A-100","amount":250,"reason_code":"damaged"}`, "", ""},
		{"a cent over the cap", `{"order_id":"A-100","amount":250.01,"reason_code":"damaged"}`, deny.ConstraintViolation, "usd_cap_250"},
		{"reason outside the allowlist", `{"order_id":"A-100","amount":40,"reason_code":"goodwill"}`, deny.ConstraintViolation, "reason_allowlist"},
		{"missing required field", `{"order_id":"A-100","amount":40}`, deny.InvalidArguments, "reason_code"},
		{"unpinned consequential field", `{"order_id":"A-100","amount":40,"reason_code":"damaged","skip_fraud_check":true}`, deny.InvalidArguments, "skip_fraud_check"},
		{"amount as a string", `{"order_id":"A-100","amount":"40","reason_code":"damaged"}`, deny.InvalidArguments, "amount"},
		{"negative amount", `{"order_id":"A-100","amount":-5,"reason_code":"damaged"}`, deny.InvalidArguments, "amount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := packFixture(t)
			f.list(t, support, "billing", nil)
			if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" {
				t.Fatalf("lookup_order: %q %s", got.reason, got.data.Detail)
			}
			got := f.call(t, argsCall("refund", tt.args))
			if got.reason != tt.want || !strings.Contains(got.data.Detail, tt.detail) {
				t.Fatalf("got %q (%s), want %q mentioning %q", got.reason, got.data.Detail, tt.want, tt.detail)
			}
		})
	}
}

func TestSequenceRule(t *testing.T) {
	f := packFixture(t)
	f.list(t, support, "billing", nil)
	refund := argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"damaged"}`)
	if got := f.call(t, refund); got.reason != deny.SequenceViolation {
		t.Fatalf("refund before lookup_order: %q", got.reason)
	}
	if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" {
		t.Fatalf("lookup_order: %q", got.reason)
	}
	if got := f.call(t, refund); got.reason != "" {
		t.Fatalf("refund after lookup_order: %q (%s)", got.reason, got.data.Detail)
	}
	// A new snapshot starts a new sequence.
	f.list(t, support, "billing", nil)
	if got := f.call(t, refund); got.reason != deny.SequenceViolation {
		t.Fatalf("refund under a fresh snapshot: %q", got.reason)
	}
	// A denied lookup does not count.
	if got := f.call(t, argsCall("lookup_order", `{"order_id":7}`)); got.reason != deny.InvalidArguments {
		t.Fatalf("lookup_order with a bad id: %q", got.reason)
	}
	if got := f.call(t, refund); got.reason != deny.SequenceViolation {
		t.Fatalf("refund after a denied lookup: %q", got.reason)
	}
}

func TestNotGrantedListsAllowedTools(t *testing.T) {
	for _, list := range []bool{true, false} {
		f := packFixture(t, func(o *Options) { o.Denials.ListAllowedTools = list })
		f.list(t, readonly, "billing", nil)
		c := argsCall("refund", `{}`)
		c.Principal = readonly
		got := f.call(t, c)
		if got.reason != deny.ToolNotGranted {
			t.Fatalf("reason %q", got.reason)
		}
		want := []string(nil)
		if list {
			want = []string{"lookup_order"}
		}
		if fmt.Sprint(got.data.AllowedTools) != fmt.Sprint(want) {
			t.Errorf("list=%v: allowed_tools %v, want %v", list, got.data.AllowedTools, want)
		}
	}
}

// writeLockedPolicy writes the pack policy with a lockfile approving the
// tools of catalogFile, and returns the policy's path.
func writeLockedPolicy(t *testing.T, dir, catalogFile string) string {
	t.Helper()
	data, err := os.ReadFile(catalogFile)
	if err != nil {
		t.Fatal(err)
	}
	var result struct{ Tools []json.RawMessage }
	if err := json.Unmarshal(data, &result); err != nil {
		t.Fatal(err)
	}
	return lockedPolicy(t, dir, "testdata/pack/policy.yaml", result.Tools...)
}

// lockedPolicy writes into dir the policy at policyFile with a lockfile
// approving exactly defs on billing, at their digests, and returns the
// policy's path.
func lockedPolicy(t testing.TB, dir, policyFile string, defs ...json.RawMessage) string {
	t.Helper()
	var entries []lockfile.Entry
	for _, def := range defs {
		d, canon, err := mcpparse.ToolDigest(def)
		if err != nil {
			t.Fatal(err)
		}
		var n struct{ Name string }
		if err := json.Unmarshal(def, &n); err != nil || n.Name == "" {
			t.Fatalf("definition %s: %v", def, err)
		}
		entries = append(entries, lockfile.Entry{ServerID: "billing", Tool: n.Name, Digest: d, Definition: canon})
	}
	if err := lockfile.Write(filepath.Join(dir, "capsnap.lock"), entries); err != nil {
		t.Fatal(err)
	}
	pol, err := os.ReadFile(policyFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, append([]byte("lockfile: capsnap.lock\n"), pol...), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A tool whose live digest the lockfile does not approve waits for review:
// it joins no snapshot, and a call to it says why.
func TestLockfileGatesNewDigests(t *testing.T) {
	path := writeLockedPolicy(t, t.TempDir(), "testdata/pack/catalog.json")
	f := packFixture(t, func(o *Options) { o.Rules = mustRules(t, path) })
	f.list(t, support, "billing", nil)
	if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" {
		t.Fatalf("approved tool: %q (%s)", got.reason, got.data.Detail)
	}
	f.billing.push(t, "testdata/pack/catalog-description.json", nil)
	f.list(t, support, "billing", nil)
	got := f.call(t, argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"damaged"}`))
	if got.reason != deny.ToolUnapproved {
		t.Fatalf("changed tool outside the lockfile: %q (%s)", got.reason, got.data.Detail)
	}
	if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" {
		t.Fatalf("unchanged tool after the other changed: %q", got.reason)
	}
}

func TestReloadRefusesSilentLoosening(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	base, err := os.ReadFile("testdata/pack/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	write := func(b []byte) {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(base)
	f := packFixture(t, func(o *Options) { o.Rules = mustRules(t, path) })
	f.list(t, support, "billing", nil)
	f.call(t, argsCall("lookup_order", lookup))
	over := argsCall("refund", `{"order_id":"A-100","amount":400,"reason_code":"damaged"}`)

	if r, err := f.Reload(path, nil); r != ReloadUnchanged || err != nil {
		t.Fatalf("reload of the same file: %s, %v", r, err)
	}
	write([]byte("tools: [\n"))
	if r, err := f.Reload(path, nil); r != ReloadInvalid || err == nil {
		t.Fatalf("reload of an invalid file: %s, %v", r, err)
	}
	// A rule on a server capsnap does not have is a typo: refused as
	// serve refuses it at start.
	write([]byte(strings.Replace(string(base), "{server: billing, tool: lookup_order, effect: read}", "{server: billing, tool: lookup_order, effect: read}\n  - {server: biling, tool: archive, effect: read}", 1)))
	if r, err := f.Reload(path, nil); r != ReloadInvalid || err == nil || !strings.Contains(err.Error(), `server "biling" is not configured (did you mean "billing"?)`) {
		t.Fatalf("reload naming an unknown server: %s, %v", r, err)
	}
	// An argument the live refund does not declare would deny every
	// call: refused as capsnap check --connect refuses it.
	write([]byte(strings.Replace(string(base), "args.amount <= 250", "args.ammount <= 250", 1)))
	if r, err := f.Reload(path, nil); r != ReloadInvalid || err == nil || !strings.Contains(err.Error(), "reads args.ammount, which the input schema of billing/refund does not declare") {
		t.Fatalf("reload reading an argument refund lacks: %s, %v", r, err)
	}
	raised := []byte(strings.Replace(string(base), "args.amount <= 250", "args.amount <= 500", 1))
	write(raised)
	if r, err := f.Reload(path, nil); r != ReloadLoosening || err == nil || !strings.Contains(err.Error(), "usd_cap_250") {
		t.Fatalf("reload raising the cap: %s, %v", r, err)
	}
	if got := f.call(t, over); got.reason != deny.ConstraintViolation {
		t.Fatalf("after a refused reload the old cap must hold: %q", got.reason)
	}
	// Tightening (a constraint added; any changed expression counts as
	// loosening) needs no permission.
	write([]byte(strings.Replace(string(base), `      - {name: reason_allowlist`, `      - {name: at_least_a_cent, expr: "args.amount >= 0.01"}
      - {name: reason_allowlist`, 1)))
	if r, err := f.Reload(path, nil); r != ReloadOK {
		t.Fatalf("tightening reload: %s, %v", r, err)
	}
	// Loosening with the operator's explicit say: new snapshots only.
	write(raised)
	if r, err := f.Reload(path, &Signoff{By: "alice@acme.example", Reason: "INC-42: the cap goes to 500"}); r != ReloadOK {
		t.Fatalf("explicit loosening: %s, %v", r, err)
	}
	if got := f.call(t, over); got.reason != deny.PolicyDrift {
		t.Fatalf("old snapshot after loosening: %q, want policy_drift", got.reason)
	}
	f.list(t, support, "billing", nil)
	f.call(t, argsCall("lookup_order", lookup))
	if got := f.call(t, over); got.reason != "" {
		t.Fatalf("new snapshot under the new cap: %q (%s)", got.reason, got.data.Detail)
	}
	if got := testutilCount(f, "refused_loosening"); got != 1 {
		t.Fatalf("refused_loosening counted %v times", got)
	}
}

// refusingStore is a snapshot store that is full: it admits nothing.
type refusingStore struct{ store.Backend }

func (refusingStore) Put(*store.Snapshot) error { return errors.New("store full") }

// A snapshot that cannot be stored is a discovery that mints nothing: the
// tools/list is denied rather than passed without evidence behind it.
func TestMintFailsClosedWhenStoreRefuses(t *testing.T) {
	t.Run("catalog", func(t *testing.T) {
		f := packFixture(t, func(o *Options) { o.Snapshots, o.Bind = refusingStore{o.Snapshots}, config.BindCatalog })
		got := f.call(t, checkCase{Principal: support, Body: listBody})
		if got.reason != deny.NoSnapshot || !strings.Contains(got.data.Detail, "store full") {
			t.Fatalf("tools/list with a full store: %q (%s)", got.reason, got.data.Detail)
		}
	})
	t.Run("delivered", func(t *testing.T) {
		f := packFixture(t, func(o *Options) { o.Snapshots = refusingStore{o.Snapshots} })
		resp, err := f.Check(context.Background(), checkCase{Principal: support, Body: listBody}.request())
		if err != nil {
			t.Fatal(err)
		}
		out := f.Deliver(listingTicket(t, resp), ResponseHead{Status: 200, ContentType: "application/json"}, f.served(t, "billing", `"l"`))
		if out.Fail == nil || out.Fail.Reason != deny.NoSnapshot || !strings.Contains(out.Fail.Detail, "store full") {
			t.Fatalf("tools/list response with a full store: %v", out.Fail)
		}
		if deliveredHeader(out, HeaderEpoch) != "" {
			t.Fatal("a refused response carries an epoch")
		}
	})
}

// The lockfile in force at call time decides: withdrawing an approval stops
// calls under snapshots minted while it stood.
func TestLockfileWithdrawnAfterMint(t *testing.T) {
	dir := t.TempDir()
	path := writeLockedPolicy(t, dir, "testdata/pack/catalog.json")
	f := packFixture(t, func(o *Options) { o.Rules = mustRules(t, path) })
	f.list(t, support, "billing", nil)
	if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" {
		t.Fatalf("approved lookup_order: %q", got.reason)
	}
	// A lockfile approving only the edited catalog: today's refund and
	// lookup_order are no longer approved.
	f.SetRules(mustRules(t, writeLockedPolicy(t, dir, "testdata/pack/catalog-description.json")))
	if got := f.call(t, argsCall("lookup_order", lookup)); got.reason != "" {
		t.Fatalf("lookup_order, unchanged in both lockfiles: %q", got.reason)
	}
	got := f.call(t, argsCall("refund", `{"order_id":"A-100","amount":40,"reason_code":"damaged"}`))
	if got.reason != deny.ToolUnapproved {
		t.Fatalf("pinned refund after its approval was withdrawn: %q (%s)", got.reason, got.data.Detail)
	}
}

// The policy watcher refuses a looser file once: logged and counted once,
// not at every poll, until the file changes again.
func TestWatchPolicyRefusesOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	base, err := os.ReadFile("testdata/pack/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, base, 0o600); err != nil {
		t.Fatal(err)
	}
	f := packFixture(t, func(o *Options) { o.Rules = mustRules(t, path) })
	var log bytes.Buffer
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.WatchPolicy(ctx, path, 5*time.Millisecond, zerolog.New(&log)); close(done) }()
	// Replaced whole, as editors and ConfigMaps do: the watcher never
	// reads a half-written file.
	write := func(old, new string) {
		t.Helper()
		tmp := filepath.Join(dir, "policy.yaml.new")
		if err := os.WriteFile(tmp, []byte(strings.Replace(string(base), old, new, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("args.amount <= 250", "args.amount <= 500")
	time.Sleep(200 * time.Millisecond)
	write("args.amount <= 250", "args.amount <= 600")
	time.Sleep(200 * time.Millisecond)
	cancel()
	<-done
	if n := strings.Count(log.String(), "policy reload refused"); n != 2 {
		t.Errorf("%d refusals logged for two looser files, want 2:\n%s", n, log.String())
	}
	if got := testutil.ToFloat64(f.metrics.reloads.WithLabelValues(ReloadLoosening)); got != 2 {
		t.Errorf("refusals counted %v, want 2", got)
	}
}

// The rules' source hash is of the two files apart: bytes moved from the
// end of the policy to the start of the lockfile are other sources.
func TestSourceHashKeepsTheFilesApart(t *testing.T) {
	if hashSources([]byte("ab"), []byte("c")) == hashSources([]byte("a"), []byte("bc")) {
		t.Fatal("ab+c and a+bc hash alike")
	}
}
