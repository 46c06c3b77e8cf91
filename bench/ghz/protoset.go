package ghz

import (
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Call is the method ghz loads: Envoy's ext_authz Check.
const Call = "envoy.service.auth.v3.Authorization.Check"

// Protoset is a serialized FileDescriptorSet of external_auth.proto and
// everything it imports, from the descriptors compiled into this binary
// (go-control-plane's), so that ghz needs no .proto files or protoc and
// loads exactly the messages capsnap serves. Files come after the files
// they import.
func Protoset() ([]byte, error) {
	root := authv3.File_envoy_service_auth_v3_external_auth_proto
	set := &descriptorpb.FileDescriptorSet{}
	seen := map[string]bool{}
	var add func(protoreflect.FileDescriptor)
	add = func(f protoreflect.FileDescriptor) {
		if seen[f.Path()] {
			return
		}
		seen[f.Path()] = true
		imports := f.Imports()
		for i := range imports.Len() {
			add(imports.Get(i).FileDescriptor)
		}
		set.File = append(set.File, protodesc.ToFileDescriptorProto(f))
	}
	add(root)
	b, err := proto.Marshal(set)
	if err != nil {
		return nil, fmt.Errorf("protoset: %w", err)
	}
	return b, nil
}
