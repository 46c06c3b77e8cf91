package mcpparse

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/gowebpki/jcs"
)

// governingFields are the members of a tool definition that decide what the
// model plans against and what the server will accept. Description text is
// governing: prompt-steering in a description is a contract change. _meta
// and icons are presentation and do not count.
var governingFields = []string{"name", "title", "description", "inputSchema", "outputSchema", "annotations"}

// DigestPrefix starts every schema digest.
const DigestPrefix = "sha256:"

// ToolDigest returns the schema digest of one tool definition (a JSON
// object as found in a tools/list result): "sha256:" and the hex SHA-256 of
// the RFC 8785 canonical form of its governing fields, absent ones omitted.
// It also returns that canonical form, so callers can store exactly what was
// hashed.
//
// The definition must be strict JSON (see Parse): a duplicate member, for
// one, would let the digest cover one value while a client shows the model
// the other.
func ToolDigest(def []byte) (digest string, canonical []byte, err error) {
	if err := checkJSON(def, maxDepthCap, false); err != nil {
		return "", nil, fmt.Errorf("tool digest: definition is not strict JSON: %w", err)
	}
	digest, _, canonical, err = digestTool(trimValue(def))
	if err != nil {
		return "", nil, fmt.Errorf("tool digest: %w", err)
	}
	return digest, canonical, nil
}

// digestTool digests one checked definition and returns its name.
func digestTool(def []byte) (digest, name string, canonical []byte, err error) {
	if def[0] != '{' {
		return "", "", nil, fmt.Errorf("definition is a JSON %s, not an object", jsonType(def))
	}
	var governing bytes.Buffer
	governing.WriteByte('{')
	it := membersOf(def)
	for {
		key, v, ok := it.next()
		if !ok {
			break
		}
		var buf [64]byte
		k := nameOf(&buf, key)
		switch string(k) {
		case "name":
			if v[0] != '"' {
				return "", "", nil, fmt.Errorf("name must be a string, not a JSON %s", jsonType(v))
			}
			name = unquote(v)
			if err := checkName("tool name", name); err != nil {
				return "", "", nil, err
			}
		case "title", "description":
			if v[0] != '"' {
				return "", "", nil, fmt.Errorf("%s must be a string, not a JSON %s", k, jsonType(v))
			}
		case "inputSchema", "outputSchema", "annotations":
			if v[0] != '{' {
				return "", "", nil, fmt.Errorf("%s must be an object, not a JSON %s", k, jsonType(v))
			}
		default:
			// A client decoding tools/list with encoding/json would show the
			// model "Description" as the description, while the digest,
			// which skips unknown members, would not change with it.
			if g, ok := caseVariant(k, governingFields); ok {
				return "", "", nil, fmt.Errorf("member %s is %q in another letter case", excerpt(k), g)
			}
			continue
		}
		if governing.Len() > 1 {
			governing.WriteByte(',')
		}
		governing.Write(key)
		governing.WriteByte(':')
		governing.Write(v)
	}
	governing.WriteByte('}')
	if name == "" {
		return "", "", nil, fmt.Errorf("definition has no name")
	}
	canonical, err = jcs.Transform(governing.Bytes())
	if err != nil {
		return "", "", nil, fmt.Errorf("canonicalize: %w", err)
	}
	sum := sha256.Sum256(canonical)
	return DigestPrefix + hex.EncodeToString(sum[:]), name, canonical, nil
}

// NamedDigest is one tool's name and schema digest.
type NamedDigest struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// ToolsDigests digests every tool of a tools/list result, given either as
// the result object ({"tools":[…]}) or as the whole JSON-RPC response whose
// result holds it. The digests are in the order of the list. A name listed
// twice is an error: which of the two definitions a client plans against
// and which one a server runs is anyone's guess.
func ToolsDigests(data []byte) ([]NamedDigest, error) {
	if err := checkJSON(data, maxDepthCap, false); err != nil {
		return nil, fmt.Errorf("tools digests: not strict JSON: %w", err)
	}
	doc := trimValue(data)
	if doc[0] != '{' {
		return nil, fmt.Errorf("tools digests: document is a JSON %s, not an object", jsonType(doc))
	}
	tools, hasTools := memberValue(doc, "tools")
	if !hasTools {
		if e, ok := memberValue(doc, "error"); ok {
			return nil, fmt.Errorf("tools digests: the document is a JSON-RPC error response: %s", excerpt(e))
		}
		res, ok := memberValue(doc, "result")
		if !ok || res[0] != '{' {
			return nil, fmt.Errorf(`tools digests: neither a tools/list result ({"tools":[…]}) nor a JSON-RPC response holding one`)
		}
		if tools, hasTools = memberValue(res, "tools"); !hasTools {
			return nil, fmt.Errorf(`tools digests: the response's result has no "tools"`)
		}
	}
	if tools[0] != '[' {
		return nil, fmt.Errorf(`tools digests: "tools" is a JSON %s, not an array`, jsonType(tools))
	}
	var out []NamedDigest
	index := map[string]int{}
	it := elementsOf(tools)
	for {
		def, ok := it.next()
		if !ok {
			break
		}
		i := len(out)
		d, name, _, err := digestTool(def)
		if err != nil {
			return nil, fmt.Errorf("tools digests: tool %d: %w", i, err)
		}
		if j, dup := index[name]; dup {
			return nil, fmt.Errorf("tools digests: tools %d and %d are both named %s", j, i, excerpt(name))
		}
		index[name] = i
		out = append(out, NamedDigest{Name: name, Digest: d})
	}
	return out, nil
}

// memberValue returns the value of the member key of a checked object.
func memberValue(obj []byte, key string) ([]byte, bool) {
	it := membersOf(obj)
	for {
		name, v, ok := it.next()
		if !ok {
			return nil, false
		}
		if stringIs(name, key) {
			return v, true
		}
	}
}
