package fleet

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultFileLimit is the open-file limit RaiseFileLimit asks for: room for
// 10,000 agents' connections on each side, plus the bootstrap connections
// and the API server's.
const DefaultFileLimit = 65536

// RaiseFileLimit raises this process's RLIMIT_NOFILE (soft and, if needed and
// allowed, hard) to at least n and returns the soft limit now in force.
// Processes started afterwards inherit it: an explicit Setrlimit stops Go
// from restoring the original limit in children.
func RaiseFileLimit(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur >= n {
		// Set it anyway, so that children inherit the current value rather
		// than the one this process started with.
		return lim.Cur, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	want := syscall.Rlimit{Cur: n, Max: max(lim.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		// Not allowed to raise the hard limit: go as high as it is.
		want = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err2 != nil {
			return lim.Cur, fmt.Errorf("setrlimit: %w", errors.Join(err, err2))
		}
	}
	return want.Cur, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// ProcUsage is what the kernel says one process has used so far.
type ProcUsage struct {
	// CPU is user plus system time.
	CPU time.Duration
	// RSS is the resident set size.
	RSS int64
	// Threads is the number of OS threads.
	Threads int
	// FDLimit is the soft RLIMIT_NOFILE.
	FDLimit int64
}

// ReadProc reads /proc/<pid>/stat, status and limits; pid 0 is this process.
func ReadProc(pid int) (ProcUsage, error) {
	p := "self"
	if pid != 0 {
		p = strconv.Itoa(pid)
	}
	var u ProcUsage
	stat, err := os.ReadFile("/proc/" + p + "/stat")
	if err != nil {
		return u, err
	}
	// The command name (field 2) may hold spaces; fields resume after ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return u, fmt.Errorf("/proc/%s/stat: unexpected format", p)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return u, fmt.Errorf("/proc/%s/stat: too few fields", p)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return u, fmt.Errorf("/proc/%s/stat: %w", p, err)
	}
	u.CPU = time.Duration(ut+st) * time.Second / clockTicks
	status, err := os.ReadFile("/proc/" + p + "/status")
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			kb, _ := strconv.ParseInt(fields[0], 10, 64)
			u.RSS = kb << 10
		case "Threads":
			u.Threads, _ = strconv.Atoi(fields[0])
		}
	}
	limits, err := os.ReadFile("/proc/" + p + "/limits")
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(limits), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				u.FDLimit, _ = strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return u, nil
}

// CPUMeter measures the CPU time of a set of processes over a window.
type CPUMeter struct {
	pids  map[string]int
	start map[string]time.Duration
	at    time.Time
}

// StartCPU starts measuring the named processes (pid 0: this process).
func StartCPU(pids map[string]int) (*CPUMeter, error) {
	m := &CPUMeter{pids: pids, start: map[string]time.Duration{}, at: time.Now()}
	for name, pid := range pids {
		u, err := ReadProc(pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		m.start[name] = u.CPU
	}
	return m, nil
}

// CPUWindow is the CPU each process used in a window of Wall time.
type CPUWindow struct {
	Wall time.Duration
	CPU  map[string]time.Duration
}

// Total is the CPU time of every measured process.
func (w CPUWindow) Total() time.Duration {
	var t time.Duration
	for _, c := range w.CPU {
		t += c
	}
	return t
}

// Stop returns the CPU used since StartCPU.
func (m *CPUMeter) Stop() (CPUWindow, error) {
	w := CPUWindow{Wall: time.Since(m.at), CPU: map[string]time.Duration{}}
	for name, pid := range m.pids {
		u, err := ReadProc(pid)
		if err != nil {
			return w, fmt.Errorf("%s: %w", name, err)
		}
		w.CPU[name] = u.CPU - m.start[name]
	}
	return w, nil
}

// SourceAddr is the loopback source address of agent i: 127.64.0.1 and up,
// skipping .0 and .255 in the last octet, so four million agents fit in
// 127.64.0.0/10 and none is 127.0.0.1, where the servers listen. Indexes
// beyond that wrap around.
func SourceAddr(i int) netip.Addr {
	if i < 0 {
		i = -i
	}
	hi, lo := i/254, i%254+1
	return netip.AddrFrom4([4]byte{127, byte(64 + (hi>>8)&0x3f), byte(hi), byte(lo)})
}
