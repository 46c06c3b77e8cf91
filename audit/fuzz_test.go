package audit

import (
	"bytes"
	"crypto/sha256"
	"strings"
	"testing"
)

// parseLink, the verifier's line parser, accepts exactly what the trail
// writes: a line it accepts is the trail's line for the object without
// the chain members, and every object the trail links parses back to its
// link and object.
func FuzzParseLine(f *testing.F) {
	signer, _ := testKey(f, 1, "k1")
	for _, l := range sampleTrail(f, signer) {
		f.Add([]byte(strings.TrimSuffix(l, "\n")))
	}
	for _, s := range []string{
		"{}", "{ }", `{"a":1}`, `{"a":1,}`, `{,}`,
		`{"chain_seq":1,"chain_prev":"sha256:` + strings.Repeat("0", 64) + `"}`,
		`{,"chain_seq":1,"chain_prev":"sha256:` + strings.Repeat("0", 64) + `"}`,
		`{"a":1,"chain_seq":01,"chain_prev":"sha256:` + strings.Repeat("0", 64) + `"}`,
		`{"a":1,"chain_seq":18446744073709551616,"chain_prev":"sha256:` + strings.Repeat("0", 64) + `"}`,
		`{"a":1,"chain_seq":2,"chain_prev":"sha256:` + strings.Repeat("A", 64) + `"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		if seq, prev, ok := parseLink(line); ok {
			if seq == 0 {
				t.Fatalf("parseLink(%q) accepted seq 0, which no trail writes", line)
			}
			again := appendLinked(nil, unlinked(line), Link{Seq: seq - 1, Hash: prev})
			if !bytes.Equal(again, line) {
				t.Fatalf("parseLink(%q) = %d, %x; the trail writes that as %q", line, seq, prev, again)
			}
		}
		if len(line) < 2 || line[0] != '{' || line[len(line)-1] != '}' || bytes.IndexByte(line, '\n') >= 0 {
			return
		}
		l := Link{Seq: uint64(len(line)), Hash: sha256.Sum256(line)}
		linked := appendLinked(nil, line, l)
		seq, prev, ok := parseLink(linked)
		if !ok || seq != l.Seq+1 || prev != l.Hash {
			t.Fatalf("the trail's line %q parses as %d, %x, %v", linked, seq, prev, ok)
		}
		if back := unlinked(linked); !bytes.Equal(back, line) {
			t.Fatalf("the trail's line %q unlinks to %q, not %q", linked, back, line)
		}
	})
}

// Verify never panics, and a trail it passes ends with its shutdown
// checkpoint.
func FuzzVerify(f *testing.F) {
	signer, keys := testKey(f, 1, "k1")
	trail := sampleTrail(f, signer)
	f.Add([]byte(strings.Join(trail, "")))
	f.Add([]byte(strings.Join(without(trail, 6), "")))
	f.Add([]byte(strings.Join(trail[:12], "")))
	f.Add([]byte(strings.Join(append(trail[:15:15], trail...), "")))
	f.Add([]byte(strings.Join(sampleTrail(f, nil), "")))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := Verify(VerifyOptions{Keys: keys}, Input{Name: "fuzz", R: bytes.NewReader(data)})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Problem != nil {
			return
		}
		lines := strings.SplitAfter(string(data), "\n")
		last := lines[len(lines)-2]
		if lines[len(lines)-1] != "" || !rep.Final || !strings.HasPrefix(last, checkpointPrefix) || !strings.Contains(last, `"final":true`) {
			t.Fatalf("verified %+v, but does not end with a shutdown checkpoint:\n%s", rep, data)
		}
	})
}
