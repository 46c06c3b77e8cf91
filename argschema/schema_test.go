package argschema

import (
	"encoding/json"
	"fmt"
	"math/big"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/capsnap/capsnap/mcpparse"
)

const refundSchema = `{"type":"object","properties":{"order_id":{"type":"string"},"amount":{"type":"number","exclusiveMinimum":0},"reason_code":{"type":"string"}},"required":["order_id","amount","reason_code"],"additionalProperties":false}`

func mustCompile(t testing.TB, schema string) *Schema {
	t.Helper()
	s, err := Compile([]byte(schema))
	if err != nil {
		t.Fatalf("Compile(%s): %v", schema, err)
	}
	return s
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name, schema, args string
		// want is "" when the arguments must pass, else a substring of
		// the error.
		want string
	}{
		{"the worked example", refundSchema, `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`, ""},
		{"no arguments against a schema with no required fields", `{"type":"object"}`, ``, ""},
		{"missing required", refundSchema, `{"order_id":"A-100","amount":40}`, "reason_code"},
		{"unpinned field", refundSchema, `{"order_id":"A-100","amount":40,"reason_code":"x","skip_fraud_check":true}`, "skip_fraud_check"},
		{"wrong type", refundSchema, `{"order_id":"A-100","amount":"40","reason_code":"x"}`, "amount"},
		{"at the exclusive bound", refundSchema, `{"order_id":"A-100","amount":0,"reason_code":"x"}`, "amount"},
		{"just above it", refundSchema, `{"order_id":"A-100","amount":1e-300,"reason_code":"x"}`, ""},
		{"a hair over a maximum no double can see", `{"type":"object","properties":{"n":{"maximum":250}}}`, `{"n":250.0000000000000001}`, "n"},
		{"at a maximum", `{"type":"object","properties":{"n":{"maximum":250}}}`, `{"n":2.5e2}`, ""},
		{"integer written as a float", `{"type":"object","properties":{"n":{"type":"integer"}}}`, `{"n":3.0}`, ""},
		{"not an integer", `{"type":"object","properties":{"n":{"type":"integer"}}}`, `{"n":3.5}`, "n"},
		{"enum", `{"type":"object","properties":{"r":{"enum":["a","b",1]}}}`, `{"r":"b"}`, ""},
		{"enum number", `{"type":"object","properties":{"r":{"enum":["a","b",1]}}}`, `{"r":1.0}`, ""},
		{"outside the enum", `{"type":"object","properties":{"r":{"enum":["a","b",1]}}}`, `{"r":"c"}`, "r"},
		{"length in code points", `{"type":"object","properties":{"s":{"maxLength":2}}}`, `{"s":"ñé"}`, ""},
		{"too long", `{"type":"object","properties":{"s":{"maxLength":2}}}`, `{"s":"abc"}`, "s"},
		{"items", `{"type":"object","properties":{"l":{"type":"array","items":{"type":"number","maximum":10},"maxItems":2}}}`, `{"l":[1,10]}`, ""},
		{"an item over", `{"type":"object","properties":{"l":{"type":"array","items":{"type":"number","maximum":10}}}}`, `{"l":[1,11]}`, "l"},
		{"the engine alone: pattern", `{"type":"object","properties":{"s":{"pattern":"^[A-Z]-[0-9]+$"}}}`, `{"s":"A-100"}`, ""},
		{"the engine alone: pattern refused", `{"type":"object","properties":{"s":{"pattern":"^[A-Z]-[0-9]+$"}}}`, `{"s":"a100"}`, "s"},
		{"not an object", `{}`, `[1]`, "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := check(mustCompile(t, tt.schema), []byte(tt.args))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("check = %v, want it to pass", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("check = %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestCheckDecodesNumbersExactly(t *testing.T) {
	args, err := check(mustCompile(t, refundSchema), []byte(`{"order_id":"A","amount":40.10,"reason_code":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := args["amount"]; got != json.Number("40.10") {
		t.Fatalf("amount = %#v, want json.Number 40.10", got)
	}
}

// Which schemas get a direct check: the common shapes do; anything the
// direct check does not implement is left to the engine whole.
func TestDirect(t *testing.T) {
	tests := []struct {
		schema string
		want   bool
	}{
		{refundSchema, true},
		{`{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","title":"t","description":"d"}`, true},
		{`{"type":"object","properties":{"a":true,"b":{"const":"x"},"c":{"type":["string","null"]}}}`, true},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}`, false},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/a"}},"$defs":{"a":{"type":"string"}}}`, false},
		{`{"type":"object","properties":{"a":{"anyOf":[{"type":"string"}]}}}`, false},
		{`{"type":"object","properties":{"a":{"format":"email"}}}`, false},
		{`{"type":"object","additionalProperties":{"type":"string"}}`, false},
		{`{"type":"object","properties":{"a":{"enum":[{"k":1}]}}}`, false},
		{`{"type":"object","properties":{"a":{"minimum":1,"exclusiveMinimum":0}}}`, false},
	}
	for _, tt := range tests {
		if got := mustCompile(t, tt.schema).Direct(); got != tt.want {
			t.Errorf("Direct(%s) = %v, want %v", tt.schema, got, tt.want)
		}
	}
}

func TestDecimalAgainstBigRat(t *testing.T) {
	nums := []string{"0", "-0", "0.0", "1", "-1", "10", "1e1", "1E+1", "100e-1", "0.1", "0.10", "1e-1", "250", "250.0000000000000001",
		"2.5e2", "-250.5", "1e400", "-1e-400", "123456789012345678901234567890", "0.000001", "99.99", "1e999999999"}
	for _, a := range nums {
		for _, b := range nums {
			checkDecimal(t, a, b)
		}
	}
}

func checkDecimal(t *testing.T, a, b string) {
	t.Helper()
	x, okx := parseDecimal(a)
	y, oky := parseDecimal(b)
	ra, oka := new(big.Rat).SetString(a)
	rb, okb := new(big.Rat).SetString(b)
	if !okx || !oky || !oka || !okb {
		return // the engine decides what parseDecimal cannot read
	}
	if got, want := x.cmp(&y), ra.Cmp(rb); got != want {
		t.Fatalf("cmp(%s, %s) = %d, want %d", a, b, got, want)
	}
	if got, want := x.integer(), ra.IsInt(); got != want {
		t.Fatalf("integer(%s) = %v, want %v", a, got, want)
	}
}

func FuzzDecimal(f *testing.F) {
	f.Add("250", "250.0000000000000001")
	f.Add("-1e-3", "-0.001")
	f.Add("1.5E+2", "150")
	f.Fuzz(func(t *testing.T, a, b string) {
		if len(a) > 40 || len(b) > 40 || !json.Valid([]byte(a)) || !json.Valid([]byte(b)) {
			return
		}
		checkDecimal(t, a, b)
	})
}

// FuzzDirectAgreesWithEngine holds the direct check to the engine: it must
// never accept what the engine refuses. (Refusing what the engine accepts
// only costs the engine's time; the engine then decides.)
func FuzzDirectAgreesWithEngine(f *testing.F) {
	f.Add(refundSchema, `{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`)
	f.Add(refundSchema, `{"order_id":"A-100","amount":0,"reason_code":"x"}`)
	f.Add(`{"type":"object","properties":{"n":{"type":"integer","minimum":-5,"maximum":1e2}}}`, `{"n":100.0}`)
	f.Add(`{"type":"object","properties":{"s":{"type":"string","minLength":1,"maxLength":3}},"required":["s"]}`, `{"s":"ñéü"}`)
	f.Add(`{"type":"object","properties":{"e":{"enum":["a",1,true,null]},"c":{"const":2.0}}}`, `{"e":null,"c":2}`)
	f.Add(`{"type":"object","properties":{"l":{"type":"array","items":{"type":["number","string"]},"minItems":1,"maxItems":2}}}`, `{"l":["a",1]}`)
	f.Add(`{"type":["object","null"],"additionalProperties":true,"properties":{"x":{"exclusiveMaximum":0.5}}}`, `{"x":0.49999999999999999999}`)
	f.Fuzz(func(t *testing.T, schema, args string) {
		s, err := Compile([]byte(schema))
		if err != nil || s.direct == nil {
			return
		}
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
		if err != nil {
			return
		}
		if s.direct.accepts(inst) {
			if err := s.engine.Validate(inst); err != nil {
				t.Fatalf("the direct check accepts %s under %s; the engine refuses it: %v", args, schema, err)
			}
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	args := []byte(`{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`)
	for _, mode := range []struct {
		name   string
		direct bool
	}{{"direct", true}, {"engine", false}} {
		b.Run(mode.name, func(b *testing.B) {
			s := mustCompile(b, refundSchema)
			if !mode.direct {
				s.direct = nil
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := check(s, args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// check decodes arguments as capsnap does (mcpparse, numbers as
// json.Number) and validates them, as decide's checkArguments does.
func check(s *Schema, arguments []byte) (map[string]any, error) {
	args, err := (&mcpparse.Message{Arguments: arguments}).DecodeArguments()
	if err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	return args, s.Validate(args)
}
