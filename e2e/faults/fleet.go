package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/natstest/freeport"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// What every fleet of the fault run is made of.
const (
	// agentConcurrency is each agent's agent.concurrency.
	agentConcurrency = 6
	queueDefault     = "default"
	// queueOther is a second queue, served only in scenario two-queues.
	queueOther = "other"
	// ackWait of the queues: shorter than the 30s default so that jobs an
	// agent took to its grave come back within a scenario (the supervisor
	// rescues those a heartbeat listed sooner).
	ackWait = 10 * time.Second
	// maxDeliver of the queues: lower than the default 20, so that a job
	// that kills its agent reaches it within a scenario.
	maxDeliver = 5
	// historySize is supervisor.history_size: records kept per kind, at
	// its maximum so that no scenario's history is cut.
	historySize = 10000
)

// Job kinds the agents run.
const (
	// kindEffect writes a start and an end line per execution.
	kindEffect = "fx"
	// kindTick is kindEffect for scheduled jobs (its own history subject).
	kindTick = "tick"
	// kindWork is kindEffect with 200ms between the lines, so that
	// executions overlap and concurrency shows.
	kindWork = "work"
	// kindDemoSleep is the demo kind sleep, which reads a JSON payload.
	kindDemoSleep = "sleep"
	// kindNonRetryable exits 3, configured non-retryable.
	kindNonRetryable = "nonretry"
	// kindFlaky exits 1 on every attempt (3 attempts).
	kindFlaky = "flaky"
	// kindCrash kills its own agent after 1.5s (listed in a heartbeat by
	// then, so the supervisor rescues it): a crash loop, dead-lettered by
	// the supervisor after MaxDeliver. kindCrashCapped has max_attempts 2,
	// so the agent dead-letters its third delivery without running it.
	kindCrash       = "crash"
	kindCrashCapped = "crash2"
)

// fleetSize is how many processes of each role a fleet runs, and the
// queues of the agents.
type fleetSize struct {
	agents, schedulers, supervisors int
	// queues the agents serve; default: queue default only.
	queues []string
}

var defaultSize = fleetSize{agents: 3, schedulers: 3, supervisors: 1}

// member is one place in the fleet (agent a2, scheduler s1, …), filled by
// a new process at each (re)start.
type member struct {
	role, id string
	// port serves /readyz (telemetry.http_addr).
	port int
	// gen counts the processes started for this member.
	gen int
	p   *proc
	// holder names the current process in the leases bucket (scheduler
	// and supervisor).
	holder string
}

func (m *member) String() string { return fmt.Sprintf("%s %s#%d", m.role, m.id, m.gen) }

// fleet is one scenario's fleet: a nats-server and the services, each a
// process of the binaries built for the run.
type fleet struct {
	dir    string
	bins   binaries
	log    *slog.Logger
	queues []string

	procs procSet
	nats  *natsServer
	// mu guards the members' processes (a scenario may restart them from
	// several goroutines).
	mu          sync.Mutex
	agents      []*member
	schedulers  []*member
	supervisors []*member

	// nc and js are the harness's own connection.
	nc *nats.Conn
	js jetstream.JetStream
}

// startFleet starts a nats-server, the supervisors (which provision the
// topology), the schedulers and the agents, each ready (its /readyz
// passes) before it returns.
func startFleet(ctx context.Context, log *slog.Logger, bins binaries, dir string, size fleetSize) (_ *fleet, err error) {
	f := &fleet{dir: dir, bins: bins, log: log, queues: size.queues}
	if len(f.queues) == 0 {
		f.queues = []string{queueDefault}
	}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	for _, d := range []string{f.effectsDir(), f.configDir(), f.logDir(), f.tmpDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if f.nats, err = newNATSServer(bins.natsServer, dir, &f.procs); err != nil {
		return nil, err
	}
	if _, err := f.nats.start(ctx); err != nil {
		return nil, err
	}
	if f.nc, err = nats.Connect(f.nats.url(), nats.Name("jetfleet-faults"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond)); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", f.nats.url(), err)
	}
	if f.js, err = jetstream.New(f.nc, jetstream.WithPublishAsyncMaxPending(4096)); err != nil {
		return nil, err
	}
	add := func(list *[]*member, role, prefix string, n int) error {
		for i := 1; i <= n; i++ {
			port, err := freeport.Pick()
			if err != nil {
				return err
			}
			*list = append(*list, &member{role: role, id: fmt.Sprintf("%s%d", prefix, i), port: port})
		}
		return nil
	}
	if err := errors.Join(add(&f.supervisors, "supervisor", "v", size.supervisors),
		add(&f.schedulers, "scheduler", "s", size.schedulers), add(&f.agents, "agent", "a", size.agents)); err != nil {
		return nil, err
	}
	// The first supervisor alone provisions the topology; the rest start
	// together, role by role.
	if err := f.start(ctx, f.supervisors[0]); err != nil {
		return nil, err
	}
	for _, group := range [][]*member{f.supervisors[1:], f.schedulers, f.agents} {
		if err := f.startAll(ctx, group); err != nil {
			return nil, err
		}
	}
	log.Debug("fleet ready", "nats", f.nats.url(), "dir", dir)
	return f, nil
}

func (f *fleet) effectsDir() string { return filepath.Join(f.dir, "effects") }
func (f *fleet) configDir() string  { return filepath.Join(f.dir, "config") }
func (f *fleet) logDir() string     { return filepath.Join(f.dir, "logs") }
func (f *fleet) tmpDir() string     { return filepath.Join(f.dir, "tmp") }

func (f *fleet) startAll(ctx context.Context, ms []*member) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = f.start(ctx, m) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close kills every process and closes the harness's connection.
func (f *fleet) close() {
	if f.nc != nil {
		f.nc.Close()
	}
	f.procs.killAll()
}

// start starts a new process for m and waits until it is ready.
func (f *fleet) start(ctx context.Context, m *member) error {
	f.mu.Lock()
	m.gen++
	name, gen := m.String(), m.gen
	f.mu.Unlock()
	cfg, err := f.config(m, gen)
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(f.configDir(), fmt.Sprintf("%s-%s.%d.yaml", m.role, m.id, gen))
	// JSON is YAML: the services read these files with their YAML parser.
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return err
	}
	started := m.role + " started"
	p, err := startProc(procSpec{
		name: name,
		path: map[string]string{"agent": f.bins.agent, "scheduler": f.bins.scheduler, "supervisor": f.bins.supervisor}[m.role],
		args: []string{"-config", cfgPath},
		// TMPDIR: the exec handler's per-attempt directories stay in the run's directory.
		env:      []string{"PATH=/usr/local/bin:/usr/bin:/bin", "TMPDIR=" + f.tmpDir()},
		logPath:  filepath.Join(f.logDir(), fmt.Sprintf("%s-%s.%d.log", m.role, m.id, gen)),
		remember: []string{started},
	})
	if err != nil {
		return err
	}
	f.procs.add(p)
	f.mu.Lock()
	m.p, m.holder = p, ""
	f.mu.Unlock()
	if err := waitReady(ctx, p, m.port); err != nil {
		return err
	}
	if m.role == "agent" {
		return nil
	}
	lineCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	line, err := p.line(lineCtx, started)
	if err != nil {
		return err
	}
	var fields struct {
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal([]byte(line), &fields); err != nil || fields.Holder == "" {
		return fmt.Errorf("%s: no holder in its line %q", name, line)
	}
	f.mu.Lock()
	m.holder = fields.Holder
	f.mu.Unlock()
	return nil
}

// waitReady polls the process's /readyz until it passes.
func waitReady(ctx context.Context, p *proc, port int) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
	client := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if res, err := client.Do(req); err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before it was ready; last output:\n%s", p, p.waitErr, p.tail(20))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w; last output:\n%s", p, url, ctx.Err(), p.tail(20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// restart kills m's process (kill -9) and starts a new one.
func (f *fleet) restart(ctx context.Context, m *member) error {
	if err := f.proc(m).kill(); err != nil {
		return err
	}
	return f.start(ctx, m)
}

// proc is m's current process.
func (f *fleet) proc(m *member) *proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m.p
}

// leader is the member whose process holds role's lease (key role in
// bucket leases), or nil when nobody does.
func (f *fleet) leader(ctx context.Context, role string) (*member, error) {
	kv, err := f.js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", protocol.BucketLeases, err)
	}
	entry, err := kv.Get(ctx, role)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lease %s: %w", role, err)
	}
	var v struct {
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal(entry.Value(), &v); err != nil {
		return nil, fmt.Errorf("lease %s: %w", role, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range append(append([]*member(nil), f.schedulers...), f.supervisors...) {
		if m.holder == v.Holder && m.role == role {
			return m, nil
		}
	}
	return nil, nil // a process of the past still holds it, until its lease expires
}

// awaitLeader waits until a live process other than the one named by
// notHolder holds role's lease, and returns it.
func (f *fleet) awaitLeader(ctx context.Context, role, notHolder string, timeout time.Duration) (*member, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		m, err := f.leader(ctx, role)
		if err == nil && m != nil {
			f.mu.Lock()
			holder, p := m.holder, m.p
			f.mu.Unlock()
			if holder != notHolder && !p.exited() {
				return m, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no new %s leader within %s (last error: %v)", role, timeout, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// holderOf is m's current lease holder name.
func (f *fleet) holderOf(m *member) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m.holder
}

// cli runs the jetfleet CLI against the fleet.
func (f *fleet) cli(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, f.bins.jetfleet, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "NATS_URL=" + f.nats.url()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("jetfleet %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// config is m's configuration file (fleet.yaml and the role's file in one).
func (f *fleet) config(m *member, gen int) ([]byte, error) {
	type obj = map[string]any
	cfg := obj{
		"nats": obj{"url": f.nats.url()},
		"topology": obj{"queues": obj{
			queueDefault: obj{"ack_wait": ackWait.String(), "max_deliver": maxDeliver},
			queueOther:   obj{"ack_wait": ackWait.String(), "max_deliver": maxDeliver},
		}},
		"telemetry":      obj{"http_addr": fmt.Sprintf("127.0.0.1:%d", m.port), "log_level": "info", "log_format": "json"},
		"shutdown_grace": "5s",
	}
	switch m.role {
	case "agent":
		cfg["agent"] = obj{"id": m.id, "queues": f.queues, "concurrency": agentConcurrency}
		cfg["handlers"] = f.handlers(filepath.Join(f.effectsDir(), fmt.Sprintf("%s.%d.log", m.id, gen)))
	case "supervisor":
		cfg["supervisor"] = obj{"history_size": historySize}
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// handlers are the agents' kinds. Programs and arguments are fixed here;
// a job only brings its payload (stdin) and metadata (environment).
func (f *fleet) handlers(effects string) map[string]any {
	type obj = map[string]any
	q := "'" + effects + "'" // a temp path: no quote in it
	start := `printf 'S %s %s\n' "$JETFLEET_JOB_ID" "$JETFLEET_ATTEMPT" >>` + q
	end := `printf 'E %s %s %s %s\n' "$JETFLEET_JOB_ID" "$JETFLEET_ATTEMPT" "${JETFLEET_SCHEDULE_ID:--}" "${JETFLEET_NOMINAL_TIME:--}" >>` + q
	sh := func(script string) obj {
		return obj{"type": "exec", "command": "/bin/sh", "args": []string{"-c", script}, "timeout": "30s"}
	}
	with := func(o obj, kv ...any) obj {
		for i := 0; i < len(kv); i += 2 {
			o[kv[i].(string)] = kv[i+1]
		}
		return o
	}
	return obj{
		kindEffect:       sh(start + "; " + end),
		kindTick:         sh(start + "; " + end),
		kindWork:         sh(start + "; sleep 0.2; " + end),
		kindDemoSleep:    obj{"type": "demo"},
		kindNonRetryable: with(sh("exit 3"), "non_retryable_exit_codes", []int{3}),
		kindFlaky: with(sh("exit 1"), "max_attempts", 3,
			"backoff", obj{"initial_delay": "200ms", "max_delay": "1s"}),
		// The program kills the agent that runs it: a crash loop.
		kindCrash:       with(sh(`sleep 1.5; kill -9 "$PPID"; sleep 10`), "max_attempts", 10),
		kindCrashCapped: with(sh(`sleep 1.5; kill -9 "$PPID"; sleep 10`), "max_attempts", 2),
	}
}

// finalProcesses names each agent's current process as its effect file
// does ("a1" → "a1.3").
func (f *fleet) finalProcesses() map[string]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]string{}
	for _, m := range f.agents {
		out[m.id] = fmt.Sprintf("%s.%d", m.id, m.gen)
	}
	return out
}
