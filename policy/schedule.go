package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"
	// The zones travel with the binary: a container without a tz
	// database must not refuse, or misread, a schedule.
	_ "time/tzdata"

	"go.yaml.in/yaml/v3"

	"github.com/capsnap/capsnap/deny"
)

// This file is the whole of the schedule kind: a newcomer's model of how a
// rule kind is added (see Kind).

func init() { register(scheduleKind{}) }

// Schedule allows a tool's calls, or a grant's, only inside time windows
// of a named time zone: money moves Mon–Fri 09:00–17:00 Europe/Tallinn.
//
//	schedule:
//	  zone: Europe/Tallinn
//	  windows:
//	    - {days: [mon-fri], from: "09:00", to: "17:00"}
//
// A call is allowed if its time, in the zone, falls in any window: on one
// of its days (every day if none are named), at or after from and before
// to ("24:00" is midnight at the day's end). A window past midnight is
// two windows. A call outside every window is denied outside_schedule
// with when the next window opens (data.retry_at). The zone is read from
// the tz database, so its clock follows daylight saving time.
type Schedule struct {
	Zone    string   `yaml:"zone"`
	Windows []Window `yaml:"windows"`
}

// Window is one time window of a Schedule.
type Window struct {
	// Days are three-letter weekdays (mon … sun) or ranges of them
	// (mon-fri); none means every day.
	Days []string `yaml:"days,omitempty"`
	// From and To are HH:MM, From before To.
	From string `yaml:"from"`
	To   string `yaml:"to"`
}

// scheduleKind only reads the call's time, so its term runs among the
// constraints', before anything is recorded.
type scheduleKind struct{}

func (scheduleKind) Key() string   { return "schedule" }
func (scheduleKind) Stage() int    { return 15 }
func (scheduleKind) OnGrant() bool { return true }

func (scheduleKind) Compile(s *Site, value *yaml.Node) (Rules, error) {
	var sc *Schedule
	if err := s.Decode("schedule", value, &sc); err != nil || sc == nil {
		return (*schedule)(nil), err
	}
	field := s.At("schedule")
	if sc.Zone == "" {
		return nil, fmt.Errorf("%s.zone: required, a tz database name like Europe/Tallinn or UTC", field)
	}
	loc, err := time.LoadLocation(sc.Zone)
	if err != nil || sc.Zone == "Local" {
		return nil, fmt.Errorf("%s.zone: %q is not a tz database name like Europe/Tallinn or UTC", field, sc.Zone)
	}
	if len(sc.Windows) == 0 {
		return nil, fmt.Errorf("%s.windows: at least one window is required", field)
	}
	c := &schedule{field: field, zone: sc.Zone, loc: loc}
	for i, w := range sc.Windows {
		cw, err := compileWindow(fmt.Sprintf("%s.windows[%d]", field, i), w)
		if err != nil {
			return nil, err
		}
		c.windows = append(c.windows, cw)
	}
	slices.SortFunc(c.windows, func(a, b window) int { return strings.Compare(a.String(), b.String()) })
	c.windows = slices.CompactFunc(c.windows, func(a, b window) bool { return a.String() == b.String() })
	return c, nil
}

func (scheduleKind) Apply(tool, grant Rules) Applied {
	return schedules{tool.(*schedule), grant.(*schedule)}
}

var weekdays = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

// window is a compiled Window: days a set of time.Weekday, from and to
// minutes of the day.
type window struct {
	days     [7]bool
	from, to int
}

func compileWindow(field string, w Window) (window, error) {
	var c window
	for j, d := range w.Days {
		first, last, isRange := strings.Cut(d, "-")
		a, b := slices.Index(weekdays, first), slices.Index(weekdays, last)
		if !isRange {
			b = a
		}
		if a < 0 || b < 0 {
			return c, fmt.Errorf("%s.days[%d]: %q is not a weekday (mon, tue, wed, thu, fri, sat, sun) or a range of them (mon-fri)", field, j, d)
		}
		for i := a; ; i = (i + 1) % 7 {
			c.days[i] = true
			if i == b {
				break
			}
		}
	}
	if len(w.Days) == 0 {
		c.days = [7]bool{true, true, true, true, true, true, true}
	}
	var err error
	if c.from, err = minuteOfDay(w.From); err != nil {
		return c, fmt.Errorf("%s.from: %w", field, err)
	}
	if c.to, err = minuteOfDay(w.To); err != nil {
		return c, fmt.Errorf("%s.to: %w", field, err)
	}
	if c.from >= c.to {
		return c, fmt.Errorf("%s: from %s is not before to %s (a window past midnight is two windows)", field, w.From, w.To)
	}
	return c, nil
}

// minuteOfDay reads HH:MM, 00:00 to 24:00.
func minuteOfDay(s string) (int, error) {
	digit := func(i int) int { return int(s[i] - '0') }
	if len(s) != 5 || s[2] != ':' || strings.IndexFunc(s[:2]+s[3:], func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return 0, fmt.Errorf("%q is not a time of day HH:MM", s)
	}
	h, m := digit(0)*10+digit(1), digit(3)*10+digit(4)
	if h > 24 || m > 59 || (h == 24 && m != 0) {
		return 0, fmt.Errorf("%q is not a time of day HH:MM from 00:00 to 24:00", s)
	}
	return h*60 + m, nil
}

func clock(minute int) string { return fmt.Sprintf("%02d:%02d", minute/60, minute%60) }

// String says the window as it is digested: days in week order from
// Monday, then the times.
func (w window) String() string {
	var days []string
	for i := range 7 {
		if d := (i + 1) % 7; w.days[d] {
			days = append(days, weekdays[d])
		}
	}
	return strings.Join(days, ",") + " " + clock(w.from) + "-" + clock(w.to)
}

// holds reports whether local, a time in the schedule's zone, is inside w.
func (w window) holds(local time.Time) bool {
	m := local.Hour()*60 + local.Minute()
	return w.days[local.Weekday()] && w.from <= m && m < w.to
}

// schedule is a compiled Schedule; nil is none.
type schedule struct {
	field   string
	zone    string
	loc     *time.Location
	windows []window // sorted by String, distinct
}

type digestedSchedule struct {
	Zone    string   `json:"zone"`
	Windows []string `json:"windows"`
}

// Digested implements Rules: the zone and each window as String says it;
// none leaves the key out.
func (s *schedule) Digested() any {
	if s == nil {
		return nil
	}
	d := digestedSchedule{Zone: s.zone}
	for _, w := range s.windows {
		d.Windows = append(d.Windows, w.String())
	}
	return d
}

// Reads implements Rules: a schedule reads no argument.
func (*schedule) Reads() []Reading { return nil }

func (s *schedule) describe() string {
	parts := make([]string, len(s.windows))
	for i, w := range s.windows {
		parts[i] = w.String()
	}
	return strings.Join(parts, "; ") + " " + s.zone
}

// inside reports whether t is inside a window; if not, next is when the
// next window opens (zero if none does within a week and a day).
func (s *schedule) inside(t time.Time) (ok bool, next time.Time) {
	local := t.In(s.loc)
	for _, w := range s.windows {
		if w.holds(local) {
			return true, time.Time{}
		}
	}
	y, m, d := local.Date()
	for day := range 8 {
		for _, w := range s.windows {
			start := time.Date(y, m, d+day, w.from/60, w.from%60, 0, 0, s.loc)
			if start.After(t) && w.holds(start) && (next.IsZero() || start.Before(next)) {
				next = start
			}
		}
		if !next.IsZero() {
			break
		}
	}
	return false, next
}

// Check implements Term: the call's time (Call.Now) inside a window, else
// outside_schedule with when the next one opens. A call without a time
// is outside every window: it fails closed.
func (s *schedule) Check(call Call) error {
	if call.Now.IsZero() {
		return deny.Errorf(deny.OutsideSchedule, "%s/%s may be called only %s (%s), and the call has no time", call.Server, call.Tool, s.describe(), s.field)
	}
	ok, next := s.inside(call.Now)
	if ok {
		return nil
	}
	e := deny.Errorf(deny.OutsideSchedule, "%s/%s may be called only %s (%s); it is %s there now", call.Server, call.Tool, s.describe(), s.field, call.Now.In(s.loc).Format("Mon 15:04"))
	if !next.IsZero() {
		e.Detail += ": retry at " + next.Format(time.RFC3339)
		e.RetryAt = next
	}
	return e
}

// Precheck implements Prechecker: Check, when the call's time is known.
func (s *schedule) Precheck(call Call) error {
	if call.Now.IsZero() {
		return nil
	}
	return s.Check(call)
}

// Records implements Term: a schedule only reads the call's time.
func (*schedule) Records() bool { return false }

var _ Prechecker = (*schedule)(nil)

// schedules are the tool's schedule and the deciding grant's: a call must
// be inside both.
type schedules [2]*schedule

// Terms implements Applied.
func (ss schedules) Terms() []Term {
	var out []Term
	for _, s := range ss {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// Looser implements Applied, the tool's schedule to the tool's and the
// grant's to the grant's: removed, in another zone, or allowing a minute
// of the week it did not (a shorter window is tighter, a longer looser).
func (ss schedules) Looser(next Applied) []string {
	var out []string
	for i, old := range ss {
		n := next.(schedules)[i]
		switch {
		case old == nil:
		case n == nil:
			out = append(out, fmt.Sprintf("schedule (%s) removed", old.describe()))
		case n.zone != old.zone:
			out = append(out, fmt.Sprintf("schedule zone changed from %s to %s", old.zone, n.zone))
		default:
			if wider := n.minutes().without(old.minutes()); wider != "" {
				out = append(out, fmt.Sprintf("schedule now also allows %s %s (was %s)", wider, n.zone, old.describe()))
			}
		}
	}
	return out
}

// week is a set of the minutes of a week, from Sunday 00:00.
type week [7 * 24 * 60]bool

func (s *schedule) minutes() *week {
	var w week
	for _, win := range s.windows {
		for d, on := range win.days {
			if on {
				for m := win.from; m < win.to; m++ {
					w[d*24*60+m] = true
				}
			}
		}
	}
	return &w
}

// without says, for people, the minutes of w that o lacks, day by day:
// "sat 09:00-12:00".
func (w *week) without(o *week) string {
	const day = 24 * 60
	var spans []string
	for m := 0; m < len(w); {
		if !w[m] || o[m] {
			m++
			continue
		}
		start, d := m, m/day
		for m < len(w) && w[m] && !o[m] && m/day == d {
			m++
		}
		spans = append(spans, fmt.Sprintf("%s %s-%s", weekdays[d], clock(start-d*day), clock(m-d*day)))
	}
	return strings.Join(spans, ", ")
}

// Explain implements Applied: whether the call's time is inside.
func (ss schedules) Explain(call Call) Explanation {
	var e Explanation
	for _, s := range ss {
		if s == nil {
			continue
		}
		line := fmt.Sprintf("schedule (%s): %s: ", s.field, s.describe())
		if call.Now.IsZero() {
			e.Lines = append(e.Lines, line+"not evaluated, no time given")
			e.Unless = "it is made inside its schedule"
			e.Otherwise = []deny.Reason{deny.OutsideSchedule}
			continue
		}
		at := call.Now.In(s.loc).Format("Mon 2006-01-02 15:04 MST")
		if ok, next := s.inside(call.Now); ok {
			e.Lines = append(e.Lines, line+"inside at "+at)
		} else {
			line += "OUTSIDE at " + at
			if !next.IsZero() {
				line += "; the next window opens " + next.Format(time.RFC3339)
			}
			e.Lines = append(e.Lines, line)
			e.Denials = append(e.Denials, Denial{s.field, deny.OutsideSchedule})
		}
	}
	if e.Lines == nil {
		e.Lines = []string{"no schedule"}
	}
	return e
}
