package checkcodec

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// TestDecisionReadsOnlyRead type-checks extauthz, which reads the
// CheckRequests Decode decodes into the decision's request, for a use of a
// field Decode leaves unset: the field or its getter, on a message on
// Read's paths. An adapter that started to read one would read "" where
// Envoy sent a value; this makes
// that a failing test, to be fixed by decoding the field (and naming it in
// Read), not by reading around it.
func TestDecisionReadsOnlyRead(t *testing.T) {
	if testing.Short() {
		t.Skip("builds extauthz's dependencies' export data")
	}
	skipped := skippedNames(t)
	const extauthz = "github.com/capsnap/capsnap/extauthz"
	out, err := exec.Command("go", "list", "-export", "-deps", "-json=ImportPath,Export,Dir,GoFiles", extauthz).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	var files []string
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p struct {
			ImportPath, Export, Dir string
			GoFiles                 []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		exports[p.ImportPath] = p.Export
		if p.ImportPath == extauthz {
			for _, f := range p.GoFiles {
				files = append(files, filepath.Join(p.Dir, f))
			}
		}
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		return os.Open(exports[path])
	})
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	if _, err := (&types.Config{Importer: imp}).Check(extauthz, fset, parsed, info); err != nil {
		t.Fatal(err)
	}
	for expr, sel := range info.Selections {
		recv := sel.Recv()
		if p, ok := recv.(*types.Pointer); ok {
			recv = p.Elem()
		}
		named, ok := recv.(*types.Named)
		if !ok || named.Obj().Pkg() == nil {
			continue
		}
		key := named.Obj().Pkg().Path() + "." + named.Obj().Name() + "." + sel.Obj().Name()
		if field, ok := skipped[key]; ok {
			t.Errorf("%s: extauthz reads %s, which checkcodec.Decode does not decode", fset.Position(expr.Sel.Pos()), field)
		}
	}
}

// skippedNames are the Go names (field and getter) of every field of the
// messages on Read's paths that Read does not name, as package path, Go
// type and name ("…/auth/v3.AttributeContext_HttpRequest.GetPath"), each
// to its proto field's full name.
func skippedNames(t *testing.T) map[string]protoreflect.FullName {
	read := map[protoreflect.FullName]bool{}
	onPath := map[protoreflect.FullName]protoreflect.MessageType{}
	root := (*authv3.CheckRequest)(nil).ProtoReflect().Type()
	for _, path := range Read {
		mt := root
		for _, name := range strings.Split(path, ".") {
			fd := mt.Descriptor().Fields().ByName(protoreflect.Name(name))
			if fd == nil {
				t.Fatalf("Read: %s: %s has no field %s", path, mt.Descriptor().FullName(), name)
			}
			onPath[mt.Descriptor().FullName()] = mt
			read[fd.FullName()] = true
			if fd.Message() == nil || fd.IsMap() {
				break
			}
			mt = mt.New().Get(fd).Message().Type()
		}
	}
	out := map[string]protoreflect.FullName{}
	for _, mt := range onPath {
		md := mt.Descriptor()
		goType := reflect.TypeOf(mt.Zero().Interface()).Elem()
		for i := range goType.NumField() {
			sf := goType.Field(i)
			tag := sf.Tag.Get("protobuf")
			if tag == "" {
				if sf.Tag.Get("protobuf_oneof") != "" {
					t.Fatalf("%s has a oneof, %s: name its fields here", md.FullName(), sf.Name)
				}
				continue
			}
			for _, part := range strings.Split(tag, ",") {
				if name, ok := strings.CutPrefix(part, "name="); ok {
					fd := md.Fields().ByName(protoreflect.Name(name))
					if fd != nil && !read[fd.FullName()] {
						prefix := goType.PkgPath() + "." + goType.Name() + "."
						out[prefix+sf.Name], out[prefix+"Get"+sf.Name] = fd.FullName(), fd.FullName()
					}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no skipped field found: the tag parsing is broken")
	}
	return out
}
