package audit

import (
	"crypto/sha256"
	"encoding"
	"hash"
	"testing"
	"time"
)

// benchLine is an allowed tools/call's audit line, as zerolog writes it.
var benchLine = []byte(`{"time":"2026-03-01T12:00:00Z","log":"audit","decision":"allow","reason":"ok","request_id":"6f1c2b7e-0d4a-4c53-9a57-3f0e2d8b1c44","principal":"spiffe://acme/agent/support-refund","server_id":"billing","mcp_method":"tools/call","protocol_version":"2025-11-25","latency_us":38,"jsonrpc_id":7,"tool":"refund","arguments_digest":"sha256:4f2b1c0e9a7d6e5f4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291807f6e5d","epoch":"e-2f9c","valid_until":"2026-03-01T12:05:00Z","snapshot_digest":"sha256:0b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c","live_digest":"sha256:0b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c","effect_class":"money_move","policy_digest":"sha256:9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b","message":"decision"}` + "\n")

// BenchmarkLink is the chain's work on one line, in its two parts: what a
// Write does in its own goroutine, in parallel with the others (begin:
// hash the line up to where its chain members go), and what the goroutine
// writing the batch does for each line in turn (finish: copy the line,
// add its members, finish its hash with them; this includes restoring a
// begun hash, some 30 ns, which the trail does not do). whole is both on
// one goroutine.
func BenchmarkLink(b *testing.B) {
	obj := benchLine[:len(benchLine)-1]
	prefix := obj[:linkPrefix(obj)-1]
	begin := func() hash.Hash {
		d := sha256.New()
		d.Write(prefix)
		d.Write(comma)
		return d
	}
	b.Run("begin", func(b *testing.B) {
		d := sha256.New()
		b.SetBytes(int64(len(obj)))
		b.ReportAllocs()
		for b.Loop() {
			d.Reset()
			d.Write(prefix)
			d.Write(comma)
		}
	})
	b.Run("finish", func(b *testing.B) {
		state, err := begin().(encoding.BinaryMarshaler).MarshalBinary()
		if err != nil {
			b.Fatal(err)
		}
		t, d, out := &Trail{}, sha256.New(), make([]byte, 0, 4096)
		b.SetBytes(int64(len(obj)))
		b.ReportAllocs()
		for b.Loop() {
			if err := d.(encoding.BinaryUnmarshaler).UnmarshalBinary(state); err != nil {
				b.Fatal(err)
			}
			out = t.link(out[:0], obj, d)
		}
	})
	b.Run("whole", func(b *testing.B) {
		t, out := &Trail{}, make([]byte, 0, 4096)
		b.SetBytes(int64(len(obj)))
		b.ReportAllocs()
		for b.Loop() {
			out = t.link(out[:0], obj, nil)
		}
	})
}

// BenchmarkCheckpoint is one signed checkpoint: its payload, an Ed25519
// signature and its line, once per interval.
func BenchmarkCheckpoint(b *testing.B) {
	signer, _ := testKey(b, 1, "k1")
	t := &Trail{signer: signer, interval: DefaultCheckpointInterval, now: time.Now}
	b.ReportAllocs()
	for b.Loop() {
		t.checkpoint(false)
	}
}
