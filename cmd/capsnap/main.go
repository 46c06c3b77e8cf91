// Command capsnap is the capability-snapshot authorizer for MCP tool calls,
// run as an Envoy ext_authz gRPC server. `capsnap help` lists its commands
// (commands.go) and says what its exit codes mean.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// Exit codes, as rootLong documents them.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns its exit code. A command that
// ran and failed, or answered no, exits 1; cobra's own errors (an unknown
// command or flag, arguments the command does not take) come before any
// command runs and, like a usageError from one that did, exit 2.
func run(args []string, stdout, stderr io.Writer) int {
	logTimes()
	root, ran := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	c, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(stderr, "capsnap:", err)
	var ue usageError
	if *ran && !errors.As(err, &ue) {
		return exitFailure
	}
	fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", c.CommandPath())
	return exitUsage
}

// logTimes makes every log and audit line's time RFC 3339 in UTC with
// milliseconds: decisions a few apart in a second stay in order, and a
// line reads the same wherever it was written.
func logTimes() {
	zerolog.TimeFieldFormat = "2006-01-02T15:04:05.000Z07:00"
	zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
}

// usageError is a command line the command cannot run: exit 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// versionString is what `capsnap version` prints after "capsnap ".
func versionString() string {
	bi, _ := debug.ReadBuildInfo()
	return formatVersion(version, bi)
}

// formatVersion is the version the build set (-X main.version), else the
// module's: a pseudo-version for a build from a checkout since Go 1.24,
// "(devel)" where the go command could not tell; then, when it stamped it
// (-buildvcs), the commit it was built from: its revision, its time, and
// "modified" if the work tree had changes. A "(devel)" build is only as
// identifiable as its revision.
func formatVersion(set string, bi *debug.BuildInfo) string {
	v := set
	if v == "" && bi != nil {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	if bi == nil {
		return v
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	v += " rev " + rev
	if at != "" {
		v += " " + at
	}
	if modified {
		v += " modified"
	}
	return v
}
