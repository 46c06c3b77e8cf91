package policytest

import (
	"encoding/json"
	"fmt"
	"regexp"

	"go.yaml.in/yaml/v3"
)

// argumentsOf is a case's arguments, written as a YAML mapping (JSON's
// object syntax is one), as the JSON object a client would send: {} when
// none are written. Only what JSON can say is taken, as written: a number
// in another notation (0x10, 1_000, .inf), a key twice, or a key that is
// not a string is an error naming its line, never a value the call would
// not have carried.
func argumentsOf(n *yaml.Node) (json.RawMessage, *fieldError) {
	if n.Kind == 0 {
		return json.RawMessage("{}"), nil
	}
	if n.Kind != yaml.MappingNode {
		return nil, errorAt(n, "want a JSON object (a mapping), not %s", n.ShortTag())
	}
	v, err := jsonValue(n)
	if err != nil {
		return nil, err
	}
	raw, merr := json.Marshal(v)
	if merr != nil {
		return nil, &fieldError{n.Line, merr}
	}
	return raw, nil
}

func errorAt(n *yaml.Node, format string, args ...any) *fieldError {
	return &fieldError{n.Line, fmt.Errorf(format, args...)}
}

// jsonNumber is a number as JSON writes one.
var jsonNumber = regexp.MustCompile(`^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$`)

// jsonValue is n as encoding/json marshals it back to what was written.
func jsonValue(n *yaml.Node) (any, *fieldError) {
	switch n.Kind {
	case yaml.AliasNode:
		return jsonValue(n.Alias)
	case yaml.MappingNode:
		obj := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
				return nil, errorAt(k, "key %s is not a string", k.Value)
			}
			if _, dup := obj[k.Value]; dup {
				return nil, errorAt(k, "key %q is written twice", k.Value)
			}
			v, err := jsonValue(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			obj[k.Value] = v
		}
		return obj, nil
	case yaml.SequenceNode:
		arr := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			v, err := jsonValue(item)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		return arr, nil
	}
	switch n.ShortTag() {
	case "!!str", "!!timestamp":
		return n.Value, nil
	case "!!null":
		return nil, nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err != nil {
			return nil, &fieldError{n.Line, err}
		}
		return b, nil
	case "!!int", "!!float":
		if !jsonNumber.MatchString(n.Value) {
			return nil, errorAt(n, "%s is not a number JSON can write; write it in decimal", n.Value)
		}
		return json.Number(n.Value), nil
	}
	return nil, errorAt(n, "%s is not a JSON value", n.ShortTag())
}
