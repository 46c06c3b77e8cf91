package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// Query selects decision lines of a trail by what they decided on. An
// empty field matches any value; Since and Until, when set, bound the
// line's time to [Since, Until).
type Query struct {
	Principal, Server, Tool, Reason, Decision string
	Since, Until                              time.Time
}

// maxLine bounds a line Select reads: a delivery's line lists every tool
// withheld from a listing of up to discovery.max_response_bytes.
const maxLine = 64 << 20

// Select writes to w, as they are, the decision lines of r that q matches,
// and returns how many it wrote. Checkpoints and other lines that are not
// decisions are skipped; a line that is not a JSON object is an error
// naming it: a trail is written whole lines of JSON.
func Select(r io.Reader, w io.Writer, q Query) (int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLine)
	n := 0
	for line := 1; sc.Scan(); line++ {
		var l struct {
			Log       string    `json:"log"`
			Message   string    `json:"message"`
			Time      time.Time `json:"time"`
			Principal string    `json:"principal"`
			Server    string    `json:"server_id"`
			Tool      string    `json:"tool"`
			Reason    string    `json:"reason"`
			Decision  string    `json:"decision"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return n, fmt.Errorf("line %d: %w", line, err)
		}
		if l.Log != "audit" || l.Message != "decision" || !q.matches(l.Principal, l.Server, l.Tool, l.Reason, l.Decision, l.Time) {
			continue
		}
		if _, err := w.Write(append(sc.Bytes(), '\n')); err != nil {
			return n, err
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return n, fmt.Errorf("read: %w", err)
	}
	return n, nil
}

func (q Query) matches(principal, server, tool, reason, decision string, at time.Time) bool {
	for _, f := range [...][2]string{{q.Principal, principal}, {q.Server, server}, {q.Tool, tool}, {q.Reason, reason}, {q.Decision, decision}} {
		if f[0] != "" && f[0] != f[1] {
			return false
		}
	}
	return (q.Since.IsZero() || !at.Before(q.Since)) && (q.Until.IsZero() || at.Before(q.Until))
}
