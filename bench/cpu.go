package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// processCPU returns the CPU time (user + system) this process has used.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// parseProcStat returns utime + stime from the contents of
// /proc/<pid>/stat. The command name (field 2) is in parentheses and may
// hold spaces or parentheses itself, so fields are counted from the last
// ')'.
func parseProcStat(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no command name")
	}
	f := strings.Fields(stat[i+1:])
	// After the name: state (field 3) ... utime (14), stime (15).
	if len(f) < 13 {
		return 0, fmt.Errorf("%d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("CPU time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// backendCPU sums the CPU time of the PostgreSQL backends whose
// application_name is one of names, by pid. It reads /proc, so it only sees
// a server on this machine; ok is false when it cannot.
func backendCPU(ctx context.Context, db *sql.DB, names []string) (cpu map[int]time.Duration, ok bool, err error) {
	rows, err := db.QueryContext(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1)", names)
	if err != nil {
		return nil, false, err
	}
	defer rows.Close()
	cpu = map[int]time.Duration{}
	ok = true
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return nil, false, err
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			ok = false // another machine's server, or the backend just ended
			continue
		}
		d, err := parseProcStat(string(data))
		if err != nil {
			return nil, false, fmt.Errorf("backend %d: %w", pid, err)
		}
		cpu[pid] = d
	}
	return cpu, ok, rows.Err()
}

// cpuDelta is the CPU time used between two backendCPU readings: a backend
// that started in between counts from zero, one that ended is lost (its
// time after the first reading is not known).
func cpuDelta(before, after map[int]time.Duration) time.Duration {
	var d time.Duration
	for pid, a := range after {
		d += a - before[pid]
	}
	return d
}

// IdleCPU is what a relay burns while nothing is committed: its own
// process's CPU time and that of the PostgreSQL backends serving it, as
// percent of one core.
type IdleCPU struct {
	Key     string  `json:"key"`
	Label   string  `json:"label"`
	Seconds float64 `json:"seconds"`
	// ProcessPercent is this whole process's CPU time (getrusage) over the
	// wall time, in percent of one core; only the relay runs meanwhile.
	ProcessPercent float64 `json:"process_percent_of_core"`
	// BackendPercent is the same for the relay's PostgreSQL backends
	// (/proc/<pid>/stat), -1 when the server is not on this machine.
	BackendPercent float64 `json:"backend_percent_of_core"`
	// Queries is how many claim statements the relay ran (bento only).
	Queries int64 `json:"queries,omitempty"`
}

// cpuMeter measures the CPU used during a window.
type cpuMeter struct {
	db       *sql.DB
	names    []string
	start    time.Time
	proc0    time.Duration
	backend0 map[int]time.Duration
	ok       bool
}

// startCPU starts a window: this process's CPU time and that of the
// backends named by application_name in names.
func startCPU(ctx context.Context, db *sql.DB, names []string) (*cpuMeter, error) {
	m := &cpuMeter{db: db, names: names}
	var err error
	if m.backend0, m.ok, err = backendCPU(ctx, db, names); err != nil {
		return nil, err
	}
	if m.proc0, err = processCPU(); err != nil {
		return nil, err
	}
	m.start = time.Now()
	return m, nil
}

// stop ends the window and returns the percentages of one core.
func (m *cpuMeter) stop(ctx context.Context) (wall time.Duration, process, backend float64, err error) {
	proc1, err := processCPU()
	if err != nil {
		return 0, 0, 0, err
	}
	wall = time.Since(m.start)
	b1, ok, err := backendCPU(ctx, m.db, m.names)
	if err != nil {
		return 0, 0, 0, err
	}
	process = 100 * float64(proc1-m.proc0) / float64(wall)
	backend = -1
	if ok && m.ok {
		backend = 100 * float64(cpuDelta(m.backend0, b1)) / float64(wall)
	}
	return wall, process, backend, nil
}
