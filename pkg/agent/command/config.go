package command

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
)

// Config configures one exec handler. Everything about the process comes
// from here; a job only contributes its payload (on stdin) and its metadata
// (in JETFLEET_* variables).
type Config struct {
	// Command is the absolute path of the program to run. Required: no
	// PATH lookup, so what runs does not depend on the agent's environment.
	Command string `koanf:"command"`
	// Args are the program's arguments, passed as they are (no shell).
	Args []string `koanf:"args"`
	// Dir is the absolute working directory. Defaults to a fresh private
	// directory per attempt, removed when the attempt ends.
	Dir string `koanf:"dir"`
	// Env sets variables of the program's environment.
	Env map[string]string `koanf:"env"`
	// InheritEnv names variables of the agent's environment the program
	// gets too. Nothing else of the agent's environment is passed on, and
	// never a JETFLEET_* variable (those configure the agent, secrets
	// included). PATH defaults to DefaultPath when neither sets it.
	InheritEnv []string `koanf:"inherit_env"`
	// KillGrace is how long the process group has between SIGTERM and
	// SIGKILL when the attempt times out or is cancelled, or when the
	// program exits and leaves processes behind. Defaults to 5s.
	KillGrace time.Duration `koanf:"kill_grace"`
	// RetryableExitCodes fail the attempt so that the job is retried
	// (while attempts remain), whatever OtherExitCodes says.
	RetryableExitCodes []int `koanf:"retryable_exit_codes"`
	// NonRetryableExitCodes fail the job for good: it is dead-lettered.
	NonRetryableExitCodes []int `koanf:"non_retryable_exit_codes"`
	// OtherExitCodes is what any other non-zero exit code means:
	// "retryable" or "non_retryable". Defaults to retryable.
	OtherExitCodes string `koanf:"other_exit_codes"`
	// Limits are resource limits of the program (setrlimit).
	Limits Limits `koanf:"limits"`
}

// Limits are per-process resource limits set with setrlimit(2) before the
// program starts; its children inherit them. Zero leaves a limit as the
// agent has it.
type Limits struct {
	// Memory caps the address space (RLIMIT_AS): allocations beyond it
	// fail. It counts virtual memory, so runtimes that reserve large
	// address ranges up front (a JVM, Go's race detector) need room.
	Memory config.ByteSize `koanf:"memory"`
	// CPUTime caps CPU time (RLIMIT_CPU, whole seconds, rounded up): the
	// program gets SIGXCPU at the limit and SIGKILL a second later.
	CPUTime time.Duration `koanf:"cpu_time"`
	// OpenFiles caps open file descriptors (RLIMIT_NOFILE). Unset while
	// another limit is set, the program's soft limit is the agent's hard
	// limit less one (the launcher is a Go program, and Go raises its own
	// soft limit), not the soft limit the agent started with.
	OpenFiles int `koanf:"open_files"`
	// Processes caps the processes and threads of the user the agent runs
	// as (RLIMIT_NPROC), counted across the whole user, not just this job.
	// The kernel does not enforce it for root (CAP_SYS_RESOURCE or
	// CAP_SYS_ADMIN): run the agent as an unprivileged user for it to hold.
	Processes int `koanf:"processes"`
}

// IsZero reports whether no limit is set.
func (l Limits) IsZero() bool { return l == Limits{} }

// Defaults of Config.
const (
	DefaultKillGrace = 5 * time.Second
	// DefaultPath is the program's PATH when neither Env nor InheritEnv sets one.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Values of Config.OtherExitCodes.
const (
	ExitRetryable    = "retryable"
	ExitNonRetryable = "non_retryable"
)

// WithDefaults returns c with zero values replaced by defaults.
func (c Config) WithDefaults() Config {
	if c.KillGrace == 0 {
		c.KillGrace = DefaultKillGrace
	}
	if c.OtherExitCodes == "" {
		c.OtherExitCodes = ExitRetryable
	}
	return c
}

// EnvPrefix starts the names of the variables that carry job metadata. The
// agent's own configuration variables start with it too, so no program gets
// any of those: Env may not set them and InheritEnv may not name them.
const EnvPrefix = "JETFLEET_"

// Validate checks c; keys are reported below section (for example
// "handlers.resize").
func (c Config) Validate(section string) error {
	key := func(k string) string { return section + "." + k }
	var errs []error
	switch {
	case c.Command == "":
		errs = append(errs, config.Invalid(key("command"), "is required: the absolute path of the program to run"))
	case !filepath.IsAbs(c.Command):
		errs = append(errs, config.Invalid(key("command"), "must be an absolute path (no PATH lookup), got %q", c.Command))
	}
	for _, a := range append([]string{c.Command}, c.Args...) {
		if strings.ContainsRune(a, 0) {
			errs = append(errs, config.Invalid(key("args"), "must not contain NUL bytes"))
			break
		}
	}
	if c.Dir != "" && !filepath.IsAbs(c.Dir) {
		errs = append(errs, config.Invalid(key("dir"), "must be an absolute path, got %q", c.Dir))
	}
	for name := range c.Env {
		if err := checkEnvName(name); err != nil {
			errs = append(errs, config.Invalid(key("env"), "%v", err))
		}
	}
	for _, name := range c.InheritEnv {
		if err := checkEnvName(name); err != nil {
			errs = append(errs, config.Invalid(key("inherit_env"), "%v", err))
		}
	}
	if c.KillGrace < 0 {
		errs = append(errs, config.Invalid(key("kill_grace"), "must not be negative, got %s", c.KillGrace))
	}
	seen := map[int]string{}
	for _, list := range []struct {
		name  string
		codes []int
	}{{"retryable_exit_codes", c.RetryableExitCodes}, {"non_retryable_exit_codes", c.NonRetryableExitCodes}} {
		for _, code := range list.codes {
			if code < 1 || code > 255 {
				errs = append(errs, config.Invalid(key(list.name), "exit codes are 1 to 255, got %d", code))
				continue
			}
			if other, dup := seen[code]; dup && other != list.name {
				errs = append(errs, config.Invalid(key(list.name), "exit code %d is also in %s", code, other))
			}
			seen[code] = list.name
		}
	}
	switch c.OtherExitCodes {
	case "", ExitRetryable, ExitNonRetryable:
	default:
		errs = append(errs, config.Invalid(key("other_exit_codes"), "must be %s or %s, got %q", ExitRetryable, ExitNonRetryable, c.OtherExitCodes))
	}
	l := c.Limits
	if l.Memory < 0 {
		errs = append(errs, config.Invalid(key("limits.memory"), "must not be negative"))
	} else if l.Memory > 0 && l.Memory < 1<<20 {
		errs = append(errs, config.Invalid(key("limits.memory"), "must be at least 1MiB (no program starts with less), got %d bytes", l.Memory))
	}
	if l.CPUTime < 0 {
		errs = append(errs, config.Invalid(key("limits.cpu_time"), "must not be negative, got %s", l.CPUTime))
	}
	if l.OpenFiles < 0 || (l.OpenFiles > 0 && l.OpenFiles < 4) {
		errs = append(errs, config.Invalid(key("limits.open_files"), "must be at least 4 (stdin, stdout, stderr and one more), got %d", l.OpenFiles))
	}
	if l.Processes < 0 {
		errs = append(errs, config.Invalid(key("limits.processes"), "must not be negative, got %d", l.Processes))
	}
	return errors.Join(errs...)
}

func checkEnvName(name string) error {
	if name == "" || strings.ContainsAny(name, "=\x00") {
		return fmt.Errorf("%q is not a variable name", name)
	}
	if strings.HasPrefix(strings.ToUpper(name), EnvPrefix) {
		return fmt.Errorf("%s: %s* variables are the agent's own and the job's metadata", name, EnvPrefix)
	}
	switch strings.ToUpper(name) {
	case "TRACEPARENT", "TRACESTATE":
		return fmt.Errorf("%s is set from the job's trace", name)
	}
	return nil
}
