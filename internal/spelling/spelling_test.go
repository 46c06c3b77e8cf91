package spelling

import "testing"

func TestClosest(t *testing.T) {
	keys := []string{"billing", "payments", "policy_poll_interval", "policy_file"}
	for _, tc := range []struct{ word, want string }{
		{"biling", "billing"},
		{"bliling", "billing"},
		{"polcy_poll_interval", "policy_poll_interval"},
		{"policy_fil", "policy_file"},
		{"billing", ""}, // itself: nothing else was meant
		{"shipping", ""},
		{"", ""},
	} {
		if got := Closest(tc.word, keys); got != tc.want {
			t.Errorf("Closest(%q) = %q, want %q", tc.word, got, tc.want)
		}
	}
}
