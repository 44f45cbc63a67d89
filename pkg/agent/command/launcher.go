package command

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// LauncherArg is the hidden first argument that makes a binary calling
// RunLauncherIfRequested act as the launcher of a limited program.
const LauncherArg = "__jetfleet_exec_launcher"

// selfExe re-executes the running binary. In the forked child it still
// names the agent's image, even when the file was replaced since.
const selfExe = "/proc/self/exe"

// launcherInstalled is set once RunLauncherIfRequested ran in this process.
var launcherInstalled atomic.Bool

// RunLauncherIfRequested must be the first thing main (or TestMain) does in
// a binary that runs exec handlers with resource limits. Go's os/exec cannot
// set resource limits on a child, so such a handler starts its own binary
// again with LauncherArg first: then this function sets the limits with
// setrlimit(2) and replaces the process with the configured program
// (execve keeps the limits, the process group and the parent-death signal),
// and never returns. Otherwise it returns at once.
func RunLauncherIfRequested() {
	launcherInstalled.Store(true)
	if len(os.Args) < 2 || os.Args[1] != LauncherArg {
		return
	}
	os.Exit(launch(os.Args[2:]))
}

// Exit codes of a launcher that could not start the program, as a shell
// uses them.
const (
	exitCannotExecute = 126
	exitNotFound      = 127
)

// launcherArgs are the arguments after LauncherArg: the limits, the
// program, then its argv (argv[0] first).
func launcherArgs(l Limits, program string, argv []string) []string {
	return append([]string{LauncherArg, encodeLimits(l), program}, argv...)
}

// launch runs in the launcher: it applies the limits and execs the program.
// It returns only on failure, with the exit code to report.
//
// Once a limit is set the launcher must not allocate: an RLIMIT_AS below
// what the Go runtime already maps makes any new mapping fail fatally. So
// everything is prepared first, the collector is off, and setting the
// limits and execve are plain system calls on prepared memory.
func launch(args []string) int {
	if len(args) < 3 {
		fmt.Fprintf(os.Stderr, "jetfleet exec launcher: want limits, program and argv, got %q\n", args)
		return exitCannotExecute
	}
	limits, err := decodeLimits(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "jetfleet exec launcher: %v\n", err)
		return exitCannotExecute
	}
	program, argv := args[1], args[2:]
	argv0p, err := syscall.BytePtrFromString(program)
	if err != nil {
		fmt.Fprintf(os.Stderr, "jetfleet exec launcher: %s: %v\n", program, err)
		return exitCannotExecute
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "jetfleet exec launcher: argv: %v\n", err)
		return exitCannotExecute
	}
	envvp, err := syscall.SlicePtrFromStrings(os.Environ())
	if err != nil {
		fmt.Fprintf(os.Stderr, "jetfleet exec launcher: environment: %v\n", err)
		return exitCannotExecute
	}
	for i := range limits {
		if err := limits[i].prepare(); err != nil {
			fmt.Fprintf(os.Stderr, "jetfleet exec launcher: read %s: %v\n", limits[i].name, err)
			return exitCannotExecute
		}
	}
	debug.SetGCPercent(-1)

	// From here on nothing may allocate.
	for i := range limits {
		if err := syscall.Setrlimit(limits[i].resource, &limits[i].lim); err != nil {
			return launchFailed("set ", limits[i].name, err, exitCannotExecute)
		}
	}
	_, _, errno := syscall.RawSyscall(syscall.SYS_EXECVE, uintptr(unsafe.Pointer(argv0p)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envvp[0])))
	if errno == syscall.ENOENT {
		return launchFailed("", program, errno, exitNotFound)
	}
	return launchFailed("", program, errno, exitCannotExecute)
}

// launchFailed reports on stderr what failed, without allocating.
func launchFailed(what, subject string, err error, code int) int {
	for _, s := range [...]string{"jetfleet exec launcher: ", what, subject, ": ", err.Error(), "\n"} {
		_, _ = os.Stderr.WriteString(s)
	}
	return code
}

type rlimit struct {
	name     string
	resource int
	value    uint64
	lim      syscall.Rlimit // what to set, from prepare
}

// prepare computes the soft and hard limit to set: value, or the hard limit
// the process already has when that is lower (only root may raise it).
// RLIMIT_CPU gets a hard limit one second above the soft one, so the
// program first gets SIGXCPU, which says why it ends, and SIGKILL only if
// it ignores that.
func (r *rlimit) prepare() error {
	var cur syscall.Rlimit
	if err := syscall.Getrlimit(r.resource, &cur); err != nil {
		return err
	}
	soft, hard := r.value, r.value
	if r.resource == unix.RLIMIT_CPU {
		hard = r.value + 1
	}
	hard = min(hard, cur.Max)
	r.lim = syscall.Rlimit{Cur: min(soft, hard), Max: hard}
	return nil
}

// limitNames map the launcher's encoding to resources.
var limitNames = []struct {
	name     string
	resource int
}{
	{"RLIMIT_AS", unix.RLIMIT_AS},
	{"RLIMIT_CPU", unix.RLIMIT_CPU},
	{"RLIMIT_NOFILE", unix.RLIMIT_NOFILE},
	{"RLIMIT_NPROC", unix.RLIMIT_NPROC},
}

// encodeLimits writes l as RLIMIT_AS=…,RLIMIT_CPU=… (set limits only), or
// "-" when none is set.
func encodeLimits(l Limits) string {
	var parts []string
	add := func(name string, v uint64) {
		if v > 0 {
			parts = append(parts, name+"="+strconv.FormatUint(v, 10))
		}
	}
	add("RLIMIT_AS", uint64(max(l.Memory, 0)))
	add("RLIMIT_CPU", cpuSeconds(l.CPUTime))
	add("RLIMIT_NOFILE", uint64(max(l.OpenFiles, 0)))
	add("RLIMIT_NPROC", uint64(max(l.Processes, 0)))
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func decodeLimits(s string) ([]rlimit, error) {
	if s == "-" {
		return nil, nil
	}
	var out []rlimit
	for _, part := range strings.Split(s, ",") {
		name, value, _ := strings.Cut(part, "=")
		v, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("limit %q: %v", part, err)
		}
		found := false
		for _, n := range limitNames {
			if n.name == name {
				out = append(out, rlimit{name: name, resource: n.resource, value: v})
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown limit %q", name)
		}
	}
	return out, nil
}

// cpuSeconds rounds d up to whole seconds.
func cpuSeconds(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Second - 1) / time.Second)
}
