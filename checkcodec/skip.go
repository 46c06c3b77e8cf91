package checkcodec

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The errors Decode returns: each is one of the reasons protobuf-go
// refuses a message, in its words.
var (
	errDecode = errors.New("checkcodec: cannot parse invalid wire-format data")
	errUTF8   = errors.New("checkcodec: string field contains invalid UTF-8")
	errDepth  = errors.New("checkcodec: exceeded maximum recursion depth")
	// errUnknown is not returned: it says that an occurrence of a known
	// field is read as an unknown field, as protobuf-go reads one whose
	// wire type is not its kind's.
	errUnknown = errors.New("checkcodec: unknown field")
)

// message is what the skipper knows of one message type: its fields by
// number. A field number it does not list is an unknown field.
type message struct {
	fields map[protowire.Number]*field
}

// field is one field of a message, as protobuf-go's decoder reads it.
type field struct {
	// kind is the field's kind; a repeated field's occurrences are each
	// read as one of a singular field of its kind.
	kind protoreflect.Kind
	// utf8 is a string field whose value must be valid UTF-8.
	utf8 bool
	// msg is the field's message type, for a message field.
	msg *message
	// key and val are a map field's key and value.
	key, val *field
}

// scan builds the skipper's view of md and every message type it reaches.
// It panics on anything the skipper does not read as protobuf-go does
// (groups, extensions, weak fields, packed numbers): the tables are built at
// package initialization, from the generated descriptors, so a
// go-control-plane that starts to use one fails every test of this package
// before it can serve a Check.
func scan(md protoreflect.MessageDescriptor, seen map[protoreflect.FullName]*message) *message {
	if m, ok := seen[md.FullName()]; ok {
		return m
	}
	if md.ExtensionRanges().Len() > 0 {
		panic(fmt.Sprintf("checkcodec: %s has extension ranges", md.FullName()))
	}
	m := &message{fields: make(map[protowire.Number]*field, md.Fields().Len())}
	seen[md.FullName()] = m
	fds := md.Fields()
	for i := range fds.Len() {
		m.fields[fds.Get(i).Number()] = scanField(fds.Get(i), seen)
	}
	return m
}

func scanField(fd protoreflect.FieldDescriptor, seen map[protoreflect.FullName]*message) *field {
	f := &field{kind: fd.Kind(), utf8: enforceUTF8(fd)}
	switch {
	case fd.IsList() && fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind:
		// No message a CheckRequest holds has one, so the skipper
		// does not read the packed form.
		panic(fmt.Sprintf("checkcodec: %s is a repeated number", fd.FullName()))
	case fd.IsMap():
		f.key, f.val = scanField(fd.MapKey(), seen), scanField(fd.MapValue(), seen)
	case fd.Kind() == protoreflect.GroupKind:
		panic(fmt.Sprintf("checkcodec: %s is a group", fd.FullName()))
	case fd.Kind() == protoreflect.MessageKind:
		f.msg = scan(fd.Message(), seen)
	}
	return f
}

// enforceUTF8 is protobuf-go's own rule (internal/strs.EnforceUTF8): a
// proto3 string must be UTF-8, and an editions one when its features say so.
func enforceUTF8(fd protoreflect.FieldDescriptor) bool {
	if fd.Kind() != protoreflect.StringKind {
		return false
	}
	if fd.Syntax() == protoreflect.Editions {
		if e, ok := fd.(interface{ EnforceUTF8() bool }); ok {
			return e.EnforceUTF8()
		}
	}
	return fd.Syntax() == protoreflect.Proto3
}

// consumeTag reads a field's tag as protobuf-go's message decoder does: a
// field number outside 1..2^29-1 is an error.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}

// skipMessage checks b as a whole message of type m, whose decoder has
// depth recursion left, and reads nothing from it: it fails where
// protobuf-go's proto.Unmarshal would fail, and nowhere else.
func skipMessage(m *message, b []byte, depth int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errDecode
		}
		b = b[n:]
		// No message here is a group, so an end-group tag ends nothing.
		if typ == protowire.EndGroupType {
			return errDecode
		}
		n, err := skipField(m, num, typ, b, depth)
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// skipField checks the value of field num of m, of wire type typ, at the
// start of b, and returns its length.
func skipField(m *message, num protowire.Number, typ protowire.Type, b []byte, depth int) (int, error) {
	if f := m.fields[num]; f != nil {
		if n, err := f.skip(typ, b, depth); err != errUnknown {
			return n, err
		}
	}
	return skipUnknown(num, typ, b)
}

// skipUnknown consumes an unknown field's value (or a known field's of the
// wrong wire type), as protobuf-go does before it keeps it as unknown.
func skipUnknown(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	n := protowire.ConsumeFieldValue(num, typ, b)
	if n < 0 {
		return 0, errDecode
	}
	return n, nil
}

// skip checks one occurrence of f, of wire type typ, at the start of b, in
// a message whose decoder has depth recursion left. errUnknown says that
// protobuf-go reads the occurrence as an unknown field.
func (f *field) skip(typ protowire.Type, b []byte, depth int) (int, error) {
	switch {
	case f.key != nil:
		// A map entry counts as a level of nesting, tested before its
		// wire type (protobuf-go's consumeMap).
		if depth--; depth < 0 {
			return 0, errDepth
		}
		if typ != protowire.BytesType {
			return 0, errUnknown
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, errDecode
		}
		return n, skipEntry(f.key, f.val, v, depth)
	case f.kind == protoreflect.MessageKind:
		v, n, err := nested(typ, b, depth)
		if err != nil {
			return 0, err
		}
		return n, skipMessage(f.msg, v, depth-1)
	case f.kind == protoreflect.StringKind || f.kind == protoreflect.BytesKind:
		if typ != protowire.BytesType {
			return 0, errUnknown
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return 0, errDecode
		}
		if f.utf8 && !utf8.Valid(v) {
			return 0, errUTF8
		}
		return n, nil
	}
	if typ != scalarType(f.kind) {
		return 0, errUnknown
	}
	n := protowire.ConsumeFieldValue(0, typ, b)
	if n < 0 {
		return 0, errDecode
	}
	return n, nil
}

// skipEntry checks b as a map entry of key and val, in a decoder with depth
// recursion left (the entry's level already counted).
func skipEntry(key, val *field, b []byte, depth int) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errDecode
		}
		b = b[n:]
		err := errUnknown
		switch num {
		case 1:
			n, err = key.skip(typ, b, depth)
		case 2:
			n, err = val.skip(typ, b, depth)
		}
		if err == errUnknown {
			n, err = skipUnknown(num, typ, b)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// nested reads the bytes of a message field's occurrence, of wire type
// typ, at the start of b, in a decoder with depth recursion left: the
// nested message's own decoder has depth-1.
func nested(typ protowire.Type, b []byte, depth int) ([]byte, int, error) {
	if typ != protowire.BytesType {
		return nil, 0, errUnknown
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return nil, 0, errDecode
	}
	if depth-1 < 0 {
		return nil, 0, errDepth
	}
	return v, n, nil
}

// scalarType is the wire type of a number kind.
func scalarType(k protoreflect.Kind) protowire.Type {
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return protowire.Fixed32Type
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return protowire.Fixed64Type
	}
	return protowire.VarintType
}
