package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/audit"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envelope"
)

var updateAudit = flag.Bool("update-audit", false, "rewrite testdata/audit from the golden trail's lines")

// goldenTrail is the trail in testdata/audit/trail.jsonl: six decisions,
// a checkpoint after the third, the shutdown checkpoint, signed with
// testdata/audit/key.pem under a fixed clock, so that it is the same byte
// for byte each time it is made.
func goldenTrail(t *testing.T) []string {
	t.Helper()
	keys, err := envelope.LoadKeys("testdata/audit/key.pem")
	if err != nil {
		t.Fatal(err)
	}
	sign, err := keys.Signer(audit.CheckpointType)
	if err != nil {
		t.Fatal(err)
	}
	return trailOf(t, audit.SignerFunc(sign))
}

// trailOf is the golden trail's lines with signer signing its
// checkpoints; nil leaves them unsigned, as capsnap without envelope keys
// writes them.
func trailOf(t *testing.T, signer audit.Signer) []string {
	t.Helper()
	var out bytes.Buffer
	tr := audit.NewTrail(&out, audit.TrailOptions{Signer: signer, Interval: time.Hour,
		Now: func() time.Time { return time.Date(2026, 3, 1, 12, 0, 5, 0, time.UTC) }})
	for i, tool := range []string{"lookup_order", "refund", "refund", "export_ledger", "refund", "lookup_order"} {
		decision, reason := "allow", "ok"
		if tool == "export_ledger" {
			decision, reason = "deny", "tool_not_granted"
		}
		line := fmt.Sprintf(`{"time":"2026-03-01T12:00:0%dZ","log":"audit","decision":%q,"reason":%q,"request_id":"req-%d","principal":"spiffe://acme/agent/support-refund","server_id":"billing","mcp_method":"tools/call","tool":%q,"message":"decision"}`+"\n",
			i, decision, reason, i, tool)
		if _, err := tr.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			if err := tr.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(out.String(), "\n")
	return lines[:len(lines)-1]
}

// The golden trail and the tamperings of it in testdata/audit. Lines:
// 1-3 decisions, 4 checkpoint, 5-7 decisions, 8 shutdown checkpoint.
func auditFiles(t *testing.T) map[string]string {
	t.Helper()
	trail := goldenTrail(t)
	join := func(lines ...string) string { return strings.Join(lines, "") }
	edited := append([]string(nil), trail...)
	edited[1] = strings.Replace(edited[1], `"decision":"allow"`, `"decision":"deny"`, 1)
	// The first checkpoint's signature, its first character changed.
	sig := regexp.MustCompile(`("jws":"[^".]*\.[^".]*\.)(.)`)
	forged := append([]string(nil), trail...)
	forged[3] = sig.ReplaceAllStringFunc(forged[3], func(s string) string {
		m := sig.FindStringSubmatch(s)
		if m[2] == "A" {
			return m[1] + "B"
		}
		return m[1] + "A"
	})
	return map[string]string{
		"trail.jsonl":     join(trail...),
		"deleted.jsonl":   join(append(trail[:1:1], trail[2:]...)...),
		"edited.jsonl":    join(edited...),
		"inserted.jsonl":  join(append(trail[:2:2], append([]string{`{"log":"audit","decision":"allow","tool":"refund"}` + "\n"}, trail[2:]...)...)...),
		"truncated.jsonl": join(trail[:6]...),
		"forged.jsonl":    join(forged...),
		"unsigned.jsonl":  join(trailOf(t, nil)...),
	}
}

// auditData holds the golden trail; verifyArgs are audit verify's
// arguments with its JWKS, for TestCommands.
const auditData = "testdata/audit/"

func verifyArgs(args ...string) []string {
	return append([]string{"audit", "verify", "--jwks", auditData + "jwks.json"}, args...)
}

func TestAuditGolden(t *testing.T) {
	files := auditFiles(t)
	for _, key := range []string{"key", "other-key"} {
		keys, err := envelope.LoadKeys(filepath.Join("testdata/audit", key+".pem"))
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimSuffix(key, "key")+"jwks.json"] = string(keys.JWKS()) + "\n"
	}
	for name, want := range files {
		path := filepath.Join("testdata/audit", name)
		if *updateAudit {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s is not what the trail writes today (go test -run TestAuditGolden -update-audit):\n got %s\nwant %s", path, got, want)
		}
	}
}

// serve's trail: restarted on the same file it continues the chain, signs
// with the envelope key, and verifies with the JWKS capsnap publishes.
func TestOpenAuditResumesAndSigns(t *testing.T) {
	keys, err := envelope.LoadKeys("testdata/audit/key.pem")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	for run := range 3 {
		auditLog, closeAudit, err := openAudit(config.Audit{Path: path}, nil, keys, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		for i := range run {
			auditLog.Log().Str("decision", "allow").Int("i", i).Msg("decision")
		}
		closeAudit()
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"audit", "verify", "--jwks", "testdata/audit/jwks.json", path}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, &stdout, &stderr)
	}
	if want := ": verified: 6 lines (last seq 6), 3 checkpoints"; !strings.Contains(stdout.String(), want) {
		t.Errorf("stdout %q, want %q: three runs, one chain", &stdout, want)
	}
}
