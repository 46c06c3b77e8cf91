package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
)

// CapsnapEnvelope is capsnap signing the envelope of every allowed call
// (envelope.key_files set), run in the same turns as Servers; the main
// gRPC tables and the chart leave it out, the envelope's section compares
// it with Capsnap.
const CapsnapEnvelope = "capsnap + envelope"

// CapsnapGrant is capsnap sending envelopes under a grant (the server's
// servers[].grant_key_file set too), run like CapsnapEnvelope.
const CapsnapGrant = "capsnap + envelope under a grant"

// The Go benchmarks of the envelope's cost: the allowed Check without and
// with it (decide), and the parts of one seal (envelope).
const (
	BenchCheckEnvelopeOff = "BenchmarkCheckEnvelope/off"
	BenchCheckEnvelopeOn  = "BenchmarkCheckEnvelope/on"
	BenchSealSign         = "BenchmarkSealParts/ed25519.Sign"
	BenchSealJOSE         = "BenchmarkSealParts/jose.Sign"
	BenchSealArgsDigest   = "BenchmarkSealParts/ArgsDigest"
	BenchSeal             = "BenchmarkSealParts/Seal"
	BenchCheckGrant       = "BenchmarkCheckEnvelope/grant"
	BenchGrantMint        = "BenchmarkGrant/Grant"
	BenchGrantSeal        = "BenchmarkGrant/Seal"
)

// EnvelopeCost is what the envelope adds to one allowed Check in process:
// ns/op, B/op and allocs/op, on less off; ok is false if either did not
// run.
func EnvelopeCost(hot []gobench.Result) (off, on gobench.Result, ok bool) {
	off, ok1 := gobench.Find(hot, BenchCheckEnvelopeOff)
	on, ok2 := gobench.Find(hot, BenchCheckEnvelopeOn)
	return off, on, ok1 && ok2
}

func envelopeSection(b *strings.Builder, r *Results) {
	fmt.Fprintf(b, "## Signed envelope (issue 16)\n\n")
	fmt.Fprintf(b, "On every allowed `tools/call` capsnap can sign an envelope for the MCP server (`docs/ENVELOPE.md`): a compact JWS, EdDSA (Ed25519), binding the snapshot's pins, the principal, the digest of the call's arguments and its request id. "+
		"For a server with a grant key (`servers[].grant_key_file`) the envelope comes under a grant: what is the same for every call of a tool under a snapshot is signed once, in the grant, with a fresh call key encrypted to the server, and each call is bound by an HMAC under that key. "+
		"What it costs the allowed Check, without it (`envelope` unset), signed whole (`envelope.key_files`: one Ed25519 key) and under a grant (and a P-256 grant key for the server), in process and over gRPC.\n\n")

	fmt.Fprintf(b, "### In process (`BenchmarkCheckEnvelope`, `decide`)\n\n")
	off, on, ok := EnvelopeCost(r.HotPath)
	if !ok {
		fmt.Fprintf(b, "Not run: no %s and %s among the hot path's results.\n", BenchCheckEnvelopeOff, BenchCheckEnvelopeOn)
	} else {
		fmt.Fprintf(b, "BenchmarkCheckAllowed's refund, decided by the same decision core without and with an envelope key.\n\n")
		diff := func(x gobench.Result, unit string) string {
			return fmt.Sprintf("%+.0f", x.Metrics[unit]-off.Metrics[unit])
		}
		// vsOff is x's row, and x against off.
		vsOff := func(label string, x gobench.Result) [][]string {
			return [][]string{
				{label, nsop(x), metric(x, "B/op"), metric(x, "allocs/op")},
				{label + " − off", signed(time.Duration(x.Metrics["ns/op"] - off.Metrics["ns/op"])), diff(x, "B/op"), diff(x, "allocs/op")},
				{label + " ÷ off", ratioOf(x.Metrics["ns/op"], off.Metrics["ns/op"]), ratioOf(x.Metrics["B/op"], off.Metrics["B/op"]), ratioOf(x.Metrics["allocs/op"], off.Metrics["allocs/op"])},
			}
		}
		rows := append([][]string{{"envelope off", nsop(off), metric(off, "B/op"), metric(off, "allocs/op")}}, vsOff("envelope on", on)...)
		grant, okGrant := gobench.Find(r.HotPath, BenchCheckGrant)
		if okGrant {
			rows = append(rows, vsOff("under a grant", grant)...)
		}
		table(b, []string{"allowed Check", "per Check", "B/op", "allocs/op"}, rows)
		added := on.Metrics["ns/op"] - off.Metrics["ns/op"]
		fmt.Fprintf(b, "\nThe envelope signed whole adds %s and %s allocations to each allowed Check in process (%s → %s).",
			signed(time.Duration(added)), diff(on, "allocs/op"), nsop(off), nsop(on))
		mint, okMint := gobench.Find(r.HotPath, BenchGrantMint)
		callSeal, okCallSeal := gobench.Find(r.HotPath, BenchGrantSeal)
		if okGrant && okMint && okCallSeal {
			fmt.Fprintf(b, " Under a grant it adds %s (%s → %s): sealing one call's envelope under its grant (`%s`) is %s, and minting the grant (`%s`: the call key, its ECDH-ES encryption to the server, the Ed25519 signature), once per snapshot and tool, %s.",
				signed(time.Duration(grant.Metrics["ns/op"]-off.Metrics["ns/op"])), nsop(off), nsop(grant),
				BenchGrantSeal, nsop(callSeal), BenchGrantMint, nsop(mint))
		}
		fmt.Fprintf(b, " Signed whole, the signature covers each call's own arguments, request id and `jti`, so each allowed call pays for one.")
		sign, okSign := gobench.Find(r.HotPath, BenchSealSign)
		seal, okSeal := gobench.Find(r.HotPath, BenchSeal)
		digest, okDigest := gobench.Find(r.HotPath, BenchSealArgsDigest)
		if okSign && okSeal && okDigest && added > 0 {
			share := func(ns float64) string {
				return fmt.Sprintf("%s, %.0f%%", Dur(time.Duration(ns)), 100*ns/added)
			}
			sg, sl, dg := sign.Metrics["ns/op"], seal.Metrics["ns/op"], digest.Metrics["ns/op"]
			rows := [][]string{
				{"the Ed25519 signature of the envelope (`" + BenchSealSign + "`)", share(sg)},
				{"the rest of the seal: the claims' JSON encoding, the JWS header, base64url (`" + BenchSeal + "` less the signature)", share(sl - sg)},
				{"the arguments' canonical digest: RFC 8785 form and SHA-256 (`" + BenchSealArgsDigest + "`)", share(dg)},
				{"the rest, outside the seal: gathering the claims, the answer's extra header, the garbage of the extra allocations", share(added - sl - dg)},
			}
			fmt.Fprintf(b, " Where the added time goes, from `BenchmarkSealParts` (`envelope`) in the same run:\n\n")
			table(b, []string{"part of the envelope", "per Check, share of the added time"}, rows)
			largest := "most"
			if sg < added/2 {
				largest = "the largest part"
			}
			fmt.Fprintf(b, "\nThe Ed25519 signature of each call's envelope is %s of it (%s); the claims' encoding and the arguments' canonical digest are the rest.\n", largest, share(sg))
		} else {
			fmt.Fprintf(b, " (`BenchmarkSealParts` did not run: the parts are not shown.)\n")
		}
	}

	fmt.Fprintf(b, "\n### Over gRPC\n\n")
	var rows [][]string
	var summary []string
	for _, form := range []struct{ server, name string }{{CapsnapEnvelope, "signed whole"}, {CapsnapGrant, "under a grant"}} {
		var added, through []string
		for _, c := range r.Method.Concurrencies {
			x, ok1 := r.Run(Capsnap, c)
			y, ok2 := r.Run(form.server, c)
			if !ok1 || !ok2 {
				continue
			}
			rows = append(rows, []string{fmt.Sprint(c), form.name,
				fmt.Sprintf("%.0f", x.RPS), fmt.Sprintf("%.0f", y.RPS), ratioOf(y.RPS, x.RPS),
				Dur(x.P50), Dur(y.P50), signed(y.P50 - x.P50),
				Dur(x.P99), Dur(y.P99), signed(y.P99 - x.P99),
				Dur(x.CPUPerCheck), Dur(y.CPUPerCheck), signed(y.CPUPerCheck - x.CPUPerCheck)})
			added = append(added, fmt.Sprintf("%s at c=%d", signed(y.CPUPerCheck-x.CPUPerCheck), c))
			through = append(through, fmt.Sprintf("%s at c=%d", ratioOf(y.RPS, x.RPS), c))
		}
		if len(added) > 0 {
			summary = append(summary, fmt.Sprintf("%s, the envelope adds %s of server CPU per allowed Check, and capsnap with it makes %s the Checks per second it makes without",
				form.name, strings.Join(added, ", "), strings.Join(through, ", ")))
		}
	}
	if len(rows) == 0 {
		fmt.Fprintf(b, "Not run.\n")
		return
	}
	fmt.Fprintf(b, "Two more capsnaps, the same configuration but for `envelope.key_files` (a fresh Ed25519 key), and for the second also billing's `grant_key_file` (a fresh P-256 key), took their turns with the servers of [Check over gRPC](#check-over-grpc), each on its own snapshot of the same catalog, with the same request; "+
		"before their runs, an allowed Check must carry an `%s` header in its answer (and, under a grant, an `%s`), or the benchmark fails. Off is capsnap of that section.\n\n", "x-capsnap-envelope", "x-capsnap-grant")
	table(b, []string{"concurrency", "envelope", "Checks/s off", "Checks/s on", "on ÷ off", "p50 off", "p50 on", "added p50", "p99 off", "p99 on", "added p99", "CPU/Check off", "CPU/Check on", "added CPU/Check"}, rows)
	fmt.Fprintf(b, "\nOver gRPC (server CPU is utime + stime over the turns, good to a clock tick per turn; the in-process figures above are the sharper ones): %s.", strings.Join(summary, "; "))
	if r.EnvelopeHeaderBytes > 0 {
		fmt.Fprintf(b, " Each allowed answer also carries the envelope's header, %s bytes of JWS in this run signed whole", thousands(r.EnvelopeHeaderBytes))
		if r.GrantHeaderBytes > 0 {
			fmt.Fprintf(b, "; under a grant, %s bytes of envelope and %s of grant", thousands(r.GrantEnvelopeHeaderBytes), thousands(r.GrantHeaderBytes))
		}
		fmt.Fprintf(b, ".")
	}
	fmt.Fprintf(b, "\n")
}

// ratioOf is a ÷ b as "1.23×", or "–" if b is zero.
func ratioOf(a, b float64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
