package mcpparse

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/capsnap/capsnap/deny"
)

// Mcp-Param-{Name} headers (SEP-2243, protocol version 2026-07-28). A
// tool's inputSchema may mark a property with "x-mcp-header": Name; a
// client then mirrors that argument of a tools/call into the header
// Mcp-Param-Name, so that what routes or authorizes before the server can
// do so without reading the body. What it decides on must then be what the
// server executes: a header that disagrees with the body is refused.

// ParamHeaderPrefix begins the lower-case name of every Mcp-Param-* header.
const ParamHeaderPrefix = "mcp-param-"

// A ParamHeader is one x-mcp-header annotation of an inputSchema: the
// argument at Path, a chain of properties keys from the arguments object,
// is mirrored in the header Mcp-Param-{Name}.
type ParamHeader struct {
	// Name is the annotation's value in lower case, as header names are
	// compared (and as Envoy delivers them).
	Name string
	Path []string
}

// ParamAnnotations returns the x-mcp-header annotations of inputSchema that
// the spec lets a client mirror: those on a property reached from the root
// through properties keys alone, whose value is a string. Annotations
// anywhere else (under items, anyOf, $defs, …) make the tool definition
// invalid to a conforming client, which then never calls it; they are
// left out here, so that a header naming one is refused as naming no
// annotated argument. Two annotations whose names differ only in case are
// both returned: each must then be mirrored by the one header.
func ParamAnnotations(inputSchema []byte) ([]ParamHeader, error) {
	schema, err := DecodeObject(inputSchema)
	if err != nil {
		return nil, fmt.Errorf("x-mcp-header: %w", err)
	}
	out := collectAnnotations(schema, nil, nil)
	// In order, so that a call that fails on several is denied for the
	// same one each time.
	slices.SortFunc(out, func(a, b ParamHeader) int {
		return cmp.Or(strings.Compare(a.Name, b.Name), slices.Compare(a.Path, b.Path))
	})
	return out, nil
}

func collectAnnotations(schema map[string]any, path []string, out []ParamHeader) []ParamHeader {
	props, _ := schema["properties"].(map[string]any)
	for key, sub := range props {
		sub, ok := sub.(map[string]any)
		if !ok {
			continue
		}
		p := append(path[:len(path):len(path)], key)
		if name, ok := sub["x-mcp-header"].(string); ok {
			out = append(out, ParamHeader{Name: strings.ToLower(name), Path: p})
		}
		out = collectAnnotations(sub, p, out)
	}
	return out
}

// paramHeadersOf returns the Mcp-Param-* headers of h by the lower-case
// name after the prefix, or nil when there are none.
func paramHeadersOf(h map[string]string) map[string]string {
	var out map[string]string
	for k, v := range h {
		if name, ok := strings.CutPrefix(k, ParamHeaderPrefix); ok {
			if out == nil {
				out = make(map[string]string)
			}
			out[name] = v
		}
	}
	return out
}

// CheckParamHeaders holds the Mcp-Param-* headers of a tools/call (by the
// lower-case name after the prefix, as Request.ParamHeaders holds them) to
// its decoded arguments, under the annotations of the inputSchema the call
// is verified against. Every denial is a HeaderMismatch.
//
// A header must name an annotated argument that the call carries, and
// decode (DecodeHeaderValue) to that argument's value as SEP-2243 renders
// it: a string as itself, a boolean as true or false, a number as a plain
// decimal equal to it (42.0 mirrors 42; exponents are not read). An
// argument that is absent or null must have no header: the spec only
// excuses the client from sending one, but an intermediary that reads a
// header the server ignores decides on something the server never sees.
// An object or array cannot be mirrored, and must have no header either.
// When required (2026-07-28, whose clients must mirror), an annotated
// argument that is present without its header is refused too.
func CheckParamHeaders(annotations []ParamHeader, args map[string]any, headers map[string]string, required bool) *deny.Error {
	if len(annotations) == 0 && len(headers) == 0 {
		return nil
	}
	// The first in order, so that the denial is the same each time.
	stray, hasStray := "", false
	for name := range headers {
		if !annotated(annotations, name) && (!hasStray || name < stray) {
			stray, hasStray = name, true
		}
	}
	if hasStray {
		return deny.Errorf(deny.HeaderMismatch, "header %s mirrors no argument the tool's inputSchema marks with x-mcp-header", excerpt(ParamHeaderPrefix+stray))
	}
	for _, a := range annotations {
		v, present := argumentAt(args, a.Path)
		h, hasHeader := headers[a.Name]
		switch {
		case !present && hasHeader:
			return deny.Errorf(deny.HeaderMismatch, "header %s is set but the arguments carry no %s to mirror", excerpt(ParamHeaderPrefix+a.Name), excerpt(strings.Join(a.Path, ".")))
		case !present:
			continue
		case !hasHeader && required && mirrorable(v):
			return deny.Errorf(deny.HeaderMismatch, "protocol version %s requires the header %s for the argument %s", V20260728, excerpt(ParamHeaderPrefix+a.Name), excerpt(strings.Join(a.Path, ".")))
		case !hasHeader:
			continue
		}
		if err := checkParamValue(a, h, v); err != nil {
			return err
		}
	}
	return nil
}

func annotated(annotations []ParamHeader, name string) bool {
	for _, a := range annotations {
		if a.Name == name {
			return true
		}
	}
	return false
}

// argumentAt returns the value at path in args, and whether it is there
// and not null.
func argumentAt(args map[string]any, path []string) (any, bool) {
	var v any = args
	for _, key := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = obj[key]; !ok {
			return nil, false
		}
	}
	return v, v != nil
}

// checkParamValue holds header h to the argument value v annotated by a.
func checkParamValue(a ParamHeader, h string, v any) *deny.Error {
	header := excerpt(ParamHeaderPrefix + a.Name)
	got, ok := DecodeHeaderValue(h)
	if !ok {
		return deny.Errorf(deny.HeaderMismatch, "header %s: %s is not valid =?base64?…?= encoding", header, excerpt(h))
	}
	if got == h && !plainValue(h) {
		return deny.Errorf(deny.HeaderMismatch, "header %s: %s has a character a client must =?base64?…?= encode", header, excerpt(h))
	}
	var same bool
	switch v := v.(type) {
	case string:
		same = got == v
	case bool:
		same = got == strconv.FormatBool(v)
	case json.Number:
		same = sameDecimal(got, string(v))
	default:
		return deny.Errorf(deny.HeaderMismatch, "header %s is set but the argument %s is a JSON %s, which no header mirrors", header, excerpt(strings.Join(a.Path, ".")), jsonKind(v))
	}
	if !same {
		return deny.Errorf(deny.HeaderMismatch, "header %s: %s disagrees with the argument %s", header, excerpt(got), excerpt(strings.Join(a.Path, ".")))
	}
	return nil
}

// mirrorable reports whether v is an argument value a header can mirror:
// a string, a number or a boolean.
func mirrorable(v any) bool {
	switch v.(type) {
	case string, json.Number, bool:
		return true
	}
	return false
}

func jsonKind(v any) string {
	if _, ok := v.([]any); ok {
		return "array"
	}
	return "object"
}

// plainValue reports whether s may be sent unencoded: made of the
// characters an HTTP field value carries (RFC 9110 §5.5: visible ASCII,
// space and tab), with no space or tab at either end, which HTTP parsers
// strip, so that the server and what reads the header before it would
// read different values.
func plainValue(s string) bool {
	if s != strings.Trim(s, " \t") {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 || c > 0x7e) && c != '\t' {
			return false
		}
	}
	return true
}

// sameDecimal reports whether header, a plain decimal (-?digits, with an
// optional fraction), has the value of the JSON number body. The values
// are compared exactly, digit by digit, never through a float: a header
// that rounds to the body's float is not the body.
func sameDecimal(header, body string) bool {
	hNeg, hDigits, hExp, ok := decimalOf(header, false)
	if !ok {
		return false
	}
	bNeg, bDigits, bExp, ok := decimalOf(body, true)
	if !ok {
		return false
	}
	if hDigits == "" || bDigits == "" {
		return hDigits == bDigits // zero, of either sign
	}
	return hNeg == bNeg && hDigits == bDigits && hExp == bExp
}

// decimalOf reads s as sign, significant digits and exponent, the value
// being 0.digits × 10^exp, with no leading or trailing zero digit (none at
// all for zero). An exponent (e or E) is read only when withExp is set, as
// JSON allows one and the header rendering does not. It reports false for
// anything else, or an exponent too large to be an argument anyone meant.
func decimalOf(s string, withExp bool) (neg bool, digits string, exp int, ok bool) {
	s, neg = strings.CutPrefix(s, "-")
	mant, e, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, e, hasExp = strings.Cut(s, "E")
	}
	if hasExp && !withExp {
		return false, "", 0, false
	}
	intPart, frac, hasFrac := strings.Cut(mant, ".")
	if intPart == "" || (hasFrac && frac == "") || !allDigits(intPart) || !allDigits(frac) {
		return false, "", 0, false
	}
	digits = strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		// Zero, whatever the exponent.
		return neg, "", 0, true
	}
	if hasExp {
		n, err := strconv.Atoi(strings.TrimPrefix(e, "+"))
		if err != nil || n > 1<<20 || n < -1<<20 {
			return false, "", 0, false
		}
		exp = n
	}
	exp += len(digits) - len(frac)
	digits = strings.TrimRight(digits, "0")
	return neg, digits, exp, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
