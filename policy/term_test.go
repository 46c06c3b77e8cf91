package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/capsnap/capsnap/deny"
)

// log is a CallLog in a map, which can also fail.
type log struct {
	called map[string]bool
	err    error
}

func (l *log) Follows(tool string, after []string, record bool) (bool, error) {
	if l.err != nil {
		return false, l.err
	}
	for _, a := range after {
		if !l.called[a] {
			return false, nil
		}
	}
	if record {
		l.called[tool] = true
	}
	return true, nil
}

// A decision's terms are its constraints, in order, then its sequence rule,
// the one term that records, when the tool is ordered at all.
func TestDecisionTermsInOrder(t *testing.T) {
	p := mustLoad(t, "testdata/seed.yaml")
	tests := []struct {
		server, tool string
		want         []string // each term: a constraint's name, or "sequence"
	}{
		{"billing", "refund", []string{"usd_cap_250", "reason_allowlist", "sequence"}},
		{"billing", "lookup_order", []string{"sequence"}}, // refund's after names it: its calls are recorded
		{"payments", "refund", []string{"usd_cap_250"}},
	}
	for _, tt := range tests {
		d, err := p.Decide("spiffe://acme/agent/support-refund", tt.server, tt.tool)
		if err != nil {
			t.Fatalf("%s/%s: %v", tt.server, tt.tool, err)
		}
		var got []string
		for i, term := range d.Terms {
			switch term := term.(type) {
			case *Constraint:
				got = append(got, term.Name)
			case sequence:
				got = append(got, "sequence")
			default:
				t.Fatalf("%s/%s: term %d is a %T", tt.server, tt.tool, i, term)
			}
			if term.Records() != (i == len(d.Terms)-1 && got[i] == "sequence") {
				t.Errorf("%s/%s: term %d (%s) Records %v", tt.server, tt.tool, i, got[i], term.Records())
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("%s/%s: terms %v, want %v", tt.server, tt.tool, got, tt.want)
		}
	}
}

// A sequence rule holds once every tool of after was called under the
// snapshot, records the call only if another rule reads it, and fails
// closed with the store's error.
func TestSequence(t *testing.T) {
	storeDown := errors.New("store down")
	tests := []struct {
		name     string
		seq      sequence
		called   []string
		err      error
		want     deny.Reason // "" allows
		recorded bool
	}{
		{"no predecessor yet", sequence{after: []string{"lookup_order"}}, nil, nil, deny.SequenceViolation, false},
		{"one of two", sequence{after: []string{"lookup_order", "verify"}}, []string{"lookup_order"}, nil, deny.SequenceViolation, false},
		{"every predecessor", sequence{after: []string{"lookup_order", "verify"}}, []string{"lookup_order", "verify"}, nil, "", false},
		{"precedes: recorded", sequence{precedes: true}, nil, nil, "", true},
		{"denied: never recorded", sequence{after: []string{"x"}, precedes: true}, nil, nil, deny.SequenceViolation, false},
		{"the store fails", sequence{after: []string{"lookup_order"}}, []string{"lookup_order"}, storeDown, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &log{called: map[string]bool{}, err: tt.err}
			for _, c := range tt.called {
				l.called[c] = true
			}
			err := tt.seq.Check(Call{Input: Input{Tool: "refund"}, Snapshot: "ep_1", Log: l})
			switch de, isDenial := deny.As(err); {
			case tt.err != nil:
				if !errors.Is(err, tt.err) || isDenial {
					t.Fatalf("error %v, want the store's %v, no denial", err, tt.err)
				}
			case tt.want == "":
				if err != nil {
					t.Fatalf("denied: %v", err)
				}
			case !isDenial || de.Reason != tt.want || !strings.Contains(de.Detail, "ep_1"):
				t.Fatalf("error %v, want %s naming the snapshot", err, tt.want)
			}
			if l.called["refund"] != tt.recorded {
				t.Errorf("recorded %v, want %v", l.called["refund"], tt.recorded)
			}
		})
	}
}

// A constraint is a term that reads only the call: its Check is CheckInput.
func TestConstraintIsATerm(t *testing.T) {
	d, err := mustLoad(t, "testdata/seed.yaml").Decide("spiffe://acme/agent/support-refund", "payments", "refund")
	if err != nil {
		t.Fatal(err)
	}
	usdCap := d.Terms[0]
	if usdCap.Records() {
		t.Error("a constraint records calls")
	}
	for amount, want := range map[float64]bool{100: true, 300: false} {
		in := Input{Args: map[string]any{"amount": amount}, Principal: "spiffe://acme/agent/support-refund", Server: "payments", Tool: "refund"}
		if err := usdCap.Check(Call{Input: in}); (err == nil) != want {
			t.Errorf("amount %v: %v, want holds=%v", amount, err, want)
		}
	}
}
