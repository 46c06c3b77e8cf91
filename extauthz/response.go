package extauthz

import (
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

	"github.com/capsnap/capsnap/decide"
	"github.com/capsnap/capsnap/envelope"
	"github.com/capsnap/capsnap/internal/bounded"
	"github.com/capsnap/capsnap/policy"
)

// response is Envoy's answer to o.
func response(o *decide.Outcome, pins *pinHeaders) *authv3.CheckResponse {
	resp := answer(o, pins)
	// The metadata goes into the message already encoded, as the bytes of
	// its dynamic_metadata field: protobuf-go took about 6µs and 15
	// allocations to marshal the seven-entry Struct an allowed call then
	// carried (a map of messages), more than the whole rest of the
	// response. On the wire it is an ordinary Struct; Envoy, and whatever
	// else decodes the response, reads nothing else.
	resp.ProtoReflect().SetUnknown(metadata(o))
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
func metadata(o *decide.Outcome) protoreflect.RawFields {
	// jsonrpc_id is for ext_proc: an error written in place of the
	// answer's whole body (or an event of it) answers the request's id. An
	// id longer than any client makes is left out; that error is then for
	// id null.
	id := ""
	if len(o.ID) <= maxLogValue {
		id = string(o.ID)
	}
	if o.Pinned() && o.Release == "" {
		if id == "" {
			return allowedCallMetadata
		}
		return metadataField(entry{"decision", "allow"}, entry{"reason", "ok"}, entry{"mcp_method", "tools/call"}, entry{"jsonrpc_id", id})
	}
	// An observed denial is logged as the allow it was, with the reason it
	// would have been denied for, not enforced.
	verdict, reason, enforced := "allow", "ok", ""
	switch {
	case o.Denial != nil:
		verdict, reason = "deny", string(o.Denial.Reason)
	case o.Observed != nil:
		reason, enforced = string(o.Observed.Reason), "false"
	}
	return metadataField(
		entry{"decision", verdict}, entry{"reason", reason}, entry{"enforced", enforced},
		entry{"mcp_method", logValue(o.Method)}, entry{"mcp_name", logValue(o.Name)},
		entry{"server_id", o.ServerID}, entry{"tool", logValue(o.Tool)},
		entry{"schema_digest", o.SchemaDigest}, entry{"policy_digest", o.PolicyDigest},
		// listing, on an allowed tools/list on the response path, is what
		// makes Envoy send its response, and only its response, to
		// capsnap's ext_proc service, where the snapshot is minted.
		entry{"epoch", o.Epoch}, entry{"listing", o.Listing},
		// release, on an allowed call whose answer may give back what it
		// reserved, is what ext_proc hands Settle with the answer.
		entry{"release", o.Release},
		// elicitation, on an initialize whose client takes URL-mode
		// elicitations, has ext_proc tell Elicits its answer's session.
		entry{"elicitation", elicitation(o)},
		entry{"jsonrpc_id", id},
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

func answer(o *decide.Outcome, pins *pinHeaders) *authv3.CheckResponse {
	if o.Denial != nil {
		return denied(o)
	}
	a := &allowedAnswer{}
	switch {
	case o.Pinned():
		// Through handler start: the upstream gets exactly what was
		// verified, so its handler can check the pin against itself.
		k := pinKey{o.ServerID, o.Tool, o.SchemaDigest, o.PolicyDigest, o.Effect}
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
		a.add(&a.http.Headers, decide.HeaderPrincipal, o.Principal)
		a.add(&a.http.Headers, decide.HeaderEpoch, o.Epoch)
		if o.Envelope != "" {
			a.add(&a.http.Headers, envelope.Header, o.Envelope)
		}
		if o.Grant != "" {
			a.add(&a.http.Headers, envelope.GrantHeader, o.Grant)
		}
	case o.Minted():
		a.http.ResponseHeadersToAdd = a.set[:0]
		a.add(&a.http.ResponseHeadersToAdd, decide.HeaderEpoch, o.Epoch)
		a.add(&a.http.ResponseHeadersToAdd, decide.HeaderValidUntil, o.ValidUntil.UTC().Format(time.RFC3339))
	}
	a.http.HeadersToRemove = removeClientHeaders(o, a.http.Headers)
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
var pinHeaderKeys = [...]string{decide.HeaderServerID, decide.HeaderTool, decide.HeaderSchemaDigest, decide.HeaderEffectClass, decide.HeaderPolicyDigest}

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
func removeClientHeaders(o *decide.Outcome, set []*corev3.HeaderValueOption) []string {
	var out []string
outer:
	for _, h := range o.ClientHeaders {
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

func denied(o *decide.Outcome) *authv3.CheckResponse {
	r := string(o.Denial.Reason)
	kv := [...]string{decide.HeaderReason, r, "content-type", "application/json", decide.HeaderDrift, r}
	n := len(kv) - 2
	if o.Denial.Reason.Drift() {
		n = len(kv)
	}
	headers := overwrite(kv[:n]...)
	// An HTTP client retries a 429 after Retry-After; in a 200 the
	// JSON-RPC error's data.limit or data.retry_at says when.
	if after := o.Denial.RetryAfter(); after != "" && o.Status != 200 {
		headers = append(headers, overwrite("retry-after", after)...)
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(code.Code_PERMISSION_DENIED), Message: o.Denial.Error()},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(o.Status)},
			Headers: headers,
			Body:    string(o.Body),
		}},
	}
}

func elicitation(o *decide.Outcome) string {
	if o.ElicitsURL && o.Denial == nil {
		return "url"
	}
	return ""
}
