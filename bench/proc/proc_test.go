package proc

import (
	"os"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// A command name with a space and a parenthesis, as a process may
	// name itself.
	line := "4242 (we ird) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 37 0 0 20 0 9 0 100 1000000 2000 18446744073709551615\n"
	got, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := 287 * Tick; got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := ParseStat([]byte("4242 (x) S 1 2")); err == nil {
		t.Fatal("parsed a short line")
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tcapsnap\nVmPeak:\t 1300 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n"
	m, err := ParseStatus([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if m.RSS != 40<<20 || m.Peak != 50<<20 {
		t.Fatalf("got %+v", m)
	}
	if _, err := ParseStatus([]byte("Name:\tx\nVmRSS:\t1 kB\n")); err == nil {
		t.Fatal("parsed a status without VmHWM")
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
