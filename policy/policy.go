// Package policy is the operator's say over which principal may call which
// tool, and how consequential each tool is.
//
// The effect class of a tool comes from here and only from here: never from
// the model, and never from the annotations a server publishes about itself.
// A tool the policy has not classified is denied as if it were the riskiest.
package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gowebpki/jcs"
	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// EffectClass is the platform-assigned consequence of calling a tool,
// ordered from least to most consequential.
type EffectClass int

const (
	Read EffectClass = iota + 1
	Write
	MoneyMove
	Admin
)

var effectNames = map[EffectClass]string{Read: "read", Write: "write", MoneyMove: "money_move", Admin: "admin"}

func (e EffectClass) String() string {
	if n, ok := effectNames[e]; ok {
		return n
	}
	return "unclassified"
}

// ParseEffectClass reads an effect class by its policy-file name.
func ParseEffectClass(s string) (EffectClass, error) {
	for c, n := range effectNames {
		if n == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown effect class %q (want read, write, money_move or admin)", s)
}

// File is the policy file as the operator writes it.
type File struct {
	// Tools classifies each (server, tool) pair.
	Tools []ToolRule `yaml:"tools" json:"tools"`
	// Principals lists who may call what.
	Principals []PrincipalRule `yaml:"principals" json:"principals"`
}

// ToolRule assigns one tool of one server its effect class.
type ToolRule struct {
	Server string `yaml:"server" json:"server"`
	Tool   string `yaml:"tool" json:"tool"`
	Effect string `yaml:"effect" json:"effect"`
}

// PrincipalRule grants one principal (an exact SPIFFE ID or JWT subject)
// tools on servers.
type PrincipalRule struct {
	ID     string  `yaml:"id" json:"id"`
	Grants []Grant `yaml:"grants" json:"grants"`
}

// Grant names tools of one server; "*" grants every tool the policy
// classifies on it now or later, and still denies tools it does not classify.
type Grant struct {
	Server string   `yaml:"server" json:"server"`
	Tools  []string `yaml:"tools" json:"tools"`
}

// Wildcard in a grant's tool list stands for every classified tool.
const Wildcard = "*"

type toolKey struct{ server, tool string }

// Policy is a validated, immutable policy. Reloading makes a new one.
type Policy struct {
	effects map[toolKey]EffectClass
	// decisions holds every allowed (principal, server, tool), worked out
	// once at load so that the per-call path is two map lookups.
	decisions map[string]map[toolKey]Decision
	digest    string
}

// Decision is what the policy says about one (principal, server, tool).
type Decision struct {
	Effect EffectClass
	// Digest covers exactly the rules that produced this decision, so that
	// editing one tool's rule leaves every other tool's digest alone.
	Digest string
}

// Load reads and validates a policy file.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load policy: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("load policy %s: %w", path, err)
	}
	return p, nil
}

// Parse decodes a policy strictly (unknown keys are errors) and validates it.
func Parse(data []byte) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f File
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("policy is empty")
		}
		return nil, fmt.Errorf("decode policy: %w", err)
	}
	if err := dec.Decode(new(any)); !errors.Is(err, io.EOF) {
		return nil, errors.New("decode policy: more than one YAML document")
	}
	return Compile(f)
}

// Compile validates a policy file and builds the policy it describes. Its
// errors name the offending entry.
func Compile(f File) (*Policy, error) {
	p := &Policy{effects: map[toolKey]EffectClass{}, decisions: map[string]map[toolKey]Decision{}}
	for i, t := range f.Tools {
		field := fmt.Sprintf("tools[%d]", i)
		if t.Server == "" || t.Tool == "" {
			return nil, fmt.Errorf("%s: server and tool are required", field)
		}
		if t.Tool == Wildcard {
			return nil, fmt.Errorf("%s.tool: %q cannot be classified; classify each tool", field, Wildcard)
		}
		c, err := ParseEffectClass(t.Effect)
		if err != nil {
			return nil, fmt.Errorf("%s.effect: %w", field, err)
		}
		k := toolKey{t.Server, t.Tool}
		if _, dup := p.effects[k]; dup {
			return nil, fmt.Errorf("%s: %s/%s is classified twice", field, t.Server, t.Tool)
		}
		p.effects[k] = c
	}
	for i, pr := range f.Principals {
		field := fmt.Sprintf("principals[%d]", i)
		if strings.TrimSpace(pr.ID) == "" {
			return nil, fmt.Errorf("%s.id: required", field)
		}
		if _, dup := p.decisions[pr.ID]; dup {
			return nil, fmt.Errorf("%s.id: %q is listed twice", field, pr.ID)
		}
		named := map[toolKey]bool{}
		wildcard := map[string]bool{}
		for j, g := range pr.Grants {
			gfield := fmt.Sprintf("%s.grants[%d]", field, j)
			if g.Server == "" {
				return nil, fmt.Errorf("%s.server: required", gfield)
			}
			if len(g.Tools) == 0 {
				return nil, fmt.Errorf("%s.tools: at least one tool (or %q) is required", gfield, Wildcard)
			}
			for _, t := range g.Tools {
				if t == "" {
					return nil, fmt.Errorf("%s.tools: empty tool name", gfield)
				}
				if t == Wildcard {
					wildcard[g.Server] = true
					continue
				}
				k := toolKey{g.Server, t}
				// A grant of an unclassified tool would never take effect;
				// it is almost always a typo the operator wants to hear about.
				if _, ok := p.effects[k]; !ok {
					return nil, fmt.Errorf("%s.tools: %s/%s is not classified under tools", gfield, g.Server, t)
				}
				named[k] = true
			}
		}
		decisions := map[toolKey]Decision{}
		for k, effect := range p.effects {
			via := k.tool
			if !named[k] {
				if !wildcard[k.server] {
					continue
				}
				via = Wildcard
			}
			d, err := decide(pr.ID, k, effect, via)
			if err != nil {
				return nil, err
			}
			decisions[k] = d
		}
		p.decisions[pr.ID] = decisions
	}
	canon, err := canonical(f)
	if err != nil {
		return nil, err
	}
	p.digest = digestOf(canon)
	return p, nil
}

// Digest identifies the whole policy, for logs and the info metric.
func (p *Policy) Digest() string { return p.digest }

// Decide says whether principal may call tool on server, and under which
// effect class and rule digest. A denial is a *deny.Error.
func (p *Policy) Decide(principal, server, tool string) (Decision, error) {
	k := toolKey{server, tool}
	if _, classified := p.effects[k]; !classified {
		return Decision{}, deny.Errorf(deny.UnclassifiedTool, "policy assigns %s/%s no effect class", server, tool)
	}
	d, ok := p.decisions[principal][k]
	if !ok {
		return Decision{}, deny.Errorf(deny.ToolNotGranted, "principal %q is not granted %s/%s", principal, server, tool)
	}
	return d, nil
}

// decide works out one allowed decision and the digest of the rules behind
// it: the tool's classification and the grant that admits it (named, or via
// the wildcard).
func decide(principal string, k toolKey, effect EffectClass, via string) (Decision, error) {
	type grant struct {
		Principal string `json:"principal"`
		Server    string `json:"server"`
		Tool      string `json:"tool"`
	}
	rules := struct {
		Tool  ToolRule `json:"tool"`
		Grant grant    `json:"grant"`
	}{
		Tool:  ToolRule{Server: k.server, Tool: k.tool, Effect: effect.String()},
		Grant: grant{Principal: principal, Server: k.server, Tool: via},
	}
	canon, err := canonical(rules)
	if err != nil {
		return Decision{}, err
	}
	return Decision{Effect: effect, Digest: digestOf(canon)}, nil
}

func canonical(v any) ([]byte, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("policy digest: %w", err)
	}
	out, err := jcs.Transform(raw)
	if err != nil {
		return nil, fmt.Errorf("policy digest: %w", err)
	}
	return out, nil
}

func digestOf(canon []byte) string {
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:])
}
