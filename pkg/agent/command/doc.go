// Package command is the agent's built-in exec handler: it runs a
// configured program for each job of a kind.
//
// # What a job can and cannot choose
//
// The program and its arguments come only from the handler's Config. A job
// contributes its payload, written to the program's stdin, and its metadata,
// in environment variables; nothing of a job is ever put into argv or read
// by a shell, so a payload cannot choose what runs. The environment holds
// only what Config allows (env, inherit_env, PATH defaulting to DefaultPath)
// and the job's metadata:
//
//	JETFLEET_JOB_ID, JETFLEET_KIND, JETFLEET_QUEUE, JETFLEET_ATTEMPT,
//	JETFLEET_MAX_ATTEMPTS, JETFLEET_DEADLINE (RFC 3339, UTC),
//	JETFLEET_IDEMPOTENCY_KEY and JETFLEET_ATTEMPT_KEY (the run's and the
//	attempt's keys, see agent.Job.IdempotencyKey),
//	JETFLEET_SCHEDULE_ID and JETFLEET_NOMINAL_TIME (jobs fired by the
//	scheduler), JETFLEET_REPLAYED_FROM (replayed dead letters), and
//	TRACEPARENT/TRACESTATE (the agent's execution span).
//
// No JETFLEET_* variable of the agent (its configuration, secrets included)
// reaches the program. Values from job headers are passed as data, never
// interpreted.
//
// # Processes
//
// The program leads its own process group and gets SIGKILL should the agent
// die (Pdeathsig). When the attempt times out or is cancelled, the whole
// group gets SIGTERM, then SIGKILL after kill_grace; when the program exits
// and leaves processes of its group behind, they are killed the same way.
// Processes that leave the group on purpose (setsid, a daemonising double
// fork with setsid) escape this; contain such programs with a cgroup (a
// systemd unit or a container per agent). When the agent runs as PID 1 in
// a container, run it under an init (docker run --init) so that orphaned
// processes are reaped.
//
// # Resource limits
//
// Go's os/exec cannot set resource limits on a child. A handler with limits
// starts the agent's own binary again (/proc/self/exe) with LauncherArg
// first; RunLauncherIfRequested, called first in main, then applies the
// limits with setrlimit(2) and execs the program, which inherits them:
// memory (RLIMIT_AS), CPU time (RLIMIT_CPU), open files (RLIMIT_NOFILE) and
// processes (RLIMIT_NPROC, not enforced for root). A limit can only be
// lowered below the agent's own hard limit.
//
// # Outcomes
//
//	exit code 0                          → success
//	code in retryable_exit_codes         → retryable failure
//	code in non_retryable_exit_codes     → agent.NonRetryable: dead letter
//	any other non-zero code              → as other_exit_codes says
//	                                       (retryable by default)
//	killed by a signal (a limit, the OOM
//	killer, someone else)                → retryable, an *ExitError naming
//	                                       the signal and its likely cause
//	timeout, cancel, agent stopping      → the SDK's timeout, cancelled or
//	                                       hand-back outcome
//
// Stdout and stderr go, interleaved, into the job's output tail (the
// agent's output_tail bytes, with a note of how much was dropped), which
// events and dead letters carry. Notes of the handler about killed
// processes are written there too, in [jetfleet: …] brackets.
//
// # Progress
//
// A program reports progress with a line of output (stdout or stderr) that
// starts with "::progress " (agent.ProgressLinePrefix), then a fraction
// from 0 to 1 and an optional message:
//
//	::progress 0.4 resizing image 4 of 10
//
// The handler passes it to agent.ReportProgress instead of the output tail.
// A line with the prefix whose fraction does not read (or is outside
// [0, 1]) stays in the output. Write each progress line in one write
// (stdout and stderr share a pipe) and flush it.
package command
