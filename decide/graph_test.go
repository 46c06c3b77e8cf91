package decide

import (
	"os/exec"
	"strings"
	"testing"
)

// The core knows no proxy, and its adapters know only the core: a decision
// that crept into an adapter, or an Envoy type into the core, fails here.
func TestPackageGraph(t *testing.T) {
	const module = "github.com/capsnap/capsnap/"
	deps := goList(t, "{{join .Deps \"\\n\"}}", ".")
	for _, d := range deps[module+"decide"] {
		if strings.Contains(d, "envoyproxy") || d == module+"extauthz" || d == module+"extproc" {
			t.Errorf("decide depends on %s", d)
		}
	}
	imports := goList(t, "{{join .Imports \"\\n\"}}", "../extauthz", "../extproc")
	for pkg, other := range map[string]string{module + "extauthz": module + "extproc", module + "extproc": module + "extauthz"} {
		if len(imports[pkg]) == 0 {
			t.Fatalf("go list said nothing of %s", pkg)
		}
		for _, d := range imports[pkg] {
			if d == other {
				t.Errorf("%s imports %s: an adapter imports only the core", pkg, other)
			}
		}
	}
}

// goList runs go list over pkgs and returns, by import path, the lines
// format prints for each.
func goList(t *testing.T, format string, pkgs ...string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-f", "{{.ImportPath}}\n" + format + "\n--"}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	got := map[string][]string{}
	for _, block := range strings.Split(string(out), "--\n") {
		lines := strings.Fields(block)
		if len(lines) > 0 {
			got[lines[0]] = lines[1:]
		}
	}
	return got
}
