package grpcload

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// script writes an executable shell script that stands in for checkload.
func script(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "checkload")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every way a load process can fail is a failed run, never a shorter or
// emptier one.
func TestRunDo(t *testing.T) {
	three, err := json.Marshal(Result{Total: time.Second, Latencies: []time.Duration{1, 2, 3}, Codes: map[string]int{"OK": 3}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, body string
		total      int
		want       string // "" succeeds
	}{
		{"all made", "echo '" + string(three) + "'", 3, ""},
		{"fewer made than asked", "echo '" + string(three) + "'", 4, "made 3 of 4 requests"},
		{"an exit status", "echo refused >&2; exit 1", 3, "refused"},
		{"not JSON", "echo Summary", 3, "load result"},
		{"past the deadline", "sleep 5", 3, "3 requests not done within"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := Run{Bin: script(t, tt.body), Data: "req.json", Target: "127.0.0.1:1", Concurrency: 1, Total: tt.total, Deadline: 500 * time.Millisecond}
			rep, err := r.Do(context.Background())
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Do: %v", err)
			case tt.want == "" && (rep.Count != 3 || rep.P50 != 2):
				t.Fatalf("report %+v", rep)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Do = %v, want an error with %q", err, tt.want)
			}
		})
	}
}
