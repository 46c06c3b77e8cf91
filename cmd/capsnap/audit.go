package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/capsnap/capsnap/audit"
	"github.com/capsnap/capsnap/config"
	"github.com/capsnap/capsnap/envelope"
)

// openAudit opens the audit trail serve writes to: c.Path, appended to
// with its chain resumed from its last line, or stdout. Lines go through
// an audit.Trail: group commit, each line chained to the one before, and
// checkpoints of the chain signed every c.CheckpointInterval and on
// shutdown with the envelope keys (unsigned without keys, which audit
// verify reports). closeAudit writes the shutdown checkpoint and closes
// the file: call it once nothing writes audit lines any more.
func openAudit(c config.Audit, stdout io.Writer, keys *envelope.Keys, log zerolog.Logger) (auditLog zerolog.Logger, closeAudit func(), err error) {
	o := audit.TrailOptions{Interval: c.CheckpointInterval}
	if keys != nil {
		sign, err := keys.Signer(audit.CheckpointType)
		if err != nil {
			return zerolog.Logger{}, nil, fmt.Errorf("serve: audit: %w", err)
		}
		o.Signer = audit.SignerFunc(sign)
	} else {
		log.Warn().Msg("audit checkpoints are unsigned: without envelope.key_files nothing proves the trail was not rewritten whole")
	}
	out, f := stdout, (*os.File)(nil)
	if c.Path != "" {
		if f, err = os.OpenFile(c.Path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o640); err != nil {
			return zerolog.Logger{}, nil, fmt.Errorf("serve: audit: %w", err)
		}
		if o.Resume, err = audit.Resume(f); err != nil {
			f.Close()
			return zerolog.Logger{}, nil, fmt.Errorf("serve: audit: %s: %w", c.Path, err)
		}
		out = f
	}
	trail := audit.NewTrail(out, o)
	closeAudit = func() {
		if err := trail.Close(); err != nil {
			log.Error().Err(err).Msg("audit: the shutdown checkpoint was not written")
		}
		if f != nil {
			if err := f.Close(); err != nil {
				log.Error().Err(err).Msg("audit: close")
			}
		}
	}
	// A line is written before its decision is answered, and the lines of
	// concurrent decisions share one write.
	return zerolog.New(trail).With().Timestamp().Str("log", "audit").Logger(), closeAudit, nil
}

// errNotVerified is audit verify's failure once it has said why.
var errNotVerified = errors.New("audit verify: NOT VERIFIED")

// auditVerify checks an audit trail: its chain, every checkpoint's
// signature against the JWKS, and that it ends with the shutdown
// checkpoint. Exit 0: verified; 1: not (the first problem is printed), or
// a file that cannot be read, as for every command; 2: usage.
func auditVerify(jwksFile string, live bool, files []string, stdout io.Writer) error {
	if len(files) == 0 {
		return usageError{"audit verify: at least one audit FILE (oldest first) is required"}
	}
	o := audit.VerifyOptions{Live: live}
	if jwksFile != "" {
		data, err := os.ReadFile(jwksFile)
		if err != nil {
			return fmt.Errorf("audit verify: %w", err)
		}
		if err := json.Unmarshal(data, &o.Keys); err != nil || len(o.Keys.Keys) == 0 {
			return fmt.Errorf("audit verify: %s is not a JWKS with a key (%v)", jwksFile, err)
		}
	}
	var inputs []audit.Input
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("audit verify: %w", err)
		}
		defer f.Close()
		inputs = append(inputs, audit.Input{Name: name, R: f})
	}
	rep, err := audit.Verify(o, inputs...)
	if err != nil {
		return err
	}
	// Without a JWKS a trail capsnap wrote without keys verifies as
	// unsigned: its chain holds, and nothing proves it was not rewritten
	// whole. With one, an unsigned checkpoint is a failure.
	if rep.Problem != nil && rep.Problem.Kind == audit.KindUnsigned && jwksFile == "" {
		fmt.Fprintf(stdout, "%s: verified as unsigned: %d lines, the chain intact (last seq %d); its checkpoints carry no signature, so nothing proves the trail was not rewritten whole\n",
			strings.Join(files, ", "), rep.Lines, rep.LastSeq)
		return nil
	}
	if rep.Problem != nil {
		fmt.Fprintln(stdout, rep.Problem)
		if rep.Problem.Kind == audit.KindUnknownKey && jwksFile == "" {
			fmt.Fprintln(stdout, "its checkpoints are signed: give --jwks (capsnap keys jwks) to verify them")
		}
		return errNotVerified
	}
	chains := ""
	if rep.Chains > 1 {
		chains = fmt.Sprintf(" in %d chains", rep.Chains)
	}
	end := "ends with capsnap's shutdown checkpoint"
	if !rep.Final {
		end = fmt.Sprintf("live: %d lines after the last checkpoint not yet signed", rep.Pending)
	}
	fmt.Fprintf(stdout, "%s: verified: %d lines%s (last seq %d), %d checkpoints signed by %s; %s\n",
		strings.Join(files, ", "), rep.Lines, chains, rep.LastSeq, rep.Checkpoints, strings.Join(rep.KeyIDs, ", "), end)
	return nil
}

// errNoMatch is audit query's answer when no line matched.
var errNoMatch = errors.New("audit query: no line matched")

// auditQuery prints the decision lines of files (stdin if none) that q,
// bounded by since and until, matches. Exit 0: some matched; 1: none; 2:
// usage, or a file that cannot be read.
func auditQuery(q audit.Query, since, until string, files []string, stdin io.Reader, stdout io.Writer, now time.Time) error {
	var err error
	if q.Since, err = pointInTime(since, now); err != nil {
		return usageError{fmt.Sprintf("audit query: --since: %v", err)}
	}
	if q.Until, err = pointInTime(until, now); err != nil {
		return usageError{fmt.Sprintf("audit query: --until: %v", err)}
	}
	if q.Decision != "" && q.Decision != "allow" && q.Decision != "deny" {
		return usageError{fmt.Sprintf("audit query: --decision %q is not allow or deny", q.Decision)}
	}
	matched := 0
	read := func(name string, r io.Reader) error {
		n, err := audit.Select(r, stdout, q)
		matched += n
		if err != nil {
			return fmt.Errorf("audit query: %s: %w", name, err)
		}
		return nil
	}
	if len(files) == 0 {
		if err := read("stdin", stdin); err != nil {
			return err
		}
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("audit query: %w", err)
		}
		err = read(name, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	if matched == 0 {
		return errNoMatch
	}
	return nil
}

// pointInTime reads s as an RFC 3339 time or a duration before now; empty
// is the zero time, no bound.
func pointInTime(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a positive duration", s)
	}
	return now.Add(-d), nil
}
