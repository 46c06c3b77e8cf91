package envelope

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/gowebpki/jcs"
)

// jcsArgsDigest is ArgsDigest as it was before canonical.go: jcs.Transform,
// with "{}" for arguments that bytes.TrimSpace leaves empty or null. It is
// the oracle FuzzArgsDigest holds ArgsDigest to, and the "before" of
// BenchmarkArgsDigest.
func jcsArgsDigest(args json.RawMessage) (string, error) {
	canonical := []byte("{}")
	if len(bytes.TrimSpace(args)) > 0 && !bytes.Equal(bytes.TrimSpace(args), []byte("null")) {
		var err error
		if canonical, err = jcs.Transform(args); err != nil {
			return "", err
		}
	}
	sum := sha256.Sum256(canonical)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// trimJSONSpace trims what RFC 8259 calls whitespace, and nothing else.
func trimJSONSpace(b []byte) []byte {
	return bytes.Trim(b, " \t\n\r")
}

// oracleCanonical is what canonicalArgs must write: "{}" for no arguments
// (only JSON whitespace, or null), else exactly jcs.Transform's output, and
// an error exactly where jcs.Transform has one.
func oracleCanonical(args []byte) ([]byte, error) {
	if t := trimJSONSpace(args); len(t) == 0 || string(t) == "null" {
		return []byte("{}"), nil
	}
	return jcs.Transform(args)
}

func canonicalize(args []byte) ([]byte, error) {
	c := canonPool.Get().(*canon)
	defer c.release()
	out, err := canonicalArgs(c, nil, args)
	return out, err
}

// checkAgainstJCS fails t unless canonicalArgs agrees with the oracle on
// data, and ArgsDigest with jcsArgsDigest except where the one documented
// difference allows.
func checkAgainstJCS(t *testing.T, data []byte) {
	t.Helper()
	got, err := canonicalize(data)
	want, wantErr := oracleCanonical(data)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("canonical(%q): err = %v, jcs.Transform err = %v", data, err, wantErr)
	}
	if err == nil && !bytes.Equal(got, want) {
		t.Fatalf("canonical(%q) = %q, jcs.Transform = %q", data, got, want)
	}
	// A strict parser finds valid whatever is accepted, and the canonical
	// form is its own.
	if err == nil && len(trimJSONSpace(data)) > 0 && !json.Valid(data) {
		t.Fatalf("canonical(%q) accepted what encoding/json finds invalid", data)
	}
	if err == nil {
		if again, err := canonicalize(got); err != nil || !bytes.Equal(again, got) {
			t.Fatalf("canonical(%q) = %q, whose canonical form is %q, %v", data, got, again, err)
		}
	}

	d, err := ArgsDigest(data)
	old, oldErr := jcsArgsDigest(data)
	if err == nil {
		sum := sha256.Sum256(want)
		if want := "sha256:" + hex.EncodeToString(sum[:]); d != want {
			t.Fatalf("ArgsDigest(%q) = %s, want %s", data, d, want)
		}
	}
	// The one difference from ArgsDigest before canonical.go: it took
	// arguments that bytes.TrimSpace left empty or "null" for none, and
	// TrimSpace trims Unicode whitespace too ("\v", "\f", U+0085, U+00A0,
	// ...), which no JSON parser accepts. Such arguments are refused now.
	if (err == nil) != (oldErr == nil) || err == nil && d != old {
		trimmed := bytes.TrimSpace(data)
		unicodeSpaceNone := (len(trimmed) == 0 || string(trimmed) == "null") && wantErr != nil
		if !unicodeSpaceNone || err == nil || oldErr != nil {
			t.Fatalf("ArgsDigest(%q) = %q, %v; before canonical.go %q, %v", data, d, err, old, oldErr)
		}
	}
}

func TestCanonicalArgs(t *testing.T) {
	tests := []struct {
		in, want string // want "" means refused
	}{
		// No arguments.
		{``, `{}`},
		{" \t\r\n", `{}`},
		{`null`, `{}`},
		{" null\n", `{}`},
		{`"null"`, `"null"`},
		{`[null]`, `[null]`},
		// Whitespace: RFC 8259's four, nowhere inside a token.
		{"\t{\n\"b\" :\r[ 1 , 2 ]\n,\"a\":true }\n", `{"a":true,"b":[1,2]}`},
		{"\v{}", ``},
		{"\f{}", ``},
		{"\u00a0{}", ``},
		{"\u00a0null", ``},
		{"\v", ``},
		{"\xef\xbb\xbf{}", ``},
		{`[tr ue]`, ``},
		{`[1 2]`, ``},
		// Trailing data.
		{`{}x`, ``},
		{`{} {}`, ``},
		{"{}\x00", ``},
		{`1 2`, ``},
		{`"a""b"`, ``},
		// Structure.
		{`{"a":}`, ``},
		{`{"a" 1}`, ``},
		{`{"a":1,}`, ``},
		{`[1,]`, ``},
		{`[,]`, ``},
		{`[,1]`, ``},
		{`{,}`, ``},
		{`{1:2}`, ``},
		{`{'a':1}`, ``},
		{`[`, ``},
		{`{"a":1`, ``},
		{`{"a":1]`, ``},
		{`[1}`, ``},
		{`{"a":[]}`, `{"a":[]}`},
		// Literals.
		{`true`, `true`},
		{`nul`, ``},
		{`nulls`, ``},
		{`[truefalse]`, ``},
		{`[true"x"]`, ``},
		{`True`, ``},
		{`NaN`, ``},
		{`Infinity`, ``},
		{`-Infinity`, ``},
		// Numbers.
		{`40`, `40`},
		{`40.0`, `40`},
		{`4.50`, `4.5`},
		{`-0`, `0`},
		{`-0.0`, `0`},
		{`-0e5`, `0`},
		{`0e0`, `0`},
		{`1e21`, `1e+21`},
		{`1e20`, `100000000000000000000`},
		{`100000000000000000000`, `100000000000000000000`},
		{`999999999999999`, `999999999999999`},
		{`-999999999999999`, `-999999999999999`},
		{`9007199254740993`, `9007199254740992`},
		{`9007199254740992.0`, `9007199254740992`},
		{`9007199254740991.0`, `9007199254740991`},
		{`-9007199254740991e0`, `-9007199254740991`},
		{`4e3`, `4000`},
		{`1.5e1`, `15`},
		{`1e15`, `1000000000000000`},
		{`1e16`, `10000000000000000`},
		{`1000000000000000`, `1000000000000000`},
		{`123456789012345678901234567890`, `1.2345678901234568e+29`},
		{`0.000001`, `0.000001`},
		{`0.0000001`, `1e-7`},
		{`1E+2`, `100`},
		{`1e-400`, `0`},
		{`-1e-400`, `0`},
		{`5e-324`, `5e-324`},
		{`1.7976931348623157e308`, `1.7976931348623157e+308`},
		{`1.7976931348623159e308`, ``},
		{`1e400`, ``},
		{`-1e400`, ``},
		{`1` + strings.Repeat("0", 400), ``},
		{`01`, ``},
		{`-01`, ``},
		{`00`, ``},
		{`1.`, ``},
		{`.1`, ``},
		{`+1`, ``},
		{`-`, ``},
		{`1e`, ``},
		{`1e+`, ``},
		{`0x10`, ``},
		{`1_000`, ``},
		{`[1:2]`, ``},
		// Strings: escapes minimal, everything else literal UTF-8.
		{`"a\/b"`, `"a/b"`},
		{`"\u0041\u00e9\u00E9"`, `"Aéé"`},
		{`"\u0000\u0008\u0009\u000a\u000b\u000c\u000d\u001f\u0020"`, `"\u0000\b\t\n\u000b\f\r\u001f "`},
		{`"\u007f\u0080"`, "\"\u007f\u0080\""},
		{`"\"\\"`, `"\"\\"`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"\uD834\uDD1E"`, `"𝄞"`},
		{`"\uFFFF"`, "\"\uffff\""},
		{"\"\xef\xbf\xbd\"", "\"\ufffd\""},
		{`"\ud800"`, ``},
		{`"\udc00"`, ``},
		{`"\ud800\u0041"`, ``},
		{`"\ud800\ud800"`, ``},
		{`"\udc00\ud800"`, ``},
		{`"\ud800x"`, ``},
		{`"\u12"`, ``},
		{`"\u12g4"`, ``},
		{`"\u+123"`, ``},
		{`"\x41"`, ``},
		{`"\'"`, ``},
		{`"\`, ``},
		{`"abc`, ``},
		{"\"a\tb\"", ``},
		{"\"a\x00b\"", ``},
		{"\"\xff\"", ``},
		{"\"\xc0\xaf\"", ``},         // overlong
		{"\"\xed\xa0\x80\"", ``},     // a surrogate in UTF-8
		{"\"\xf4\x90\x80\x80\"", ``}, // past U+10FFFF
		{"\"\xe2\x82\"", ``},         // truncated
		{"[\"a\"\xe2]", ``},
		// Members: sorted by UTF-16 code units; no duplicates, even spelled
		// differently.
		{`{"b":1,"a":2,"c":{"z":0,"y":[{"q":1,"p":2}]}}`, `{"a":2,"b":1,"c":{"y":[{"p":2,"q":1}],"z":0}}`},
		{"{\"\ue000\":1,\"\U0001f600\":2,\"z\":3,\"\u00e9\":4}", "{\"z\":3,\"\u00e9\":4,\"\U0001f600\":2,\"\ue000\":1}"},
		{`{"aa":1,"a":2,"":3}`, `{"":3,"a":2,"aa":1}`},
		{`{"a":1,"a":2}`, ``},
		{`{"a":1,"\u0061":2}`, ``},
		{`{"\u00e9":1,"é":2}`, ``},
		{`{"a":{"b":1,"b":1}}`, ``},
		{`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"a":14}`, ``},
		// RFC 8785's own examples (section 3.2.3 and appendix).
		{`{"\u20ac":"Euro Sign","\r":"Carriage Return","\u000a":"Newline","1":"One","\u0080":"Control\u007f","\ud83d\ude02":"Smiley","\u00f6":"Latin Small Letter O With Diaeresis","\ufb33":"Hebrew Letter Dalet With Dagesh","</script>":"Browser Challenge"}`,
			"{\"\\n\":\"Newline\",\"\\r\":\"Carriage Return\",\"1\":\"One\",\"</script>\":\"Browser Challenge\",\"\u0080\":\"Control\u007f\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001f602\":\"Smiley\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`,
			`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
	}
	for _, tt := range tests {
		got, err := canonicalize([]byte(tt.in))
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("canonical(%q) = %q, want it refused", tt.in, got)
		case tt.want != "" && err != nil:
			t.Errorf("canonical(%q): %v, want %s", tt.in, err, tt.want)
		case tt.want != "" && string(got) != tt.want:
			t.Errorf("canonical(%q) = %s, want %s", tt.in, got, tt.want)
		}
		checkAgainstJCS(t, []byte(tt.in))
	}
}

// Nesting is bounded at jcs.Transform's depth, 10000, counting arrays and
// objects alike.
func TestCanonicalDepth(t *testing.T) {
	nest := func(depth int, open func(int) string) []byte {
		var b strings.Builder
		for i := range depth {
			b.WriteString(open(i))
		}
		b.WriteString("1")
		for i := depth - 1; i >= 0; i-- {
			if open(i) == "[" {
				b.WriteString("]")
			} else {
				b.WriteString("}")
			}
		}
		return []byte(b.String())
	}
	arrays := func(int) string { return "[" }
	objects := func(int) string { return `{"a":` }
	mixed := func(i int) string { return [...]string{"[", `{"a":`}[i%2] }
	for _, tt := range []struct {
		depth int
		ok    bool
	}{{maxCanonicalDepth, true}, {maxCanonicalDepth + 1, false}} {
		for _, open := range []func(int) string{arrays, objects, mixed} {
			doc := nest(tt.depth, open)
			_, err := canonicalize(doc)
			if (err == nil) != tt.ok {
				t.Errorf("depth %d (%.8s...): err = %v, want ok = %v", tt.depth, doc, err, tt.ok)
			}
			checkAgainstJCS(t, doc)
		}
	}
}

// compareUTF16 orders as RFC 8785 does: by UTF-16 code units.
func TestCompareUTF16(t *testing.T) {
	pool := []rune{0, 'A', 'a', 0x7f, 0x80, 0xe9, 0x7ff, 0x800, 0xd7ff, 0xe000, 0xfb33, 0xfffd, 0xffff, 0x10000, 0x1f600, 0x10ffff}
	r := rand.New(rand.NewPCG(1, 2))
	str := func() string {
		var b []rune
		for n := r.IntN(4); n > 0; n-- {
			b = append(b, pool[r.IntN(len(pool))])
		}
		return string(b)
	}
	sign := func(x int) int { return min(max(x, -1), 1) }
	for range 20000 {
		a, b := str(), str()
		want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		if got := sign(compareUTF16([]byte(a), []byte(b))); got != want {
			t.Fatalf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
		}
	}
}

// An ordinary call's digest allocates only the string it returns.
func TestArgsDigestAllocs(t *testing.T) {
	if raceEnabled() {
		t.Skip("the race detector allocates, and drops sync.Pool's items at random")
	}
	for _, args := range benchArgs {
		if _, err := ArgsDigest(args.json); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { ArgsDigest(args.json) }); n > float64(args.allocs) {
			t.Errorf("ArgsDigest(%s): %v allocations, want at most %d", args.name, n, args.allocs)
		}
	}
}

func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	return ok && slices.Contains(info.Settings, debug.BuildSetting{Key: "-race", Value: "true"})
}

// benchArgs are realistic tool arguments, with the allocations ArgsDigest
// may make on each: its result, and one per number jcs.NumberToJSON
// formats.
var benchArgs = []struct {
	name   string
	json   json.RawMessage
	allocs int
}{
	{"refund", refundCall.Arguments, 1},
	{"search", json.RawMessage(`{"query":"résumé \"senior\" engineer","filters":{"location":["Zürich","Remote"],"salary_min":90000,"posted_within_days":14},"limit":20,"include_archived":false}`), 1},
	{"write_file", json.RawMessage(`{"path":"/srv/app/config.yaml","content":"server:\n  port: 8080\n  tls: true\n\tname: \"api\"\n","mode":"0644","create_dirs":true}`), 1},
	{"nested", json.RawMessage(`{"z":{"y":{"x":[1,2,3,{"w":"v","u":null}]}},"items":[{"sku":"A-1","qty":2,"price":19.99},{"sku":"B-7","qty":1,"price":5.5}],"note":"\ud83d\ude00 ok","a":true}`), 3}, // 19.99 and 5.5
}

// realisticSeeds are tool arguments as agents send them.
var realisticSeeds = []string{
	`{"order_id":"A-100","amount":40,"reason_code":"duplicate_charge"}`,
	`{"reason_code":"duplicate_charge", "amount":40.0, "order_id":"A-100"}`,
	`{"query":"weather in Paris","units":"metric","days":3}`,
	`{"path":"/tmp/notes.txt","content":"line 1\nline 2\ttabbed \"quoted\" \\ backslash","append":false}`,
	`{"sql":"SELECT * FROM users WHERE id = $1","params":[42],"timeout_ms":1500.5}`,
	`{"to":["a@example.com","b@example.com"],"subject":"Réunion 📅","body":"Bonjour\r\n","cc":null}`,
	`{"filters":{"tags":["x","y"],"range":{"gte":-1.5e3,"lt":1E21}},"sort":[{"field":"date","desc":true}]}`,
	`{"messages":[{"role":"user","content":"\u00e9\u00e8\u00ea \u2028\u2029 \ud834\udd1e"}],"temperature":0.7,"max_tokens":1024}`,
	`{"weird":{"\u20ac":1,"\r":2,"\u000a":3,"1":4,"\u0080":5,"\ud83d\ude02":6,"\u00f6":7,"\ufb33":8,"</script>":9}}`,
	`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001]}`,
	`[56,{"d":true,"10":null,"1":[]}]`,
	`{"1":{"f":{"f":"hi","F":5},"\n":56.0},"10":{},"":"empty","a":{},"111":[{"e":"yes","E":"no"}],"A":{}}`,
}

// edgeSeeds are the edge cases of RFC 8785 and of jcs.Transform's parser.
var edgeSeeds = []string{
	``, ` `, `null`, ` null `, "\vnull", "\u00a0{}", "\xef\xbb\xbf{}", `"null"`,
	`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"\u00e9":1,"é":2}`,
	"{\"a\":\"\xff\"}", "\"\xed\xa0\x80\"", "\"\xc0\xaf\"", "\"\xf4\x90\x80\x80\"",
	`"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800\ud800"`, `"\ud83d\ude00"`, `"\uD834\uDD1E"`,
	`1e400`, `-1e400`, `1e-400`, `-0`, `-0.0`, `1e21`, `1e20`, `9007199254740993`, `123456789012345678901234567890`,
	`01`, `-01`, `1.`, `.1`, `+1`, `0x10`, `1_000`, `NaN`, `Infinity`,
	`{}x`, `{} {}`, "{}\x00", `1 2`, `[1,]`, `{"a":1,}`, `[,]`, `[tr ue]`, `[truefalse]`,
	"\t{\n\"b\" :\r[ 1 , 2 ]\n,\"a\":true }\n", "\f{}",
	`"\u0000\u001f\u007f\"\\\/\b\f\n\r\t"`,
	strings.Repeat("[", 64) + strings.Repeat("]", 64),
	strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64),
}

// FuzzArgsDigest holds canonical.go to jcs.Transform on any input: the
// same refusals, and byte-identical canonical forms (so the same digests).
// The one difference from ArgsDigest before it (jcsArgsDigest) is that
// arguments bytes.TrimSpace finds empty or null only by trimming Unicode
// whitespace that is not JSON's ("\v", "\f", U+0085, U+00A0, ...) used to
// count as none and are refused now, as jcs.Transform refuses them.
func FuzzArgsDigest(f *testing.F) {
	for _, s := range realisticSeeds {
		f.Add([]byte(s))
	}
	for _, s := range edgeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstJCS(t, data)
	})
}

// BenchmarkArgsDigest: jcs is ArgsDigest before canonical.go, ours after.
func BenchmarkArgsDigest(b *testing.B) {
	for _, args := range benchArgs {
		b.Run(args.name+"/jcs", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := jcsArgsDigest(args.json); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(args.name+"/ours", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ArgsDigest(args.json); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Random documents, valid and nearly valid, that byte mutation rarely
// reaches: large objects (sorted by the general sort), names that differ
// only past U+FFFF or only in how they are escaped, numbers in every
// spelling, whitespace everywhere.
func TestCanonicalRandomDocuments(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 8785))
	pieces := []string{"a", "b", "A", "é", `\u00e9`, `\u0061`, "\ue000", `\ue000`, "😀", `\ud83d\ude00`, "\U0001f602", `\ud83d\ude02`, `\n`, `\u001f`, `\/`, `\"`, `\\`, "\u007f", "z", ""}
	name := func() string {
		var b strings.Builder
		b.WriteByte('"')
		for n := r.IntN(4); n > 0; n-- {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		b.WriteByte('"')
		return b.String()
	}
	numbers := []string{"0", "-0", "1", "-1", "40", "40.0", "4.50", "1e21", "1E-7", "0.1", "-2.5e+3", "9007199254740993", "123456789012345678", "1e308", "5e-324", "1e-400", "0.000001", "100e-2"}
	ws := func() string { return [...]string{"", "", "", " ", "\n\t", "\r\n "}[r.IntN(6)] }
	var value func(depth int) string
	value = func(depth int) string {
		switch k := r.IntN(8); {
		case depth > 4 || k < 2:
			return numbers[r.IntN(len(numbers))]
		case k == 2:
			return [...]string{"true", "false", "null"}[r.IntN(3)]
		case k == 3:
			return name()
		case k == 4:
			var elems []string
			for n := r.IntN(5); n > 0; n-- {
				elems = append(elems, ws()+value(depth+1)+ws())
			}
			return "[" + strings.Join(elems, ",") + "]"
		default:
			var members []string
			for n := r.IntN(20 >> depth); n > 0; n-- {
				members = append(members, ws()+name()+ws()+":"+ws()+value(depth+1)+ws())
			}
			return "{" + strings.Join(members, ",") + "}"
		}
	}
	accepted := 0
	for range 5000 {
		doc := []byte(ws() + value(0) + ws())
		if _, err := jcs.Transform(doc); err == nil {
			accepted++
		}
		checkAgainstJCS(t, doc)
	}
	if accepted < 2000 {
		t.Errorf("only %d of 5000 random documents were valid", accepted)
	}
	t.Logf("%d of 5000 random documents were valid", accepted)
}
