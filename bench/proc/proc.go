// Package proc reads a running process's CPU time and resident memory
// from Linux's /proc, through github.com/prometheus/procfs, to charge a
// server for the requests it answered.
package proc

import (
	"fmt"
	"time"

	"github.com/prometheus/procfs"
)

// Tick is the unit of /proc/PID/stat's CPU times. Linux fixes it (USER_HZ)
// at 100 per second for every architecture's user-space ABI, whatever the
// kernel's own HZ, so this needs no sysconf (and no cgo). It is also the
// resolution of CPU: a measurement is good to one tick (10 ms), which is
// why runs are long enough to use hundreds of them.
const Tick = 10 * time.Millisecond

// CPU is the user plus system CPU time pid has used so far, all its
// threads together.
func CPU(pid int) (time.Duration, error) { return cpuIn(procfs.DefaultMountPoint, pid) }

func cpuIn(root string, pid int) (time.Duration, error) {
	p, err := process(root, pid)
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("cpu time: %w", err)
	}
	return time.Duration(st.UTime+st.STime) * Tick, nil
}

// Memory is a process's resident memory now (VmRSS) and at its peak
// (VmHWM), in bytes.
type Memory struct {
	RSS  int64 `json:"rss_bytes"`
	Peak int64 `json:"hwm_bytes"`
}

// ReadMemory reads pid's resident memory.
func ReadMemory(pid int) (Memory, error) { return memoryIn(procfs.DefaultMountPoint, pid) }

func memoryIn(root string, pid int) (Memory, error) {
	p, err := process(root, pid)
	if err != nil {
		return Memory{}, fmt.Errorf("memory: %w", err)
	}
	s, err := p.NewStatus()
	if err != nil {
		return Memory{}, fmt.Errorf("memory: %w", err)
	}
	if s.VmRSS == 0 || s.VmHWM == 0 {
		return Memory{}, fmt.Errorf("memory: no VmRSS and VmHWM in /proc/%d/status", pid)
	}
	return Memory{RSS: int64(s.VmRSS), Peak: int64(s.VmHWM)}, nil
}

func process(root string, pid int) (procfs.Proc, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return procfs.Proc{}, err
	}
	return fs.Proc(pid)
}
