package mcpparse

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestFramingOf reads the golden table testdata/framings.txt: each
// Content-Type and the framing it must be read as.
func TestFramingOf(t *testing.T) {
	f, err := os.Open("testdata/framings.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		quoted, want, ok := strings.Cut(line, "\t")
		ct, err := strconv.Unquote(quoted)
		if !ok || err != nil {
			t.Fatalf("testdata/framings.txt: %q is not a quoted Content-Type, a tab and a framing", line)
		}
		if got := FramingOf(ct).String(); got != want {
			t.Errorf("FramingOf(%q) = %s, want %s", ct, got, want)
		}
		n++
	}
	if err := sc.Err(); err != nil || n == 0 {
		t.Fatalf("read %d framings: %v", n, err)
	}
}

// OtherMayName finds a name wherever some client's reading of a body of
// another framing could find it, and nowhere else: an error page passes.
func TestOtherMayName(t *testing.T) {
	const listing = `{"jsonrpc":"2.0","id":2,"result":{"tools":[]}}`
	tests := []struct {
		name, ct, body string
		want           bool
	}{
		{"events as text/plain", "text/plain", "data: " + listing + "\n\n", true},
		{"JSON named by the type", "application/jsonp", listing, true},
		{"a data field after a byte order mark", "", "\ufeffdata: " + listing + "\n\n", true},
		{"a data field after a mis-decoded one", "", "\u00ef\u00bb\u00bfdata: " + listing + "\n\n", true},
		{"a data field with space around it", "", " Data : " + listing + "\n\n", true},
		{"a data line Go reads across a CR", "text/plain", "data: x\rtools\n\n", true},
		{"events in UTF-16", "text/event-stream; charset=utf-16le", utf16LE("data: " + listing + "\n\n"), true},
		// UTF-7 spells tools "+AHQAbwBvAGwAcw-": a charset capsnap cannot
		// decode, or cannot tell for certain, may name anything.
		{"a charset* Python decodes", "text/event-stream; charset*=utf-7", `data: {"result":{"+AHQAbwBvAGwAcw-":[]}}` + "\n\n", true},
		{"a charset named twice", "text/event-stream; xcharset=utf-8; charset=utf-7; @", `data: {"result":{"+AHQAbwBvAGwAcw-":[]}}` + "\n\n", true},
		{"an unknown charset", "text/plain; charset=cp037", "x", true},

		{"a plain-text error with a backslash", "text/plain", "Database error: cannot open C:\\srv\\db\n", false},
		{"problem+json with an escape", "application/problem+json", `{"title":"Bad Gateway","detail":"upstream said \"no\" about tools"}`, false},
		{"HTML with data attributes", "text/html", "<p data-x=\"1\">Error: see C:\\logs, no tools</p>\n", false},
		{"a blank body of an unknown charset", "text/plain; charset=cp037", " \n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := OtherMayName(tt.ct, []byte(tt.body), "tools"); got != tt.want {
				t.Errorf("OtherMayName(%q, %q) = %v, want %v", tt.ct, tt.body, got, tt.want)
			}
		})
	}
}

// A listing's own answer in a charset Python finds and Go's parser does
// not is not read as UTF-8, and carries a result for CarriesResult.
func TestCharsetStarIsNotRead(t *testing.T) {
	const ct = "text/event-stream; charset*=utf-7"
	body := `data: {"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"benign","inputSchema":{"type":"object"}}],"+AHQAbwBvAGwAcw-":[{"name":"evil","inputSchema":{"type":"object"}}]}}` + "\n\n"
	if d, err := ReadDelivery(ct, []byte(body), []byte("1"), 0); err == nil {
		t.Fatalf("ReadDelivery read %d tools from a body Python decodes as UTF-7 to others", len(d.Tools))
	}
	hidden := []byte(`data: {"jsonrpc":"2.0","id":1,"+AHI-esult":{"+AHQAbwBvAGwAcw-":[]}}` + "\n\n")
	if !CarriesResult(ct, "", hidden, 0) {
		t.Fatal("CarriesResult = false for a body Python decodes (charset utf-7) to a result")
	}
}
