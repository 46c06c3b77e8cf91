package decide

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

// hostileCase is one file of testdata/hostile: a request a hostile or
// careless client might send, and what capsnap must answer.
type hostileCase struct {
	Name    string            `json:"name"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
	// BodyB64 holds a body that is not valid UTF-8 (or starts with a BOM).
	BodyB64 string `json:"body_b64"`
	// Expect is a deny.Reason, or "allow" for a case that is harmless
	// (Note says why).
	Expect string `json:"expect"`
	Note   string `json:"note"`
	// Principal is the mTLS peer; absent means the support agent, "" no
	// peer at all.
	Principal *string `json:"principal"`
	// Tool is what an allowed tools/call must pin in x-capsnap-tool.
	Tool string `json:"tool"`
	// NoList skips the tools/list that otherwise mints the snapshot first.
	NoList bool `json:"no_list"`
	// GRPCOnly says why the case cannot run through the e2e stack.
	GRPCOnly string `json:"grpc_only"`
	// EnvoyStatus is the status Envoy itself answers with before capsnap
	// sees the request (e.g. 413 over max_request_bytes).
	EnvoyStatus int `json:"envoy_status"`
	// HarmlessSDKError marks an allowed body that the Go SDK server
	// answers with a JSON-RPC error instead of running a tool.
	HarmlessSDKError bool `json:"harmless_sdk_error"`
	Batch            bool `json:"batch"`
}

func (c hostileCase) bytes(t testing.TB) []byte {
	if c.BodyB64 != "" {
		b, err := base64.StdEncoding.DecodeString(c.BodyB64)
		if err != nil {
			t.Fatalf("%s: body_b64: %v", c.Name, err)
		}
		return b
	}
	return []byte(c.Body)
}

func (c hostileCase) principal() string {
	if c.Principal == nil {
		return support
	}
	return *c.Principal
}

func loadHostile(t testing.TB) []hostileCase {
	t.Helper()
	files, err := filepath.Glob("testdata/hostile/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no hostile corpus: %v", err)
	}
	var cases []hostileCase
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var c hostileCase
		if err := json.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if c.Name+".json" != filepath.Base(file) || c.Expect == "" || c.Note == "" {
			t.Fatalf("%s: needs a name matching the file, an expect and a note", file)
		}
		cases = append(cases, c)
	}
	return cases
}

// TestHostileCorpus runs every case of testdata/hostile at capsnap's gRPC
// interface, after the same principal listed tools (so a body that parses
// reaches the snapshot checks), and holds it to its expected reason. An
// allowed case must pin the tool it names; no denied case may be allowed.
func TestHostileCorpus(t *testing.T) {
	for _, c := range loadHostile(t) {
		t.Run(c.Name, func(t *testing.T) {
			f := newFixture(t)
			if !c.NoList && c.principal() != "" {
				f.list(t, c.principal(), "billing", nil)
			}
			req := checkCase{Name: c.Name, Principal: c.principal(), Headers: c.Headers}.request()
			req.Attributes.Request.Http.RawBody = c.bytes(t)
			resp, err := f.Check(t.Context(), req)
			if err != nil {
				t.Fatalf("Check returned a gRPC error: %v", err)
			}
			if ok := resp.GetOkResponse(); ok != nil {
				if c.Expect != "allow" {
					t.Fatalf("ALLOWED, want %s (%s)", c.Expect, c.Note)
				}
				up := map[string]string{}
				for _, h := range ok.Headers {
					up[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
				}
				if up[HeaderTool] != c.Tool {
					t.Fatalf("upstream %s = %q, want %q", HeaderTool, up[HeaderTool], c.Tool)
				}
				if c.Tool != "" && up[HeaderPrincipal] != c.principal() {
					t.Fatalf("upstream %s = %q, want %q", HeaderPrincipal, up[HeaderPrincipal], c.principal())
				}
				// Every x-capsnap-* header the client sent is either
				// overwritten by capsnap or removed.
				removed := map[string]bool{}
				for _, k := range ok.HeadersToRemove {
					removed[k] = true
				}
				for k, v := range c.Headers {
					if !strings.HasPrefix(k, HeaderPrefix) {
						continue
					}
					if got, set := up[k]; set {
						if got == v && k != HeaderEpoch {
							t.Errorf("client header %s: %q reaches the upstream as sent", k, v)
						}
					} else if !removed[k] {
						t.Errorf("client header %s is neither overwritten nor removed", k)
					}
				}
				return
			}
			var got deny.Reason
			for _, h := range resp.GetDeniedResponse().Headers {
				if h.GetHeader().GetKey() == HeaderReason {
					got = deny.Reason(h.GetHeader().GetValue())
				}
			}
			if string(got) != c.Expect {
				t.Fatalf("denied with %q, want %s (%s)\nbody: %s", got, c.Expect, c.Note, resp.GetDeniedResponse().GetBody())
			}
		})
	}
}
