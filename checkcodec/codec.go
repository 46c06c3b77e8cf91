// Package checkcodec is capsnap's gRPC codec: protobuf's, except that an
// envoy.service.auth.v3.CheckRequest is decoded into only the fields
// capsnap's decision reads (Read), from the wire, without copying what it
// does not read. It is an authorization server's input parser, so it is
// held to protobuf-go: it refuses exactly the messages proto.Unmarshal
// refuses (malformed wire data in any field, read or not, invalid UTF-8 in
// any proto3 string, nesting past the recursion limit), and gives every
// field it reads the value proto.Unmarshal gives it (the last occurrence
// of a scalar, the merge of a message's occurrences, the last entry of a
// map key). FuzzDecode holds it to that with protobuf-go as the oracle.
//
// Every other message (ext_proc's, health's) and every response goes
// through gRPC's own protobuf codec. The codec is set on capsnap's gRPC
// server alone (grpc.ForceServerCodecV2); nothing registers it globally.
package checkcodec

import (
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Codec is the codec; its zero value is ready.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// stock is gRPC's protobuf codec, which Codec defers to.
var stock = func() encoding.CodecV2 {
	c := encoding.GetCodecV2(protocodec.Name)
	if c == nil {
		panic("checkcodec: gRPC's proto codec is not registered")
	}
	return c
}()

// Name is protobuf's: the codec speaks application/grpc+proto, as Envoy
// does.
func (Codec) Name() string { return protocodec.Name }

// Marshal is gRPC's.
func (Codec) Marshal(v any) (mem.BufferSlice, error) { return stock.Marshal(v) }

// Unmarshal decodes a CheckRequest with Decode, and anything else with
// gRPC's codec.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*authv3.CheckRequest)
	if !ok {
		return stock.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	if err := Decode(buf.ReadOnlyData(), req); err != nil {
		return fmt.Errorf("envoy.service.auth.v3.CheckRequest: %w", err)
	}
	return nil
}
