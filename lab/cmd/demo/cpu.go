package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The CPU an order costs: every process class of a run (the instances, the
// database server, each Redis, etcd or ZooKeeper, the load generator) is
// read from the kernel's own accounting, /proc/PID/stat's utime and stime,
// before and after a window of load. Linux only; a component whose
// processes cannot be found is reported as not measured, never a failure.

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture the demo runs on (getconf CLK_TCK), and fixed by the
// kernel's ABI rather than by its configured HZ.
const clockTicks = 100

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// procStat is the part of /proc/PID/stat the demo reads.
type procStat struct {
	PPID int
	// User and System are the process's own CPU (all its threads);
	// ChildUser and ChildSystem that of the children it has reaped.
	User, System, ChildUser, ChildSystem time.Duration
}

// parseStat reads one /proc/PID/stat line. The command, in parentheses,
// may hold spaces and parentheses itself, so the fields are counted from
// the last ")".
func parseStat(line string) (procStat, error) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("stat %q: no command", line)
	}
	// After ")": state (field 3), ppid (4), …, utime (14), stime (15),
	// cutime (16), cstime (17).
	f := strings.Fields(line[i+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("stat %q: %d fields after the command", line, len(f))
	}
	var n [5]int64
	for j, idx := range []int{1, 11, 12, 13, 14} {
		v, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("stat field %d: %w", idx+3, err)
		}
		n[j] = v
	}
	return procStat{PPID: int(n[0]), User: ticks(n[1]), System: ticks(n[2]), ChildUser: ticks(n[3]), ChildSystem: ticks(n[4])}, nil
}

// readStat reads /proc/PID/stat.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	return parseStat(string(b))
}

// children lists the live children of a single-threaded parent (a
// postmaster), from /proc/PID/task/PID/children, or, on a kernel without
// that file, from every process's parent.
func children(pid int) ([]int, error) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)); err == nil {
		var out []int
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
		return out, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := readStat(c); err == nil && s.PPID == pid {
			out = append(out, c)
		}
	}
	return out, nil
}

// treeCPU is a server's CPU so far: its own, its live children's (the
// backends of a PostgreSQL postmaster) and that of the children it has
// reaped (backends that exited, whose CPU the kernel adds to the parent's
// cutime and cstime when it waits for them). With keep, only the children
// it keeps count, and the reaped ones not at all: who they were is lost.
func treeCPU(pid int, keep func(child int) bool) (time.Duration, error) {
	s, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	total := s.User + s.System
	if keep == nil {
		total += s.ChildUser + s.ChildSystem
	}
	kids, err := children(pid)
	if err != nil {
		return total, nil // the parent's own figures stand
	}
	for _, c := range kids {
		if keep != nil && !keep(c) {
			continue
		}
		cs, err := readStat(c)
		if err != nil {
			continue // exited between the listing and the read: it is in cutime now
		}
		total += cs.User + cs.System
	}
	return total, nil
}

// pgBackendDatabase reads a PostgreSQL child's process title ("postgres:
// [cluster: ]user database host(port) activity") and returns the database
// of a client backend; client is false for the postmaster's own workers
// (checkpointer, WAL writer, autovacuum), and for any title it cannot
// read.
func pgBackendDatabase(title string) (database string, client bool) {
	f := strings.Fields(title)
	for i := 2; i < len(f); i++ {
		if f[i] == "[local]" || (strings.HasSuffix(f[i], ")") && strings.Contains(f[i], "(")) {
			return f[i-1], true
		}
	}
	return "", false
}

// pgKeepDatabase keeps the postmaster's workers and the backends of one
// database: the clients of other databases on the same server (tests
// running beside the demo) are not the demo's cost.
func pgKeepDatabase(database string) func(pid int) bool {
	return func(pid int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			return false
		}
		db, client := pgBackendDatabase(strings.ReplaceAll(string(b), "\x00", " "))
		return !client || db == database
	}
}

// listenInodes returns the socket inodes listening on port in a
// /proc/net/tcp or tcp6 table.
func listenInodes(r io.Reader, port int) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // the header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" { // 0A: TCP_LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		out = append(out, f[9])
	}
	return out, sc.Err()
}

// errNotFound: no process could be found for an address.
var errNotFound = errors.New("no process found")

// listenerPID finds the process listening on a loopback address's port:
// its socket's inode in /proc/net/tcp{,6}, then the process holding that
// inode among every process's descriptors (which needs the same user as
// the server, or root). A server on another host cannot be measured.
func listenerPID(addr string) (int, error) {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return 0, fmt.Errorf("%s is not on this machine", addr)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", addr, err)
	}
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		found, err := listenInodes(f, port)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", table, err)
		}
		for _, in := range found {
			inodes["socket:["+in+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("nothing listens on %s: %w", addr, errNotFound)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if link, err := os.Readlink(fd); err == nil && inodes[link] {
			pid, err := strconv.Atoi(strings.Split(fd, "/")[2])
			if err == nil {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("the process listening on %s (its descriptors unreadable to this user?): %w", addr, errNotFound)
}

// machineCPU is /proc/stat's first line: the busy and the total time of
// every core so far (busy: all but idle and iowait).
func machineCPU() (busy, total time.Duration, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, 0, err
	}
	return parseMachineCPU(line)
}

// parseMachineCPU reads the "cpu" line of /proc/stat: user nice system
// idle iowait irq softirq steal (guest time is already in user).
func parseMachineCPU(line string) (busy, total time.Duration, err error) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var v [8]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
	}
	idle := v[3] + v[4]
	all := v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]
	return ticks(all - idle), ticks(all), nil
}
