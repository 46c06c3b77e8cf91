// Package report holds what one make bench run measured, judges it against
// the targets of issues 17 and 7, and renders it: BENCHMARKS.md and
// results.json.
package report

import (
	"time"

	"github.com/capsnap/capsnap/bench/gobench"
	"github.com/capsnap/capsnap/bench/grpcload"
	"github.com/capsnap/capsnap/bench/mcpload"
	"github.com/capsnap/capsnap/bench/proc"
)

// The servers behind the Check over gRPC, as the report names them.
const (
	Capsnap = "capsnap"
	Floor   = "floor (noop)"
	OPA     = "OPA-Envoy"
)

// Servers is the order servers are run and shown in.
var Servers = []string{Capsnap, Floor, OPA}

// The modes of the load through Envoy. ModeFloor's Envoy skips the
// ext_proc filter, which capsnap's runs on every answer; ModeFloorExtProc
// runs both filters as capsnap's does, with the floor behind both: what
// the transport costs, capsnap's work left out.
const (
	ModeNone         = "no ext_authz"
	ModeFloor        = "ext_authz → floor"
	ModeFloorExtProc = "ext_authz + ext_proc → floor"
	ModeCapsnap      = "ext_authz → capsnap"
)

// Modes is the order modes are run and shown in.
var Modes = []string{ModeNone, ModeFloor, ModeFloorExtProc, ModeCapsnap}

// The modes of the load through Envoy on the shared snapshot store (issue
// 15): capsnap on Redis, one replica and two behind one cluster.
const (
	ModeRedis    = "ext_authz → capsnap on Redis"
	ModeReplicas = "ext_authz → 2 capsnaps on Redis"
)

// StoreModes run in the same turns as Modes, after them.
var StoreModes = []string{ModeRedis, ModeReplicas}

// Results is one run of make bench.
type Results struct {
	Started time.Time     `json:"started"`
	Elapsed time.Duration `json:"elapsed_ns"`
	Machine Machine       `json:"machine"`
	// Method holds the run's parameters, for the report's method section.
	Method       Method           `json:"method"`
	GRPC         []GRPCRun        `json:"grpc"`
	Envoy        []EnvoyRun       `json:"envoy"`
	Scale        []gobench.Result `json:"scale"`
	HotPath      []gobench.Result `json:"hot_path"`
	Invalidation Invalidation     `json:"invalidation"`
	// Delivery is tools/list through the response path, against the
	// same Envoy without it.
	Delivery Delivery `json:"delivery"`
	// Store is the shared snapshot store's figures (issue 15).
	Store Store `json:"store"`
	// EnvelopeHeaderBytes is the size of the x-capsnap-envelope header on
	// the allowed Check of capsnap with the envelope on (CapsnapEnvelope).
	EnvelopeHeaderBytes int `json:"envelope_header_bytes,omitempty"`
	// GrantEnvelopeHeaderBytes and GrantHeaderBytes are the sizes of the
	// x-capsnap-envelope and x-capsnap-grant headers on the allowed Check
	// of capsnap with envelopes under a grant (CapsnapGrant).
	GrantEnvelopeHeaderBytes int      `json:"grant_envelope_header_bytes,omitempty"`
	GrantHeaderBytes         int      `json:"grant_header_bytes,omitempty"`
	Targets                  []Target `json:"targets"`
	// Live is capsnap's and the floor's CPU profiles under the gRPC load,
	// alone (the lowest concurrency) and at the highest.
	Live []LiveProfile `json:"live,omitempty"`
}

// LiveProfile is capsnap's and the floor's CPU profiles at one
// concurrency, and their CPU per Check by part, from those profiles.
type LiveProfile struct {
	Concurrency  int       `json:"concurrency"`
	Profile      *Profile  `json:"profile"`
	CPUBreakdown []CPUPart `json:"cpu_breakdown"`
}

// LiveAt is the live profile at concurrency c, or nil.
func (r *Results) LiveAt(c int) *LiveProfile {
	for i := range r.Live {
		if r.Live[i].Concurrency == c {
			return &r.Live[i]
		}
	}
	return nil
}

// CPUPart is one part of a Check's server CPU time, capsnap's and the
// floor's.
type CPUPart struct {
	Part    string        `json:"part"`
	Capsnap time.Duration `json:"capsnap_ns"`
	Floor   time.Duration `json:"floor_ns"`
}

// Machine is where the run ran, and the peers' versions.
type Machine struct {
	CPU     string `json:"cpu"`
	Cores   int    `json:"cores"`
	Kernel  string `json:"kernel"`
	Go      string `json:"go"`
	Envoy   string `json:"envoy"`
	OPA     string `json:"opa_envoy"`
	Redis   string `json:"redis"`
	Date    string `json:"date"`
	LoadAvg string `json:"loadavg_at_start"`
}

// Method is how the run was made.
type Method struct {
	Concurrencies []int `json:"concurrencies"`
	// Turns is how many turns each server or mode of a step takes: in
	// order, then in reverse order, Turns/2 times over.
	Turns      int           `json:"turns"`
	GRPCRun    time.Duration `json:"grpc_run_ns"`
	GRPCWarmup int           `json:"grpc_warmup_requests"`
	// ProfileWindow is how long each running server is profiled.
	ProfileWindow  time.Duration `json:"profile_window_ns"`
	EnvoyWorkers   int           `json:"envoy_workers"`
	EnvoyRun       time.Duration `json:"envoy_run_ns"`
	EnvoyWarmup    time.Duration `json:"envoy_warmup_ns"`
	EnvoyPerWorker int           `json:"envoy_calls_per_worker"`
	Trials         int           `json:"invalidation_trials"`
	// Request is the Check request's body (the MCP tools/call), the same
	// bytes for every server.
	RequestBody string `json:"request_body"`
	EnvoyCall   string `json:"envoy_call"`
}

// GRPCRun is one server at one concurrency.
type GRPCRun struct {
	Server      string `json:"server"`
	Concurrency int    `json:"concurrency"`
	grpcload.Report
	// CPU is the server's user+system CPU time over the measured run, and
	// CPUPerCheck that over the requests (good to proc.Tick over the run).
	CPU         time.Duration `json:"cpu_ns"`
	CPUPerCheck time.Duration `json:"cpu_per_check_ns"`
	Memory      proc.Memory   `json:"memory"`
}

// EnvoyRun is one mode of the load through Envoy.
type EnvoyRun struct {
	Mode string `json:"mode"`
	mcpload.Result
	// CPU is what each process spent on the mode's calls.
	CPU []ProcessCPU `json:"cpu,omitempty"`
}

// ProcessCPU is the CPU time (user + system, from /proc) one process, or
// several doing one job, spent over a mode's measured turns, and that per
// call: the split of a call's cost among the processes that make it.
type ProcessCPU struct {
	Process string        `json:"process"`
	CPU     time.Duration `json:"cpu_ns"`
	PerCall time.Duration `json:"per_call_ns"`
}

// Invalidation is the time from a redeploy to the first drift denial.
type Invalidation struct {
	Trials []Trial       `json:"trials"`
	Min    time.Duration `json:"min_ns"`
	P50    time.Duration `json:"p50_ns"`
	P99    time.Duration `json:"p99_ns"`
	Max    time.Duration `json:"max_ns"`
}

// Trial is one redeploy.
type Trial struct {
	Variant string `json:"variant"`
	// Elapsed is from just before the admin POST to the first drift
	// denial; Post is the admin POST's own round trip, within it.
	Elapsed time.Duration `json:"elapsed_ns"`
	Post    time.Duration `json:"post_ns"`
	// Polls is how many calls were made until the denial, Allowed and
	// HandlerDrift how many of them capsnap let through (the second
	// refused by billing's own pin check at handler start).
	Polls        int `json:"polls"`
	Allowed      int `json:"allowed"`
	HandlerDrift int `json:"handler_drift"`
	// Written, across replicas, is from the same start until the
	// invalidation was in Redis (the store's sequence moved).
	Written time.Duration `json:"written_ns,omitempty"`
}

// Run is the GRPC run of server at concurrency c, if any.
func (r *Results) Run(server string, c int) (GRPCRun, bool) {
	for _, g := range r.GRPC {
		if g.Server == server && g.Concurrency == c {
			return g, true
		}
	}
	return GRPCRun{}, false
}

// Mode is the Envoy run of mode, if any.
func (r *Results) Mode(mode string) (EnvoyRun, bool) {
	for _, e := range r.Envoy {
		if e.Mode == mode {
			return e, true
		}
	}
	return EnvoyRun{}, false
}

// Delivery is what an agent's tools/list costs and delivers through
// capsnap's response path (the capsnap.ext_proc filter, which rewrites the
// list to the tools the policy grants), against the same Envoy without
// that filter, where capsnap binds to its catalog and the whole list
// passes (issue 17).
type Delivery struct {
	// Principal lists tools from a catalog of CatalogTools, of which the
	// policy grants it GrantedTools.
	Principal    string `json:"principal"`
	CatalogTools int    `json:"catalog_tools"`
	GrantedTools int    `json:"granted_tools"`
	// FilteredBytes and UnfilteredBytes are the body of one tools/list
	// response as the agent got it, through Envoy with the response path
	// and without it; UpstreamBytes the server's own, straight from it.
	FilteredBytes   int `json:"filtered_bytes"`
	UnfilteredBytes int `json:"unfiltered_bytes"`
	UpstreamBytes   int `json:"upstream_bytes"`
	// Workers list concurrently, each on its connection. Warmup listings
	// a mode are discarded; then the modes take Method.Turns turns each,
	// A B B A and again, each turn a share of Listings or Turn, whichever
	// comes first.
	Workers  int           `json:"workers"`
	Warmup   int           `json:"warmup_listings"`
	Listings int           `json:"listings_per_mode"`
	Turn     time.Duration `json:"turn_ns"`
	// With is the listings through the response path, Without those
	// through the same Envoy without it.
	With    mcpload.Result `json:"with_response_path"`
	Without mcpload.Result `json:"without_response_path"`
	// WithCPU and WithoutCPU are what each process spent on them.
	WithCPU    []ProcessCPU `json:"with_cpu,omitempty"`
	WithoutCPU []ProcessCPU `json:"without_cpu,omitempty"`
	// Profile is capsnap's CPU profile while it served listings through
	// the response path, after the measured turns.
	Profile *Profile `json:"profile,omitempty"`
}

// Ran is whether the delivery step measured anything.
func (d Delivery) Ran() bool { return d.With.Calls > 0 && d.Without.Calls > 0 }

// Store is what the shared snapshot store on Redis costs (issue 15), which
// sets no numeric target: figures, not verdicts.
type Store struct {
	// Bench is BenchmarkCheckStore's and BenchmarkSnapshotsRedis's
	// results (decide, against a real redis-server).
	Bench []gobench.Result `json:"bench"`
	// Invalidation is the time from a redeploy that replica A sees to the
	// first drift denial on replica B, which serves the server from a
	// static catalog and learns of the change only through the store.
	Invalidation Invalidation `json:"invalidation"`
}
