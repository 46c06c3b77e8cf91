package decide

import (
	"fmt"
	"testing"

	"github.com/capsnap/capsnap/mcpparse"
)

// The compiled-schema cache stays within maxSchemas however many
// definitions pass through it, and still answers by digest after it
// starts over.
func TestSchemasBounded(t *testing.T) {
	var c schemas
	schema := []byte(`{"type":"object","properties":{"n":{"type":"integer"}}}`)
	for i := range maxSchemas + 10 {
		if got := c.get(fmt.Sprintf("sha256:%d", i), schema); got.err != nil || got.schema == nil {
			t.Fatalf("schema %d: %v", i, got.err)
		}
	}
	// It started over: the first definitions went, the last are held
	// (internal/bounded tests the bound itself).
	if _, held := c.Load("sha256:0"); held {
		t.Fatal("the cache kept its first schema past maxSchemas")
	}
	if _, held := c.Load(fmt.Sprintf("sha256:%d", maxSchemas+9)); !held {
		t.Fatal("the cache does not hold the last schema")
	}
	if _, fail := c.checkArguments("sha256:1", schema, &mcpparse.Message{Arguments: []byte(`{"n":"x"}`)}, mcpparse.V20250618, nil); fail == nil {
		t.Fatal("a string passed an integer schema after the cache started over")
	}
	if _, fail := c.checkArguments("sha256:1", schema, &mcpparse.Message{Arguments: []byte(`{"n":3}`)}, mcpparse.V20250618, nil); fail != nil {
		t.Fatalf("valid arguments denied: %v", fail)
	}
}
