package extauthz

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/code"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/deny"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/internal/bounded"
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

func (d *decision) response(pins *pinHeaders, form config.Denials) *authv3.CheckResponse {
	resp := d.answer(pins, form)
	// The metadata goes into the message already encoded, as the bytes of
	// its dynamic_metadata field: protobuf-go took about 6µs and 15
	// allocations to marshal the seven-entry Struct an allowed call then
	// carried (a map of messages), more than the whole rest of the
	// response. On the wire it is an ordinary Struct; Envoy, and whatever
	// else decodes the response, reads nothing else.
	resp.ProtoReflect().SetUnknown(d.metadata())
	return resp
}

// metadata is the decision as Envoy dynamic metadata, under the ext_authz
// filter's namespace, so that an access log row carries the decision, the
// MCP request it was made on and the snapshot it was made under:
// CheckResponse's dynamic_metadata field, a Struct of string Values, in
// protobuf's wire format.
//
// mcp_method and mcp_name are the request's method and what MCP
// 2026-07-28's Mcp-Name header mirrors (the tool, prompt or resource),
// both read from the body, in every protocol version: a client's Mcp-Method
// and Mcp-Name headers are only what it claims (and on a request capsnap
// refuses for them, they disagree with the body). A batch is named by its
// tools/call or tools/list, else by its first message; a GET or DELETE by
// its HTTP method.
//
// An allowed tools/call says its pins once, in the headers to the
// upstream; its metadata is only the decision and the method, the same
// bytes every time. Envoy's header_to_metadata filter, after ext_authz in
// envoy/*.yaml, copies those headers into this namespace, x-capsnap-tool
// into mcp_name as well, so an access log row reads the same keys either
// way. That filter runs only on a request ext_authz let through, whose
// x-capsnap-* headers capsnap has just set or removed: a client's forged
// pin never reaches a log. Saying them twice cost the allowed
// answer 265 of its ~700 bytes, which Envoy decodes on every call
// (BENCHMARKS.md).
func (d *decision) metadata() protoreflect.RawFields {
	if d.fail == nil && d.tool != "" {
		return allowedCallMetadata
	}
	verdict, reason := "allow", "ok"
	if d.fail != nil {
		verdict, reason = "deny", string(d.fail.Reason)
	}
	epoch := ""
	if d.snapshot != nil {
		epoch = d.snapshot.Epoch
	}
	return metadataField(
		entry{"decision", verdict}, entry{"reason", reason},
		entry{"mcp_method", logValue(d.method)}, entry{"mcp_name", logValue(d.name)},
		entry{"server_id", d.serverID}, entry{"tool", logValue(d.tool)},
		entry{"schema_digest", d.digest}, entry{"policy_digest", d.policyDigest},
		// listing, on an allowed tools/list on the response path, is what
		// makes Envoy send its response, and only its response, to
		// capsnap's ext_proc service, where the snapshot is minted.
		entry{"epoch", epoch}, entry{"listing", d.listing},
	)
}

// allowedCallMetadata is shared by every allowed tools/call's answer:
// marshalling only reads it, and its capacity is its length, so that an
// append could only copy it.
var allowedCallMetadata = slices.Clip(metadataField(entry{"decision", "allow"}, entry{"reason", "ok"}, entry{"mcp_method", "tools/call"}))

// maxLogValue bounds a metadata value the request chose. Envoy writes it
// into an access log row, and the body bounds a method, tool, prompt or
// uri only at limits.max_body_bytes.
const maxLogValue = 256

// logValue is s as an access log row gets it: cut to maxLogValue bytes on
// a rune boundary and marked with a trailing "…", and with every control
// character replaced by U+FFFD, so that a row in a text format cannot be
// split (methods and tool names have none: mcpparse refuses them; prompt
// names and uris are the server's business). It allocates only for a
// value it changes.
func logValue(s string) string {
	if len(s) > maxLogValue {
		n := maxLogValue
		for !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "…"
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, s)
}

// entry is one key of the metadata, and its string value.
type entry struct{ k, v string }

// metadataField is CheckResponse's dynamic_metadata field holding a Struct
// of the entries whose value is not empty, in protobuf's wire format.
func metadataField(fields ...entry) protoreflect.RawFields {
	// Struct is {map<string, Value> fields = 1}, each map entry {key = 1,
	// value = 2}, each Value here {string_value = 3}. Every value is
	// UTF-8, as a proto3 string must be: mcpparse refuses anything else,
	// and FuzzCheck decodes every response.
	structLen := 0
	for _, kv := range fields {
		if kv.v != "" {
			structLen += protowire.SizeTag(wire.structFields) + protowire.SizeBytes(kv.size())
		}
	}
	b := make([]byte, 0, protowire.SizeTag(wire.metadata)+protowire.SizeBytes(structLen))
	b = protowire.AppendTag(b, wire.metadata, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(structLen))
	for _, kv := range fields {
		if kv.v == "" {
			continue
		}
		b = protowire.AppendTag(b, wire.structFields, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(kv.size()))
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, kv.k)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(kv.valueSize()))
		b = protowire.AppendTag(b, wire.stringValue, protowire.BytesType)
		b = protowire.AppendString(b, kv.v)
	}
	return b
}

// valueSize is the size of e's Value, and size that of its map entry.
func (e entry) valueSize() int {
	return protowire.SizeTag(wire.stringValue) + protowire.SizeBytes(len(e.v))
}

func (e entry) size() int {
	return protowire.SizeTag(1) + protowire.SizeBytes(len(e.k)) + protowire.SizeTag(2) + protowire.SizeBytes(e.valueSize())
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
type pinHeaders = bounded.Map[pinKey, []*corev3.HeaderValueOption]

const maxPinHeaders = 4096

func (d *decision) answer(pins *pinHeaders, form config.Denials) *authv3.CheckResponse {
	if d.fail != nil {
		return d.denied(form)
	}
	a := &allowedAnswer{}
	switch {
	case d.tool != "":
		// Through handler start: the upstream gets exactly what was
		// verified, so its handler can check the pin against itself.
		k := pinKey{d.serverID, d.tool, d.digest, d.policyDigest, d.effect}
		common := pins.Get(k, maxPinHeaders, func() (pinKey, []*corev3.HeaderValueOption) {
			k := pinKey{strings.Clone(k.serverID), strings.Clone(k.tool), strings.Clone(k.digest), strings.Clone(k.policyDigest), k.effect}
			vals := [len(pinHeaderKeys)]string{k.serverID, k.tool, k.digest, k.effect.String(), k.policyDigest}
			kv := make([]string, 0, 2*len(vals))
			for i, v := range vals {
				kv = append(kv, pinHeaderKeys[i], v)
			}
			return k, overwrite(kv...)
		})
		a.http.Headers = append(a.set[:0], common...)
		a.add(&a.http.Headers, HeaderPrincipal, d.principal)
		a.add(&a.http.Headers, HeaderEpoch, d.snapshot.Epoch)
		if d.envelope != "" {
			a.add(&a.http.Headers, envelope.Header, d.envelope)
		}
		if d.grant != "" {
			a.add(&a.http.Headers, envelope.GrantHeader, d.grant)
		}
	case d.snapshot != nil:
		a.http.ResponseHeadersToAdd = a.set[:0]
		a.add(&a.http.ResponseHeadersToAdd, HeaderEpoch, d.snapshot.Epoch)
		a.add(&a.http.ResponseHeadersToAdd, HeaderValidUntil, d.snapshot.ValidUntil.UTC().Format(time.RFC3339))
	}
	a.http.HeadersToRemove = d.removeClientHeaders(a.http.Headers)
	a.status.Code = int32(code.Code_OK)
	a.ok.OkResponse = &a.http
	a.resp.Status, a.resp.HttpResponse = &a.status, &a.ok
	return &a.resp
}

// allowedAnswer is an allowed answer's messages, and room for the headers
// of an allowed call or listing, in one allocation: every allowed request
// makes one.
type allowedAnswer struct {
	resp   authv3.CheckResponse
	status rpcstatus.Status
	ok     authv3.CheckResponse_OkResponse
	http   authv3.OkHttpResponse
	// set has room for the shared pin headers and a call's own: the
	// principal, the epoch, the envelope and its grant.
	set  [pinHeaderCount + ownHeaders]*corev3.HeaderValueOption
	own  [ownHeaders]header
	owns int
}

// add appends to list a header that replaces any the request (or, for a
// listing, the response) has.
func (a *allowedAnswer) add(list *[]*corev3.HeaderValueOption, k, v string) {
	*list = append(*list, a.own[a.owns].set(k, v))
	a.owns++
}

// pinHeaderKeys are the headers every allowed call of one pin carries
// alike, shared by their answers (pinHeaders).
var pinHeaderKeys = [...]string{HeaderServerID, HeaderTool, HeaderSchemaDigest, HeaderEffectClass, HeaderPolicyDigest}

// pinHeaderCount is the shared pin headers' count; ownHeaders the most
// headers an allowed answer has of its own: a call's principal, epoch,
// envelope and grant, or a listing's epoch and expiry.
const (
	pinHeaderCount = len(pinHeaderKeys)
	ownHeaders     = 4
)

// header is one header capsnap sets, its option and value together.
type header struct {
	opt corev3.HeaderValueOption
	val corev3.HeaderValue
}

// set makes h the header k: v, replacing any the request has.
func (h *header) set(k, v string) *corev3.HeaderValueOption {
	h.val.Key, h.val.Value = k, v
	h.opt.Header = &h.val
	h.opt.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	return &h.opt
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

// overwrite returns headers that replace any the request has, from
// alternating keys and values: the headers in one allocation, the list in
// another.
func overwrite(kv ...string) []*corev3.HeaderValueOption {
	hs := make([]header, len(kv)/2)
	out := make([]*corev3.HeaderValueOption, len(hs))
	for i := range hs {
		out[i] = hs[i].set(kv[2*i], kv[2*i+1])
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
	// AllowedTools, on a denial that sends the caller back to planning,
	// are the tools its snapshot lets it call.
	AllowedTools []string `json:"allowed_tools,omitempty"`
}

// MetaKeyDenial is the _meta member of a tool result that denies a call
// (denials.call_form: tool_result): errorData, as a JSON-RPC error's data
// would carry it.
const MetaKeyDenial = "io.capsnap/denial"

// toolResultBody is a tools/call denial as a tool result: the model reads
// the text; code reads _meta. resultType is required by 2026-07-28 clients
// and ignored by earlier ones; there is no structuredContent, which a
// client would hold to the tool's outputSchema.
type toolResultBody struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError    bool                 `json:"isError"`
		ResultType string               `json:"resultType"`
		Meta       map[string]errorData `json:"_meta"`
	} `json:"result"`
}

func (d *decision) toolResultJSON() []byte {
	var b toolResultBody
	b.JSONRPC, b.ID = "2.0", d.id
	data := d.errorData()
	text := "capsnap denied this call: " + string(data.Reason)
	if data.Drift {
		text = "capsnap denied this call: capability_drift " + string(data.Reason)
	}
	text += " (" + data.Detail + "). " + data.Reason.NextStep()
	if len(data.AllowedTools) > 0 {
		text += " Tools you may call: " + strings.Join(data.AllowedTools, ", ") + "."
	}
	b.Result.Content = append(b.Result.Content, struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{"text", text})
	b.Result.IsError, b.Result.ResultType = true, "complete"
	b.Result.Meta = map[string]errorData{MetaKeyDenial: data}
	body, err := json.Marshal(b)
	if err != nil {
		return d.errorJSON() // cannot happen (strings and checked JSON), and would still deny
	}
	return body
}

func (d *decision) denied(form config.Denials) *authv3.CheckResponse {
	status, body := d.denialBody(form)
	r := string(d.fail.Reason)
	kv := [...]string{HeaderReason, r, "content-type", "application/json", HeaderDrift, r}
	n := len(kv) - 2
	if d.fail.Reason.Drift() {
		n = len(kv)
	}
	headers := overwrite(kv[:n]...)
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED), Message: d.fail.Error()},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: headers,
			Body:    string(body),
		}},
	}
}

// denialBody is the HTTP status and body a denial is answered with, in the
// configured form. A denial whose request id is unknown (the body could
// not be read) always takes the HTTP error: a 200 that answers id null is
// one no SDK client can match to its request (Python's waits for ever,
// Go's drops the session). So does a batch's: a 200 would leave its other
// requests unanswered.
func (d *decision) denialBody(form config.Denials) (int, []byte) {
	switch {
	case len(d.id) == 0 || d.batch || form.Status == config.StatusHTTPError:
		return d.fail.Reason.Spec().Status, d.errorJSON()
	case d.method == "tools/call" && form.CallForm == config.CallFormToolResult:
		return 200, d.toolResultJSON()
	default:
		return 200, d.errorJSON()
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
	b.Error.Data = d.errorData()
	body, err := json.Marshal(b)
	if err != nil {
		// Every field is a string or already-validated JSON; this cannot
		// happen, and if it did the denial must still stand.
		body = []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-31000,"message":"capsnap denied the request"}}`)
	}
	return body
}

// errorData is what a denial tells the caller beyond its code and message.
func (d *decision) errorData() errorData {
	data := errorData{
		Reason: d.fail.Reason, Drift: d.fail.Reason.Drift(), ReturnTo: d.fail.Reason.ReturnTo(),
		Detail: d.fail.Detail, ServerID: d.serverID, Tool: d.tool,
		SnapshotDigest: d.digest, LiveDigest: d.liveDigest, SnapshotPolicy: d.policyDigest,
		AllowedTools: d.allowedTools,
	}
	if d.snapshot != nil {
		data.Epoch = d.snapshot.Epoch
	}
	return data
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
