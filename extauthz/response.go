package extauthz

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/policy"
)

// CodeDenied is the JSON-RPC error code of every capsnap denial. JSON-RPC
// reserves -32768..-32000 and MCP defines no code for a policy refusal, so
// capsnap takes one outside that range; data.reason says which refusal.
const CodeDenied = -31000

// Headers capsnap sets. Every header with HeaderPrefix that a client sends
// is removed before the request reaches the upstream, so the upstream can
// trust them.
const (
	HeaderPrefix       = "x-capsnap-"
	HeaderReason       = "x-capsnap-reason"
	HeaderServerID     = "x-capsnap-server-id"
	HeaderTool         = "x-capsnap-tool"
	HeaderSchemaDigest = "x-capsnap-schema-digest"
	HeaderEffectClass  = "x-capsnap-effect-class"
	HeaderPolicyDigest = "x-capsnap-policy-digest"
	HeaderPrincipal    = "x-capsnap-principal"
	// HeaderEpoch carries the snapshot epoch: to the client on a tools/list
	// response, from the client on a tools/call (optional; it then must
	// match), and to the upstream on an allowed call.
	HeaderEpoch = "x-capsnap-epoch"
	// HeaderValidUntil tells the client when the epoch expires (RFC 3339).
	HeaderValidUntil = "x-capsnap-valid-until"
	// HeaderDrift is set on a capability_drift denial, to its reason.
	HeaderDrift = "x-capability-drift"
)

func (d *decision) response(pins *pinHeaders) *authv3.CheckResponse {
	resp := d.answer(pins)
	// The metadata goes into the message already encoded, as the bytes of
	// its dynamic_metadata field: protobuf-go takes about 6µs and 15
	// allocations to marshal a seven-entry Struct (a map of messages),
	// more than the whole rest of the response. On the wire it is an
	// ordinary Struct; Envoy, and whatever else decodes the response,
	// reads nothing else.
	resp.ProtoReflect().SetUnknown(d.metadata())
	return resp
}

// metadata is the decision as Envoy dynamic metadata, under the ext_authz
// filter's namespace, so that an access log row carries the decision and
// the snapshot it was made under: CheckResponse's dynamic_metadata field,
// a Struct of string Values, in protobuf's wire format.
func (d *decision) metadata() protoreflect.RawFields {
	verdict, reason := "allow", "ok"
	if d.fail != nil {
		verdict, reason = "deny", string(d.fail.Reason)
	}
	epoch := ""
	if d.snapshot != nil {
		epoch = d.snapshot.Epoch
	}
	fields := [...]struct{ k, v string }{
		{"decision", verdict}, {"reason", reason},
		{"server_id", d.serverID}, {"tool", d.tool},
		{"schema_digest", d.digest}, {"policy_digest", d.policyDigest},
		// listing, on an allowed tools/list on the response path, is what
		// makes Envoy send its response, and only its response, to
		// capsnap's ext_proc service, where the snapshot is minted.
		{"epoch", epoch}, {"listing", d.listing},
	}
	// Struct is {map<string, Value> fields = 1}, each map entry {key = 1,
	// value = 2}, each Value here {string_value = 3}; an empty value is
	// left out. Every value is UTF-8, as a proto3 string must be: mcpparse
	// refuses anything else, and FuzzCheck decodes every response.
	var valueLen, entryLen [len(fields)]int
	structLen := 0
	for i, kv := range fields {
		if kv.v == "" {
			continue
		}
		valueLen[i] = protowire.SizeTag(wire.stringValue) + protowire.SizeBytes(len(kv.v))
		entryLen[i] = protowire.SizeTag(1) + protowire.SizeBytes(len(kv.k)) + protowire.SizeTag(2) + protowire.SizeBytes(valueLen[i])
		structLen += protowire.SizeTag(wire.structFields) + protowire.SizeBytes(entryLen[i])
	}
	b := make([]byte, 0, protowire.SizeTag(wire.metadata)+protowire.SizeBytes(structLen))
	b = protowire.AppendTag(b, wire.metadata, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(structLen))
	for i, kv := range fields {
		if kv.v == "" {
			continue
		}
		b = protowire.AppendTag(b, wire.structFields, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(entryLen[i]))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, kv.k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(valueLen[i]))
		b = protowire.AppendTag(b, wire.stringValue, protowire.BytesType)
		b = protowire.AppendString(b, kv.v)
	}
	return b
}

// wire holds the field numbers metadata encodes, read from the generated
// descriptors so that they cannot drift from them.
var wire = struct {
	metadata, structFields, stringValue protowire.Number
}{
	metadata:     fieldNumber((&authv3.CheckResponse{}).ProtoReflect().Descriptor(), "dynamic_metadata"),
	structFields: fieldNumber((&structpb.Struct{}).ProtoReflect().Descriptor(), "fields"),
	stringValue:  fieldNumber((&structpb.Value{}).ProtoReflect().Descriptor(), "string_value"),
}

func fieldNumber(m protoreflect.MessageDescriptor, name protoreflect.Name) protowire.Number {
	f := m.Fields().ByName(name)
	if f == nil {
		panic(fmt.Sprintf("extauthz: %s has no field %s", m.FullName(), name))
	}
	return f.Number()
}

// pinKey is what the headers of an allowed call to the upstream depend
// on, but for the principal and the epoch.
type pinKey struct {
	serverID, tool, digest, policyDigest string
	effect                               policy.EffectClass
}

// pinHeaders holds, by pinKey, the headers every allowed call of one
// pinned definition under one policy carries, shared by every response
// that carries them: marshalling only reads them, and sharing them spares
// each allowed call most of its response's allocation. Bounded like the
// schemas, by the catalogs' definitions and the policies in force.
type pinHeaders = bounded[pinKey, []*corev3.HeaderValueOption]

const maxPinHeaders = 4096

func (d *decision) answer(pins *pinHeaders) *authv3.CheckResponse {
	if d.fail != nil {
		return d.denied()
	}
	var set, toClient []*corev3.HeaderValueOption
	switch {
	case d.tool != "":
		// Through handler start: the upstream gets exactly what was
		// verified, so its handler can check the pin against itself.
		k := pinKey{d.serverID, d.tool, d.digest, d.policyDigest, d.effect}
		common := pins.get(k, maxPinHeaders, func() (pinKey, []*corev3.HeaderValueOption) {
			k := pinKey{strings.Clone(k.serverID), strings.Clone(k.tool), strings.Clone(k.digest), strings.Clone(k.policyDigest), k.effect}
			return k, overwrite(nil,
				HeaderServerID, k.serverID,
				HeaderTool, k.tool,
				HeaderSchemaDigest, k.digest,
				HeaderEffectClass, k.effect.String(),
				HeaderPolicyDigest, k.policyDigest,
			)
		})
		set = overwrite(common, HeaderPrincipal, d.principal, HeaderEpoch, d.snapshot.Epoch)
	case d.snapshot != nil:
		toClient = overwrite(nil,
			HeaderEpoch, d.snapshot.Epoch,
			HeaderValidUntil, d.snapshot.ValidUntil.UTC().Format(time.RFC3339),
		)
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code.Code_OK)},
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
			Headers:              set,
			HeadersToRemove:      d.removeClientHeaders(set),
			ResponseHeadersToAdd: toClient,
		}},
	}
}

// removeClientHeaders lists the client's x-capsnap-* headers that capsnap
// does not overwrite. Envoy removes after it sets, so a header capsnap sets
// must not be listed here.
func (d *decision) removeClientHeaders(set []*corev3.HeaderValueOption) []string {
	var out []string
outer:
	for _, h := range d.clientHeaders {
		for _, s := range set {
			if s.GetHeader().GetKey() == h {
				continue outer
			}
		}
		out = append(out, h)
	}
	return out
}

// overwrite returns shared followed by headers that replace any the
// request has, from alternating keys and values. The new headers share
// one allocation: this is on every request.
func overwrite(shared []*corev3.HeaderValueOption, kv ...string) []*corev3.HeaderValueOption {
	n := len(kv) / 2
	type header struct {
		opt corev3.HeaderValueOption
		val corev3.HeaderValue
	}
	hs := make([]header, n)
	out := make([]*corev3.HeaderValueOption, len(shared), len(shared)+n)
	copy(out, shared)
	for i := range hs {
		h := &hs[i]
		h.val.Key, h.val.Value = kv[2*i], kv[2*i+1]
		h.opt.Header = &h.val
		h.opt.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		out = append(out, &h.opt)
	}
	return out
}

// errorBody is the JSON-RPC error object a denied request gets back, for the
// same id, so that an MCP client surfaces capsnap's reason instead of a bare
// HTTP status.
type errorBody struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int       `json:"code"`
		Message string    `json:"message"`
		Data    errorData `json:"data"`
	} `json:"error"`
}

type errorData struct {
	Reason deny.Reason `json:"reason"`
	// Drift is true for a capability_drift denial.
	Drift bool `json:"capability_drift,omitempty"`
	// ReturnTo is what the caller must do next (deny.ReturnTo*).
	ReturnTo string `json:"return_to"`
	Detail   string `json:"detail,omitempty"`
	ServerID string `json:"server_id,omitempty"`
	Tool     string `json:"tool,omitempty"`
	Epoch    string `json:"epoch,omitempty"`
	// SnapshotDigest is the schema digest the snapshot pinned; LiveDigest
	// the one the server serves now.
	SnapshotDigest string `json:"snapshot_digest,omitempty"`
	LiveDigest     string `json:"live_digest,omitempty"`
	SnapshotPolicy string `json:"snapshot_policy_digest,omitempty"`
	// AllowedTools, on tool_not_granted, are the tools this principal may
	// call on this server.
	AllowedTools []string `json:"allowed_tools,omitempty"`
}

func (d *decision) denied() *authv3.CheckResponse {
	body := d.errorJSON()
	headers := overwrite(nil, HeaderReason, string(d.fail.Reason), "content-type", "application/json")
	if d.fail.Reason.Drift() {
		headers = overwrite(nil, HeaderReason, string(d.fail.Reason), "content-type", "application/json", HeaderDrift, string(d.fail.Reason))
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED), Message: d.fail.Error()},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: httpStatus(d.fail.Reason)},
			Headers: headers,
			Body:    string(body),
		}},
	}
}

// errorJSON is the JSON-RPC error a denial answers its request with.
func (d *decision) errorJSON() []byte {
	var b errorBody
	b.JSONRPC = "2.0"
	b.ID = d.id
	if len(b.ID) == 0 {
		b.ID = json.RawMessage("null")
	}
	b.Error.Code = CodeDenied
	b.Error.Message = "capsnap denied the request: " + string(d.fail.Reason)
	if d.fail.Reason.Drift() {
		b.Error.Message = "capability_drift: " + string(d.fail.Reason) + "; return to " + d.fail.Reason.ReturnTo()
	}
	b.Error.Data = errorData{
		Reason: d.fail.Reason, Drift: d.fail.Reason.Drift(), ReturnTo: d.fail.Reason.ReturnTo(),
		Detail: d.fail.Detail, ServerID: d.serverID, Tool: d.tool,
		SnapshotDigest: d.digest, LiveDigest: d.liveDigest, SnapshotPolicy: d.policyDigest,
		AllowedTools: d.allowedTools,
	}
	if d.snapshot != nil {
		b.Error.Data.Epoch = d.snapshot.Epoch
	}
	body, err := json.Marshal(b)
	if err != nil {
		// Every field is a string or already-validated JSON; this cannot
		// happen, and if it did the denial must still stand.
		body = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-31000,"message":"capsnap denied the request"}}`)
	}
	return body
}

// httpStatus maps a reason to the HTTP status of its denial. Every one is a
// 4xx that MCP SDK clients read the JSON-RPC body of; a 5xx would be taken
// as transient and its body dropped.
func httpStatus(r deny.Reason) typev3.StatusCode {
	switch r {
	case deny.MalformedRequest, deny.HeaderMismatch:
		return typev3.StatusCode_BadRequest
	case deny.UnsupportedEncoding, deny.UnsupportedMediaType:
		return typev3.StatusCode_UnsupportedMediaType
	default:
		return typev3.StatusCode_Forbidden
	}
}

func clientHeaders(h map[string]string) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(k, HeaderPrefix) {
			out = append(out, k)
		}
	}
	return out
}
