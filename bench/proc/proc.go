// Package proc reads a running process's CPU time and resident memory
// from Linux's /proc, to charge a server for the requests it answered.
package proc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Tick is the unit of /proc/PID/stat's CPU times. Linux fixes it (USER_HZ)
// at 100 per second for every architecture's user-space ABI, whatever the
// kernel's own HZ, so this needs no sysconf (and no cgo). It is also the
// resolution of CPU: a measurement is good to one tick (10 ms), which is
// why runs are long enough to use hundreds of them.
const Tick = 10 * time.Millisecond

// CPU is the user plus system CPU time pid has used so far, all its
// threads together.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	return ParseStat(b)
}

// ParseStat reads utime + stime out of a /proc/PID/stat line.
func ParseStat(b []byte) (time.Duration, error) {
	// The command name, field 2, is in parentheses and may hold spaces
	// and parentheses of its own: count fields from the last ')'.
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, fmt.Errorf("cpu time: no command name in %q", b)
	}
	fields := strings.Fields(string(b[end+1:]))
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	const utime, stime = 14 - 3, 15 - 3
	if len(fields) <= stime {
		return 0, fmt.Errorf("cpu time: short stat line %q", b)
	}
	var ticks int64
	for _, f := range []string{fields[utime], fields[stime]} {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu time: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * Tick, nil
}

// Memory is a process's resident memory now (VmRSS) and at its peak
// (VmHWM), in bytes.
type Memory struct {
	RSS  int64 `json:"rss_bytes"`
	Peak int64 `json:"hwm_bytes"`
}

// ReadMemory reads pid's resident memory.
func ReadMemory(pid int) (Memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Memory{}, fmt.Errorf("memory: %w", err)
	}
	return ParseStatus(b)
}

// ParseStatus reads VmRSS and VmHWM out of /proc/PID/status.
func ParseStatus(b []byte) (Memory, error) {
	var m Memory
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		kb, ok := strings.CutSuffix(strings.TrimSpace(value), " kB")
		n, err := strconv.ParseInt(kb, 10, 64)
		if !ok || err != nil {
			return Memory{}, fmt.Errorf("memory: %s is %q", key, value)
		}
		if key == "VmRSS" {
			m.RSS = n << 10
		} else {
			m.Peak = n << 10
		}
		found++
	}
	if found != 2 {
		return Memory{}, fmt.Errorf("memory: no VmRSS and VmHWM in /proc status")
	}
	return m, nil
}
