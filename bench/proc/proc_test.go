package proc

import (
	"os"
	"testing"
	"time"
)

// testdata/proc holds two processes as /proc shows them: 4242, whose
// command name has a space and a parenthesis, as a process may name
// itself; and 4243, whose stat line is cut short and whose status lacks
// VmHWM.
func TestCPUAndMemory(t *testing.T) {
	got, err := cpuIn("testdata/proc", 4242)
	if err != nil {
		t.Fatal(err)
	}
	if want := 287 * Tick; got != want {
		t.Fatalf("cpu: got %v, want %v", got, want)
	}
	m, err := memoryIn("testdata/proc", 4242)
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS != 40<<20 || m.Peak != 50<<20 {
		t.Fatalf("memory: got %+v", m)
	}
	if _, err := cpuIn("testdata/proc", 4243); err == nil {
		t.Fatal("read the CPU time of a short stat line")
	}
	if _, err := memoryIn("testdata/proc", 4243); err == nil {
		t.Fatal("read the memory of a status without VmHWM")
	}
}

// Reading our own process works on any Linux, network or not.
func TestSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	// Spin until the kernel has charged us a clock tick: on a loaded
	// machine 30 ms of wall time may not get one.
	start := time.Now()
	cpu, err := CPU(os.Getpid())
	for err == nil && cpu <= 0 && time.Since(start) < 10*time.Second {
		cpu, err = CPU(os.Getpid())
	}
	if err != nil || cpu <= 0 {
		t.Fatalf("CPU = %v, %v after %v of spinning", cpu, err, time.Since(start))
	}
	m, err := ReadMemory(os.Getpid())
	if err != nil || m.RSS <= 0 || m.Peak < m.RSS {
		t.Fatalf("ReadMemory = %+v, %v", m, err)
	}
}
