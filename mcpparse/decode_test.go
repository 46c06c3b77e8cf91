package mcpparse

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// decodeOracle is what encoding/json with UseNumber makes of data.
func decodeOracle(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out map[string]any
	err := dec.Decode(&out)
	return out, err
}

func TestDecodeObject(t *testing.T) {
	tests := []struct {
		name, doc string
		// err is a substring of the refusal; empty means accepted, and
		// then the result must equal encoding/json's.
		err string
	}{
		{"refund arguments", `{"order_id":"ord_1001","amount":120.50,"reason":"duplicate_charge"}`, ""},
		{"empty", ` {} `, ""},
		{"escapes in names and values", `{"a\u00e9\n":"\"q\" \\ \/ \ud83d\ude00","b":"plain"}`, ""},
		{"nesting and every type", `{"o":{"l":[1,-0.0e-0,"s",true,false,null,[],{}]},"n":null}`, ""},
		{"exact number text", `{"big":12345678901234567890.000000000000000001,"e":1E+2}`, ""},
		{"not an object", `[1,2]`, "not a JSON object"},
		{"duplicate names", `{"amount":1,"amount":9999}`, "duplicate"},
		{"number beyond a double", `{"amount":1e400}`, "range"},
		{"invalid UTF-8", "{\"a\":\"\xff\"}", "UTF-8"},
		{"lone surrogate", `{"a":"\ud800"}`, "surrogate"},
		{"trailing data", `{} {}`, "trailing"},
		{"too deep", strings.Repeat(`{"a":`, 1001) + "1" + strings.Repeat("}", 1001), "deep"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeObject([]byte(tt.doc))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("DecodeObject(%s) = %v, %v; want an error containing %q", tt.doc, got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeObject(%s): %v", tt.doc, err)
			}
			want, err := decodeOracle([]byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("DecodeObject(%s) = %#v, encoding/json gives %#v", tt.doc, got, want)
			}
		})
	}
}

// FuzzDecodeObject: whatever DecodeObject accepts, encoding/json decodes to
// the same values.
func FuzzDecodeObject(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,"b",{"c":null}],"d":true}`, `{"\u0041":"\u00e9"}`, `{"n":-1.5e-7}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeObject(data)
		if err != nil {
			return
		}
		want, err := decodeOracle(data)
		if err != nil {
			t.Fatalf("DecodeObject accepted %q, encoding/json refuses it: %v", data, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeObject(%q) = %#v, encoding/json gives %#v", data, got, want)
		}
	})
}

func BenchmarkDecodeObject(b *testing.B) {
	args := []byte(`{"order_id":"ord_1001","amount":120,"reason":"duplicate_charge"}`)
	b.Run("mcpparse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeObject(args); err != nil {
				b.Fatal(err)
			}
		}
	})
	// What DecodeArguments costs for arguments Parse already checked.
	b.Run("checked", func(b *testing.B) {
		m := Message{Arguments: args, checked: true}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.DecodeArguments(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decodeOracle(args); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The arguments of a tools/call Parse read decode, unchecked again, as
// DecodeObject decodes them; a Message built by hand is checked.
func TestDecodeArguments(t *testing.T) {
	for _, args := range []string{`{}`, `{"order_id":"A-1","amount":40.5,"tags":["a",{"b":null}]}`, `{"s":"\u00e9\n"}`} {
		body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":` + args + `}}`
		r, err := Parse([]byte(body), map[string]string{"content-type": "application/json", "accept": "application/json, text/event-stream"}, Limits{})
		if err != nil {
			t.Fatalf("%s: %v", args, err)
		}
		got, err := r.Messages[0].DecodeArguments()
		if err != nil {
			t.Fatal(err)
		}
		want, err := DecodeObject([]byte(args))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: DecodeArguments = %#v, DecodeObject = %#v (%v)", args, got, want, err)
		}
	}
	if _, err := (&Message{Arguments: []byte(`{"a":1,"a":2}`)}).DecodeArguments(); err == nil {
		t.Error("a Message built by hand with duplicate names decoded")
	}
	if got, err := (&Message{}).DecodeArguments(); err != nil || len(got) != 0 {
		t.Errorf("no arguments: %v, %v", got, err)
	}
}
