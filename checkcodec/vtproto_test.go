//go:build vtprotobuf

package checkcodec

import "testing"

// Built with -tags vtprotobuf, a CheckResponse has go-control-plane's
// marshaler, which Codec.Marshal takes (TestCodecMarshal holds its bytes
// to protobuf-go's).
func TestVTMarshaler(t *testing.T) {
	for _, resp := range responses() {
		if _, ok := any(resp).(vtMarshaler); !ok {
			t.Fatalf("%T has no MarshalVTStrict under -tags vtprotobuf", resp)
		}
	}
}
