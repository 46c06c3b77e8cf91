package mcpparse

import (
	"encoding/base64"
	"encoding/json"
	"math/big"
	"os"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/capsnap/capsnap/deny"
)

func TestParamAnnotations(t *testing.T) {
	schema, err := os.ReadFile("testdata/paramheaders/schema.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParamAnnotations(schema)
	if err != nil {
		t.Fatal(err)
	}
	want := []ParamHeader{
		{Name: "blob", Path: []string{"blob"}},
		{Name: "count", Path: []string{"count"}},
		{Name: "dry-run", Path: []string{"dry"}},
		{Name: "region", Path: []string{"region"}},
		{Name: "zone", Path: []string{"opts", "zone"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParamAnnotations = %v\nwant %v (none under items, anyOf or $defs)", got, want)
	}
	if _, err := ParamAnnotations([]byte(`[]`)); err == nil {
		t.Error("ParamAnnotations of an array: no error")
	}
}

// paramCase is one row of testdata/paramheaders/cases.json: a tools/call's
// arguments and Mcp-Param-* headers (by the name after the prefix), held
// to testdata/paramheaders/schema.json.
type paramCase struct {
	Name      string            `json:"name"`
	Arguments json.RawMessage   `json:"arguments"`
	Headers   map[string]string `json:"headers"`
	Required  bool              `json:"required"`
	Reason    deny.Reason       `json:"reason"`
	Detail    string            `json:"detail"`
}

func TestCheckParamHeaders(t *testing.T) {
	schema, err := os.ReadFile("testdata/paramheaders/schema.json")
	if err != nil {
		t.Fatal(err)
	}
	annotations, err := ParamAnnotations(schema)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("testdata/paramheaders/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []paramCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			args, err := DecodeObject(c.Arguments)
			if err != nil {
				t.Fatal(err)
			}
			fail := CheckParamHeaders(annotations, args, c.Headers, c.Required)
			if c.Reason == "" {
				if fail != nil {
					t.Fatalf("CheckParamHeaders = %v, want it accepted", fail)
				}
				return
			}
			if fail == nil || fail.Reason != c.Reason || !strings.Contains(fail.Detail, c.Detail) {
				t.Errorf("CheckParamHeaders = %v\nwant reason %s with detail containing %q", fail, c.Reason, c.Detail)
			}
		})
	}
}

// Two annotations whose names differ only in case are mirrored by one
// header, which must then agree with both arguments.
func TestCheckParamHeadersSharedName(t *testing.T) {
	annotations, err := ParamAnnotations([]byte(`{"properties":{"a":{"x-mcp-header":"R"},"b":{"x-mcp-header":"r"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckParamHeaders(annotations, map[string]any{"a": "x", "b": "x"}, map[string]string{"r": "x"}, true); err != nil {
		t.Errorf("agreeing with both: %v", err)
	}
	if err := CheckParamHeaders(annotations, map[string]any{"a": "x", "b": "y"}, map[string]string{"r": "x"}, true); err == nil {
		t.Error("agreeing with one of two: accepted")
	}
	if err := CheckParamHeaders(annotations, map[string]any{"a": "x", "b": "x"}, map[string]string{"r": "x", "s": "x"}, true); err == nil {
		t.Error("an unannotated header beside a shared one: accepted")
	}
}

// referenceDecode is the Python SDK's decode_header_value, restated: a
// sentinel's payload must be the canonical base64 of UTF-8.
func referenceDecode(v string) (string, bool) {
	if len(v) < len(base64Prefix)+len(base64Suffix) || !strings.HasPrefix(v, base64Prefix) || !strings.HasSuffix(v, base64Suffix) {
		return v, true
	}
	payload := v[len(base64Prefix) : len(v)-len(base64Suffix)]
	b, err := base64.StdEncoding.DecodeString(payload)
	if err != nil || base64.StdEncoding.EncodeToString(b) != payload || !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// FuzzParamHeaders holds the value codec to independent statements of it:
// DecodeHeaderValue to the Python SDK's decoder, and the numeric
// comparison to exact rational arithmetic.
func FuzzParamHeaders(f *testing.F) {
	f.Add("=?base64?SGVsbG8sIOS4lueVjA==?=", "42")
	f.Add("=?base64?ZXV=?=", "42.0")
	f.Add("=?base64?ZX\nU=?=", "-0")
	f.Add("100", "1e2")
	f.Add("0.0010", "1E-3")
	f.Add("9007199254740992", "9007199254740993")
	f.Fuzz(func(t *testing.T, header, number string) {
		got, ok := DecodeHeaderValue(header)
		want, wantOK := referenceDecode(header)
		if got != want || ok != wantOK {
			t.Errorf("DecodeHeaderValue(%q) = %q, %v; the Python SDK's rule gives %q, %v", header, got, ok, want, wantOK)
		}
		// Exponents beyond a few digits would make big.Rat the slow part.
		if len(number) > 40 || !json.Valid([]byte(number)) || number[0] == '"' || strings.ContainsAny(number, "tfn[{ \t\r\n") {
			return
		}
		body, ok := new(big.Rat).SetString(number)
		if !ok {
			return
		}
		plain := header != "" && strings.Trim(header, "-0123456789.") == "" && !strings.HasPrefix(header, "-.") &&
			!strings.HasPrefix(header, ".") && !strings.HasSuffix(header, ".") && strings.Count(header, ".") <= 1 && strings.LastIndex(header, "-") <= 0
		h, hOK := new(big.Rat).SetString(header)
		wantSame := plain && hOK && h.Cmp(body) == 0
		if same := sameDecimal(header, number); same != wantSame {
			t.Errorf("sameDecimal(%q, %q) = %v, exact arithmetic says %v", header, number, same, wantSame)
		}
	})
}
