package approval_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/capsnap/capsnap/approval"
)

// One call has one digest however its JSON is spelled, and another call
// another; it is the JCS form's SHA-256, as the repo writes digests.
func TestArgsDigest(t *testing.T) {
	canonical := `{"amount":240,"order_id":"A-100"}`
	sum := sha256.Sum256([]byte(canonical))
	want := "sha256:" + hex.EncodeToString(sum[:])
	for _, args := range []string{canonical, `{ "order_id" : "A-100", "amount": 2.40e2 }`, "{\n\"amount\":240.0,\"order_id\":\"A\\u002d100\"}"} {
		got, err := approval.ArgsDigest(json.RawMessage(args))
		if err != nil || got != want {
			t.Errorf("ArgsDigest(%s) = %s, %v; want %s", args, got, err, want)
		}
	}
	other, err := approval.ArgsDigest(json.RawMessage(`{"amount":241,"order_id":"A-100"}`))
	if err != nil || other == want {
		t.Errorf("other arguments, same digest: %s, %v", other, err)
	}
	empty := sha256.Sum256([]byte("{}"))
	for _, args := range []string{"", " ", "null"} {
		if got, err := approval.ArgsDigest(json.RawMessage(args)); err != nil || got != "sha256:"+hex.EncodeToString(empty[:]) {
			t.Errorf("ArgsDigest(%q) = %s, %v; want the digest of {}", args, got, err)
		}
	}
	for _, args := range []string{`{"a":1,"a":2}`, `{"a":`, `{"a":1} x`} {
		if got, err := approval.ArgsDigest(json.RawMessage(args)); err == nil {
			t.Errorf("ArgsDigest(%s) = %s, want an error", args, got)
		}
	}
}

// A field's bytes never run into the next one's.
func TestBindingKey(t *testing.T) {
	a := approval.Binding{Principal: "ab", Server: "c", Tool: "t", SchemaDigest: "s", PolicyDigest: "p", ArgsDigest: "x"}
	b := a
	b.Principal, b.Server = "a", "bc"
	if a.Key() == b.Key() {
		t.Fatal("two bindings, one key")
	}
	if c := a; c.Key() != a.Key() || len(a.Key()) != 64 {
		t.Fatalf("key %q is not a stable hex SHA-256", a.Key())
	}
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	// A sixty-fourth of raw ids would start with '-': thousands of draws
	// would meet one.
	for range 5000 {
		id := approval.NewID()
		if !approval.ValidID(id) || len(id) != 22 || seen[id] || id[0] == '-' {
			t.Fatalf("NewID = %q: invalid, repeated, or a command-line flag", id)
		}
		seen[id] = true
	}
	for _, id := range []string{"", "short", "-AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAA=", "AAAAAAAAAAAAAAAAAAAAA+", "AAAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAB"} {
		if approval.ValidID(id) {
			t.Errorf("ValidID(%q)", id)
		}
	}
}
