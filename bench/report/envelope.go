package report

import (
	"fmt"
	"strings"
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
)

// CapsnapEnvelope is capsnap signing the envelope of every allowed call
// (envelope.key_files set), run in the same turns as Servers; the main
// gRPC tables leave it out, the envelope's section compares it with
// Capsnap.
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
	BenchSealArgsDigest   = "BenchmarkSealParts/ArgsDigest"
	BenchSeal             = "BenchmarkSealParts/Seal"
	BenchCheckGrant       = "BenchmarkCheckEnvelope/grant"
	BenchGrantMint        = "BenchmarkGrant/Grant"
	BenchGrantSeal        = "BenchmarkGrant/Seal"
)

// inProcess is what the envelope costs the allowed Check in process.
type inProcess struct {
	Rows                        [][]string
	Added, AddedAllocs, Off, On string
	Grant                       *grantCost
	// Parts are the shares of the added time: the signature, the rest of
	// the seal, the arguments' digest, the rest outside the seal.
	Parts   []string
	Largest string
}

// grantCost is what the envelope under a grant adds to the allowed Check
// (Check, against off), what sealing one call and minting one grant cost.
type grantCost struct{ Added, Check, Seal, Mint string }

// EnvelopeInProcess is nil unless BenchmarkCheckEnvelope ran; its parts
// are nil unless BenchmarkSealParts ran.
func (v view) EnvelopeInProcess() *inProcess {
	find := func(name string) (gobench.Result, bool) { return gobench.Find(v.HotPath, name) }
	off, okOff := find(BenchCheckEnvelopeOff)
	on, okOn := find(BenchCheckEnvelopeOn)
	if !okOff || !okOn {
		return nil
	}
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
	added := on.Metrics["ns/op"] - off.Metrics["ns/op"]
	e := &inProcess{
		Rows:  append([][]string{{"envelope off", nsop(off), metric(off, "B/op"), metric(off, "allocs/op")}}, vsOff("envelope on", on)...),
		Added: signed(time.Duration(added)), AddedAllocs: diff(on, "allocs/op"), Off: nsop(off), On: nsop(on),
	}
	grant, okGrant := find(BenchCheckGrant)
	if okGrant {
		e.Rows = append(e.Rows, vsOff("under a grant", grant)...)
	}
	mint, okMint := find(BenchGrantMint)
	callSeal, okCallSeal := find(BenchGrantSeal)
	if okGrant && okMint && okCallSeal {
		e.Grant = &grantCost{signed(time.Duration(grant.Metrics["ns/op"] - off.Metrics["ns/op"])), nsop(grant), nsop(callSeal), nsop(mint)}
	}
	sign, okSign := find(BenchSealSign)
	seal, okSeal := find(BenchSeal)
	digest, okDigest := find(BenchSealArgsDigest)
	if okSign && okSeal && okDigest && added > 0 {
		share := func(ns float64) string {
			return fmt.Sprintf("%s, %.0f%%", Dur(time.Duration(ns)), 100*ns/added)
		}
		sg, sl, dg := sign.Metrics["ns/op"], seal.Metrics["ns/op"], digest.Metrics["ns/op"]
		e.Parts, e.Largest = []string{share(sg), share(sl - sg), share(dg), share(added - sl - dg)}, "most"
		if sg < added/2 {
			e.Largest = "the largest part"
		}
	}
	return e
}

// overGRPC is what the envelope costs the allowed Check over gRPC.
type overGRPC struct {
	Rows    [][]string
	Summary string
}

// EnvelopeOverGRPC is nil unless a capsnap with the envelope ran beside
// capsnap without it.
func (v view) EnvelopeOverGRPC() *overGRPC {
	var g overGRPC
	var summary []string
	for _, form := range []struct{ server, name string }{{CapsnapEnvelope, "signed whole"}, {CapsnapGrant, "under a grant"}} {
		var added, through []string
		for _, c := range v.Method.Concurrencies {
			x, ok1 := v.Run(Capsnap, c)
			y, ok2 := v.Run(form.server, c)
			if !ok1 || !ok2 {
				continue
			}
			g.Rows = append(g.Rows, []string{fmt.Sprint(c), form.name,
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
	if len(g.Rows) == 0 {
		return nil
	}
	g.Summary = strings.Join(summary, "; ")
	return &g
}
