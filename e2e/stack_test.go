//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// The stack's services and the container ports the test reaches from the host.
const (
	natsPort       = "4222"
	jaegerUIPort   = "16686"
	jaegerOTLPPort = "4318"
	agentPort      = "9101"
	schedulerPort  = "9102"
	supervisorPort = "9103"
	dashboardPort  = "8080"
	dashMetrics    = "9104"
)

// hostPortVars are the variables docker-compose.yml publishes its ports
// with; the test sets each to 0, so Docker picks free host ports and a stack
// already running on this machine (go tool task up) is not in the way.
var hostPortVars = []string{"NATS_PORT", "NATS_MONITOR_PORT", "JAEGER_UI_PORT", "JAEGER_OTLP_HTTP_PORT",
	"JAEGER_OTLP_GRPC_PORT", "AGENT_1_PORT", "AGENT_2_PORT", "SCHEDULER_1_PORT", "SCHEDULER_2_PORT", "SUPERVISOR_PORT",
	"DASHBOARD_PORT", "DASHBOARD_METRICS_PORT"}

// Stacks started by this process, torn down on SIGINT/SIGTERM too (t.Cleanup
// does not run when the test binary is interrupted).
var (
	stacksMu sync.Mutex
	stacks   = map[*stack]bool{}
)

func TestMain(m *testing.M) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		fmt.Fprintf(os.Stderr, "e2e: %s: tearing the stacks down\n", sig)
		stacksMu.Lock()
		for s := range stacks {
			s.down()
		}
		os.Exit(1)
	}()
	os.Exit(m.Run())
}

// TestStack is the end-to-end test of the compose stack (docs/stack.md): it
// builds the images, brings docker-compose.yml up from scratch under a
// unique project name and checks, from the host:
//
//  1. every service is healthy and serves Prometheus metrics on its own host port;
//  2. a job published with nats.go as user client, carrying the traceparent of a
//     span this test exports to Jaeger, succeeds on an agent container, and
//     Jaeger's query API has the trace with the publisher's and the agent's spans;
//  3. a cron schedule added with the CLI (the jetfleet image on the stack's
//     network) fires, and the trace of a fired job has the scheduler's and the
//     agent's spans;
//  4. after docker kill of the scheduler leader, the other replica takes the
//     lease and fires the next runs: every nominal time from the first to the
//     last has exactly one fired event and exactly one succeeded job, none lost,
//     none doubled, and the scheduler span of a run after the kill is the
//     survivor's;
//
// then removes everything (docker-compose down -v), also when it fails.
func TestStack(t *testing.T) {
	began := time.Now()
	root := repoRoot(t)
	compose := composeCommand(t)
	passwords := devPasswords(t, root)

	buildImages(t, root)

	s := startStack(t, root, compose, nil)
	ctx := t.Context()

	// 1. Metrics from the host, on distinct ports.
	hostPorts := map[string]string{}
	for _, svc := range []struct{ name, port, metric string }{
		{"scheduler-1", schedulerPort, "jetfleet_scheduler_leader"},
		{"scheduler-2", schedulerPort, "jetfleet_scheduler_leader"},
		{"supervisor", supervisorPort, "jetfleet_supervisor_leader"},
		{"agent-1", agentPort, "go_goroutines"},
		{"agent-2", agentPort, "go_goroutines"},
		{"dashboard", dashMetrics, "go_goroutines"},
	} {
		hp := s.hostPort(svc.name, svc.port)
		if other, ok := hostPorts[hp]; ok {
			t.Errorf("%s and %s share the host port %s", svc.name, other, hp)
		}
		hostPorts[hp] = svc.name
		body, err := httpGet(ctx, "http://"+hp+"/metrics")
		if err != nil {
			t.Fatalf("%s /metrics: %v", svc.name, err)
		}
		if !strings.Contains(body, "# TYPE "+svc.metric+" gauge") {
			t.Errorf("%s /metrics has no gauge %s", svc.name, svc.metric)
		}
	}

	client := s.connect("client", passwords["client"])
	events := newEventLog(t, client)
	tp := exportToJaeger(t, s.hostPort("jaeger", jaegerOTLPPort))
	jaeger := "http://" + s.hostPort("jaeger", jaegerUIPort)

	// 2. A job from the host with the publisher's trace context.
	jobID := "e2e-" + hex.EncodeToString(randomBytes(6))
	spanCtx, span := tp.Tracer("jetfleet-e2e").Start(ctx, "e2e.publish", trace.WithSpanKind(trace.SpanKindProducer))
	msg := nats.NewMsg("jobs.default.echo")
	msg.Header.Set("Jetfleet-Job-Id", jobID)
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(spanCtx, carrier)
	for k, v := range carrier { // lowercase, exactly as written: NATS headers are case-sensitive
		msg.Header[k] = []string{v}
	}
	msg.Data = []byte(`{"hello":"e2e"}`)
	js, err := jetstream.New(client)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	span.End()
	traceID := span.SpanContext().TraceID().String()
	ev := events.awaitJob(t, jobID, "succeeded", time.Minute)
	if ev.AgentID != "agent-1" && ev.AgentID != "agent-2" {
		t.Errorf("job %s succeeded on %q, want a container of the stack (agent-1 or agent-2)", jobID, ev.AgentID)
	}
	if ev.TraceID != traceID {
		t.Errorf("job event trace id %s, want the publisher's %s", ev.TraceID, traceID)
	}
	t.Logf("job %s (JOBS %d) succeeded on %s; trace %s", jobID, ack.Sequence, ev.AgentID, traceID)
	tr := awaitTrace(t, jaeger, traceID, []wantSpan{
		{service: "jetfleet-e2e", operation: "e2e.publish"},
		{service: "jetfleet-agent", operation: "agent.execute echo", instance: ev.AgentID},
	})
	if pub, exe := tr.find("e2e.publish"), tr.find("agent.execute echo"); pub != nil && exe != nil && !exe.childOf(pub.SpanID) {
		t.Errorf("agent span %s is not a child of the publisher's span %s", exe.SpanID, pub.SpanID)
	}

	// 2b. The dashboard: refuses an anonymous request, and a login from .env
	// (DASHBOARD_USERS, dev-only) reads the overview with both agents and the job.
	t.Run("dashboard", func(t *testing.T) {
		base := "http://" + s.hostPort("dashboard", dashboardPort)
		if err := dashboardGet(&http.Client{Timeout: 10 * time.Second}, base+"/"); err == nil || !strings.Contains(err.Error(), "401") {
			t.Fatalf("anonymous GET /: %v, want 401", err)
		}
		vars, err := readDotEnv(filepath.Join(root, ".env"))
		if err != nil {
			t.Fatal(err)
		}
		users := os.Getenv("DASHBOARD_USERS")
		if users == "" {
			users = vars["DASHBOARD_USERS"]
		}
		first := strings.Split(strings.Split(users, ",")[0], ":")
		if len(first) != 3 {
			t.Fatalf("DASHBOARD_USERS %q is not name:password:role,…", users)
		}
		web := dashboardLogin(t, base, first[0], first[1])
		for _, want := range []string{"agent-1", "agent-2", "Leaders"} {
			eventually(t, 30*time.Second, 200*time.Millisecond, "the overview shows "+want, func() error {
				body, err := dashboardBody(web, base+"/")
				if err != nil {
					return err
				}
				if !strings.Contains(body, want) {
					return fmt.Errorf("no %q on the overview", want)
				}
				return nil
			})
		}
		if err := dashboardGet(web, base+"/jobs/"+jobID); err != nil {
			t.Error(err)
		}
	})

	// 3. A cron schedule through the CLI.
	const scheduleID = "e2e-tick"
	const every = 5 * time.Second
	added := time.Now()
	out := s.cli(t, passwords["client"], "schedule", "add", "-cron", "*/5 * * * * *", "-kind", "echo", scheduleID)
	t.Logf("jetfleet schedule add: %s", firstLine(out))
	first := events.awaitFired(t, scheduleID, added, time.Minute)
	firstRun := events.awaitJob(t, first.JobID, "succeeded", time.Minute)
	t.Logf("schedule %s fired %s (nominal %s), succeeded on %s", scheduleID, first.JobID, first.NominalTime, firstRun.AgentID)
	awaitTrace(t, jaeger, first.TraceID, []wantSpan{
		{service: "jetfleet-scheduler", operation: "scheduler.fire"},
		{service: "jetfleet-agent", operation: "agent.execute echo", instance: firstRun.AgentID},
	})

	// 4. Kill the leader; the other replica fires the next runs.
	leader, standby := s.schedulerLeader(t)
	standbyFires := s.metric(t, standby, schedulerPort, `jetfleet_scheduler_fires_total{source="schedule"}`)
	s.kill(t, leader)
	killed := time.Now()
	t.Logf("killed the scheduler leader %s; %s is standing by", leader, standby)
	eventually(t, time.Minute, 250*time.Millisecond, standby+" leads", func() error {
		if v := s.metric(t, standby, schedulerPort, "jetfleet_scheduler_leader"); v != 1 {
			return fmt.Errorf("jetfleet_scheduler_leader %v", v)
		}
		return nil
	})
	t.Logf("%s leads %s after the kill", standby, time.Since(killed).Round(10*time.Millisecond))
	// Nominal times from the next second on: the killed leader cannot have fired them.
	var after []scheduleEvent
	for from := killed.Truncate(time.Second).Add(time.Second); len(after) < 2; {
		ev := events.awaitFired(t, scheduleID, from, time.Minute)
		run := events.awaitJob(t, ev.JobID, "succeeded", time.Minute)
		t.Logf("fired %s (nominal %s), succeeded on %s", ev.JobID, ev.NominalTime, run.AgentID)
		after = append(after, ev)
		from = ev.nominal().Add(every)
	}
	if v := s.metric(t, standby, schedulerPort, `jetfleet_scheduler_fires_total{source="schedule"}`); v < standbyFires+2 {
		t.Errorf("%s fired %v schedules after the kill, want at least 2", standby, v-standbyFires)
	}
	awaitTrace(t, jaeger, after[0].TraceID, []wantSpan{
		{service: "jetfleet-scheduler", operation: "scheduler.fire", instance: standby},
		{service: "jetfleet-agent", operation: "agent.execute echo"},
	})
	s.cli(t, passwords["client"], "schedule", "rm", scheduleID)

	// Exactly one fire and one run per nominal time, none missing, read from
	// the EVENTS stream (fired) and from every job event published (runs).
	last := after[len(after)-1].nominal()
	fired := map[time.Time]int{}
	for _, data := range readStream(t, js, "EVENTS", "events.schedule."+scheduleID+".fired") {
		var ev scheduleEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatal(err)
		}
		fired[ev.nominal()]++
	}
	runs := events.runsOf(scheduleID)
	for n := first.nominal(); !n.After(last); n = n.Add(every) {
		if fired[n] != 1 {
			t.Errorf("nominal time %s: %d fired events, want 1", n.Format(time.RFC3339), fired[n])
		}
		if len(runs[n]) != 1 {
			t.Errorf("nominal time %s: %d succeeded runs %v, want 1", n.Format(time.RFC3339), len(runs[n]), runs[n])
		}
	}
	t.Logf("nominal times %s to %s: one fire and one run each; end to end in %s",
		first.nominal().Format(time.TimeOnly), last.Format(time.TimeOnly), time.Since(began).Round(time.Second))
}

// TestClusterStack brings the stack up with docker-compose.cluster.yml
// (three NATS servers) and checks that every stream and bucket has three
// current replicas, and that the fleet still runs a job from the host after
// one server is killed.
func TestClusterStack(t *testing.T) {
	began := time.Now()
	root := repoRoot(t)
	compose := composeCommand(t)
	passwords := devPasswords(t, root)
	buildImages(t, root)

	s := startStack(t, root, compose, []string{"docker-compose.cluster.yml"})
	ctx := t.Context()
	admin := s.connect("admin", passwords["admin"])
	adminJS, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	// Every stream the services provision, the supervisor's own included.
	want := append(topology.StreamNames(), protocol.StreamSupervisor, protocol.StreamTrends)
	slices.Sort(want)
	eventually(t, time.Minute, 500*time.Millisecond, "every stream on three current replicas", func() error {
		var names []string
		for name := range adminJS.StreamNames(ctx).Name() {
			names = append(names, name)
		}
		slices.Sort(names)
		if !slices.Equal(names, want) {
			return fmt.Errorf("streams %v, want %v", names, want)
		}
		for _, name := range names {
			st, err := adminJS.Stream(ctx, name)
			if err != nil {
				return err
			}
			info := st.CachedInfo()
			if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
				return fmt.Errorf("stream %s: %d replicas, cluster %+v", name, info.Config.Replicas, info.Cluster)
			}
			for _, r := range info.Cluster.Replicas {
				if !r.Current || r.Offline {
					return fmt.Errorf("stream %s: replica %s not current", name, r.Name)
				}
			}
		}
		return nil
	})
	t.Logf("%d streams with three replicas", len(want))

	// One server down: the other two still have a quorum of every stream.
	s.kill(t, "nats-2")
	client := s.connect("client", passwords["client"]) // on nats, the first server
	events := newEventLog(t, client)
	js, err := jetstream.New(client)
	if err != nil {
		t.Fatal(err)
	}
	jobID := "e2e-cluster-" + hex.EncodeToString(randomBytes(6))
	msg := nats.NewMsg("jobs.default.echo")
	msg.Header.Set("Jetfleet-Job-Id", jobID)
	msg.Header.Set("Nats-Msg-Id", jobID) // a retried publish is stored once
	msg.Data = []byte(`{"hello":"cluster"}`)
	eventually(t, time.Minute, 500*time.Millisecond, "job stored with nats-2 down", func() error {
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := js.PublishMsg(pctx, msg) // a stream led by nats-2 elects a new leader first
		return err
	})
	ev := events.awaitJob(t, jobID, "succeeded", time.Minute)
	t.Logf("with nats-2 killed, job %s succeeded on %s; cluster test in %s", jobID, ev.AgentID, time.Since(began).Round(time.Second))
}

// buildImages builds every image once per test binary (go tool task images),
// unless E2E_SKIP_IMAGES is set (when iterating on the test itself).
func buildImages(t *testing.T, root string) {
	t.Helper()
	imagesOnce.Do(func() {
		if os.Getenv("E2E_SKIP_IMAGES") != "" {
			t.Log("E2E_SKIP_IMAGES is set: using the images as they are")
			return
		}
		step := time.Now()
		cmd := exec.Command("go", "tool", "task", "images")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout // progress in the CI log (a cold Jaeger build takes minutes)
		imagesErr = cmd.Run()
		t.Logf("go tool task images: %s", time.Since(step).Round(time.Second))
	})
	if imagesErr != nil {
		t.Fatalf("go tool task images: %v", imagesErr)
	}
}

var (
	imagesOnce sync.Once
	imagesErr  error
)

// stack is one docker-compose project.
type stack struct {
	t       *testing.T
	root    string
	compose []string // the command, project and files
	env     []string
	project string
	ports   map[string]string // "service/port" → host:port
}

// composeCommand is docker-compose (Compose v1), or the docker compose
// plugin where that is what is installed. No docker: the test fails.
func composeCommand(t *testing.T) []string {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatal("the e2e test needs docker: " + err.Error())
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Fatalf("the e2e test needs a running Docker daemon: docker info: %v\n%s", err, out)
	}
	if path, err := exec.LookPath("docker-compose"); err == nil {
		return []string{path}
	}
	if err := exec.Command("docker", "compose", "version").Run(); err == nil {
		return []string{"docker", "compose"}
	}
	t.Fatal("the e2e test needs docker-compose (or the docker compose plugin)")
	return nil
}

// startStack brings docker-compose.yml (and extra files) up under a new
// project name with free host ports, waits until every container is
// healthy, and tears it down when the test ends.
func startStack(t *testing.T, root string, compose []string, extraFiles []string) *stack {
	t.Helper()
	project := "jetfleete2e" + hex.EncodeToString(randomBytes(4))
	args := append(slices.Clone(compose), "--project-name", project, "--file", filepath.Join(root, "docker-compose.yml"))
	for _, f := range extraFiles {
		args = append(args, "--file", filepath.Join(root, f))
	}
	env := os.Environ()
	for _, v := range hostPortVars {
		env = append(env, v+"=0")
	}
	env = append(env, "JETFLEET_BIND=127.0.0.1")
	s := &stack{t: t, root: root, compose: args, env: env, project: project, ports: map[string]string{}}
	stacksMu.Lock()
	stacks[s] = true
	stacksMu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			if out, err := s.run("logs", "--no-color", "--tail", "150"); err == nil {
				t.Logf("docker-compose logs of %s:\n%s", project, out)
			}
			if out, err := s.run("ps"); err == nil {
				t.Logf("docker-compose ps:\n%s", out)
			}
		}
		step := time.Now()
		s.down()
		stacksMu.Lock()
		delete(stacks, s)
		stacksMu.Unlock()
		t.Logf("stack %s removed in %s", project, time.Since(step).Round(100*time.Millisecond))
	})

	step := time.Now()
	if out, err := s.run("up", "--detach", "--no-build"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	eventually(t, 3*time.Minute, time.Second, "every container healthy", s.healthy)
	t.Logf("stack %s up and healthy in %s%s", project, time.Since(step).Round(100*time.Millisecond), s.restarts())
	return s
}

// restarts names the containers Docker restarted (restart: unless-stopped),
// for the log.
func (s *stack) restarts() string {
	out, err := s.run("ps", "--quiet")
	if err != nil {
		return ""
	}
	out, err = exec.Command("docker", append([]string{"inspect", "--format", "{{.Name}} {{.RestartCount}}"},
		strings.Fields(string(out))...)...).Output()
	if err != nil {
		return ""
	}
	var restarted []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if name, n, ok := strings.Cut(line, " "); ok && n != "0" {
			restarted = append(restarted, strings.TrimPrefix(name, "/")+" ×"+n)
		}
	}
	if len(restarted) == 0 {
		return ""
	}
	return "; restarted: " + strings.Join(restarted, ", ")
}

func (s *stack) run(args ...string) ([]byte, error) {
	cmd := exec.Command(s.compose[0], append(slices.Clone(s.compose[1:]), args...)...)
	cmd.Dir = s.root
	cmd.Env = s.env
	return cmd.CombinedOutput()
}

// down removes the project's containers, networks and volumes.
func (s *stack) down() {
	if out, err := s.run("down", "--volumes", "--remove-orphans", "--timeout", "5"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: docker-compose down of %s: %v\n%s\n", s.project, err, out)
	}
}

// healthy reports nil once every container runs and those with a health
// check are healthy; it fails the test at once when a container exited.
func (s *stack) healthy() error {
	out, err := s.run("ps", "--quiet")
	if err != nil {
		return fmt.Errorf("docker-compose ps: %v: %s", err, out)
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		return errors.New("no containers")
	}
	out, err = exec.Command("docker", append([]string{"inspect", "--format",
		`{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}`}, ids...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("docker inspect: %v: %s", err, out)
	}
	var waiting []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			return fmt.Errorf("docker inspect: %q", line)
		}
		switch {
		case f[1] == "exited" || f[1] == "dead":
			s.t.Fatalf("container %s %s before the stack was up", f[0], f[1])
		case f[1] != "running" || (f[2] != "healthy" && f[2] != "none"):
			waiting = append(waiting, fmt.Sprintf("%s %s/%s", strings.TrimPrefix(f[0], "/"), f[1], f[2]))
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("waiting for %s", strings.Join(waiting, ", "))
	}
	return nil
}

// hostPort is where the host reaches port of service.
func (s *stack) hostPort(service, port string) string {
	key := service + "/" + port
	if hp, ok := s.ports[key]; ok {
		return hp
	}
	out, err := s.run("port", service, port)
	if err != nil {
		s.t.Fatalf("docker-compose port %s %s: %v: %s", service, port, err, out)
	}
	hp := strings.TrimSpace(string(out))
	if hp == "" || strings.HasSuffix(hp, ":0") {
		s.t.Fatalf("docker-compose port %s %s: %q", service, port, hp)
	}
	s.ports[key] = hp
	return hp
}

// container is the id of service's container.
func (s *stack) container(service string) string {
	out, err := s.run("ps", "--quiet", service)
	if err != nil || strings.TrimSpace(string(out)) == "" {
		s.t.Fatalf("docker-compose ps %s: %v: %s", service, err, out)
	}
	return strings.TrimSpace(string(out))
}

func (s *stack) kill(t *testing.T, service string) {
	t.Helper()
	run(t, s.root, nil, "docker", "kill", s.container(service))
}

// connect opens a NATS connection from the host as user.
func (s *stack) connect(user, password string) *nats.Conn {
	nc, err := nats.Connect("nats://"+s.hostPort("nats", natsPort), nats.Name("e2e-"+user), nats.UserInfo(user, password))
	if err != nil {
		s.t.Fatalf("connect as %s: %v", user, err)
	}
	s.t.Cleanup(nc.Close)
	return nc
}

// cli runs the jetfleet CLI from the jetfleet image on the stack's network,
// as user client.
func (s *stack) cli(t *testing.T, password string, args ...string) string {
	t.Helper()
	cmd := exec.Command("docker", append([]string{"run", "--rm", "--network", s.project + "_default",
		"-e", "NATS_URL=nats://nats:4222", "-e", "NATS_USER=client",
		"-e", "NATS_PASSWORD", // from this environment: never in a command line or a log
		"jetfleet/jetfleet:latest"}, args...)...)
	cmd.Env = append(os.Environ(), "NATS_PASSWORD="+password)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("jetfleet %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// metric reads an unlabelled or fully labelled sample from service's /metrics.
func (s *stack) metric(t *testing.T, service, port, name string) float64 {
	t.Helper()
	body, err := httpGet(t.Context(), "http://"+s.hostPort(service, port)+"/metrics")
	if err != nil {
		t.Fatalf("%s /metrics: %v", service, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %s: %v", service, line, err)
			}
			return f
		}
	}
	return 0 // a counter not incremented yet is not exported
}

// schedulerLeader waits until exactly one replica reports itself leader.
func (s *stack) schedulerLeader(t *testing.T) (leader, standby string) {
	t.Helper()
	eventually(t, time.Minute, 250*time.Millisecond, "one scheduler leader", func() error {
		one, two := s.metric(t, "scheduler-1", schedulerPort, "jetfleet_scheduler_leader"),
			s.metric(t, "scheduler-2", schedulerPort, "jetfleet_scheduler_leader")
		switch {
		case one == 1 && two == 0:
			leader, standby = "scheduler-1", "scheduler-2"
		case one == 0 && two == 1:
			leader, standby = "scheduler-2", "scheduler-1"
		default:
			return fmt.Errorf("jetfleet_scheduler_leader: scheduler-1 %v, scheduler-2 %v", one, two)
		}
		return nil
	})
	return leader, standby
}

// run runs a command in dir and returns its output; it fails the test when
// the command fails. With w, the output goes there as it comes.
func run(t *testing.T, dir string, w io.Writer, name string, args ...string) string {
	t.Helper()
	var buf bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if w != nil {
		cmd.Stdout, cmd.Stderr = io.MultiWriter(&buf, w), io.MultiWriter(&buf, w)
	} else {
		cmd.Stdout, cmd.Stderr = &buf, &buf
	}
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, buf.String())
	}
	return buf.String()
}

func httpGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(body), nil
}

// exportToJaeger is a tracer provider that exports each span to Jaeger's
// OTLP/HTTP port as it ends.
func exportToJaeger(t *testing.T, hostPort string) *sdktrace.TracerProvider {
	t.Helper()
	endpoint := "http://" + hostPort
	exp, err := telemetry.NewOTLPSpanExporter(func(name string) string {
		if name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			return endpoint
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "jetfleet-e2e"))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// wantSpan is a span a trace must have: operation from service, and from
// the process with that service.instance.id when instance is set.
type wantSpan struct{ service, operation, instance string }

// jaegerTrace is a trace as Jaeger's query API returns it.
type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerSpan struct {
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	ProcessID     string `json:"processID"`
	References    []struct {
		RefType string `json:"refType"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
}

type jaegerProcess struct {
	ServiceName string `json:"serviceName"`
	Tags        []struct {
		Key   string `json:"key"`
		Value any    `json:"value"`
	} `json:"tags"`
}

func (sp *jaegerSpan) childOf(id string) bool {
	for _, r := range sp.References {
		if r.RefType == "CHILD_OF" && r.SpanID == id {
			return true
		}
	}
	return false
}

func (p jaegerProcess) tag(key string) any {
	for _, tag := range p.Tags {
		if tag.Key == key {
			return tag.Value
		}
	}
	return nil
}

// find is the first span of operation, or nil.
func (tr *jaegerTrace) find(operation string) *jaegerSpan {
	for i := range tr.Spans {
		if tr.Spans[i].OperationName == operation {
			return &tr.Spans[i]
		}
	}
	return nil
}

// missing lists the wanted spans the trace lacks.
func (tr *jaegerTrace) missing(want []wantSpan) []string {
	var missing []string
	for _, w := range want {
		if !slices.ContainsFunc(tr.Spans, func(sp jaegerSpan) bool {
			p := tr.Processes[sp.ProcessID]
			return sp.OperationName == w.operation && p.ServiceName == w.service &&
				(w.instance == "" || p.tag("service.instance.id") == w.instance)
		}) {
			missing = append(missing, fmt.Sprintf("%s %q (instance %q)", w.service, w.operation, w.instance))
		}
	}
	return missing
}

// awaitTrace polls Jaeger's query API until the trace has every wanted span.
func awaitTrace(t *testing.T, jaeger, traceID string, want []wantSpan) *jaegerTrace {
	t.Helper()
	var tr jaegerTrace
	eventually(t, time.Minute, 500*time.Millisecond, "trace "+traceID+" in Jaeger", func() error {
		body, err := httpGet(t.Context(), jaeger+"/api/traces/"+traceID)
		if err != nil {
			return err
		}
		var res struct {
			Data []jaegerTrace `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &res); err != nil {
			return err
		}
		if len(res.Data) != 1 {
			return fmt.Errorf("%d traces", len(res.Data))
		}
		tr = res.Data[0]
		if m := tr.missing(want); len(m) > 0 {
			return fmt.Errorf("%d spans, missing %s", len(tr.Spans), strings.Join(m, ", "))
		}
		return nil
	})
	t.Logf("Jaeger has trace %s: %d spans from %d processes", traceID, len(tr.Spans), len(tr.Processes))
	return &tr
}

// scheduleEvent holds the fields of a ScheduleEvent (docs/protocol.md §5.3) the test reads.
type scheduleEvent struct {
	Type        string `json:"type"`
	ScheduleID  string `json:"schedule_id"`
	NominalTime string `json:"nominal_time"`
	JobID       string `json:"job_id"`
	TraceID     string `json:"trace_id"`
}

func (e scheduleEvent) nominal() time.Time {
	n, _ := time.Parse(time.RFC3339Nano, e.NominalTime)
	return n.UTC()
}

// eventLog collects every event published on events.> (a core NATS
// subscription as user client: it sees each publish, also one JetStream
// would drop as a duplicate).
type eventLog struct {
	mu       sync.Mutex
	changed  chan struct{}
	jobs     []jobEvent
	schedule []scheduleEvent
}

func newEventLog(t *testing.T, nc *nats.Conn) *eventLog {
	l := &eventLog{changed: make(chan struct{})}
	sub, err := nc.Subscribe("events.>", func(m *nats.Msg) {
		l.mu.Lock()
		defer l.mu.Unlock()
		switch {
		case strings.HasPrefix(m.Subject, "events.job."):
			var ev jobEvent
			if json.Unmarshal(m.Data, &ev) == nil {
				l.jobs = append(l.jobs, ev)
			}
		case strings.HasPrefix(m.Subject, "events.schedule."):
			var ev scheduleEvent
			if json.Unmarshal(m.Data, &ev) == nil {
				l.schedule = append(l.schedule, ev)
			}
		}
		close(l.changed)
		l.changed = make(chan struct{})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return l
}

// await waits until find reports true on the events, and fails the test
// after timeout.
func (l *eventLog) await(t *testing.T, what string, timeout time.Duration, find func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		l.mu.Lock()
		found, changed := find(), l.changed
		l.mu.Unlock()
		if found {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s: not within %s", what, timeout)
		}
	}
}

func (l *eventLog) awaitJob(t *testing.T, jobID, typ string, timeout time.Duration) jobEvent {
	t.Helper()
	var out jobEvent
	l.await(t, "job "+jobID+" "+typ, timeout, func() bool {
		for _, ev := range l.jobs {
			if ev.JobID == jobID && ev.Type == typ {
				out = ev
				return true
			}
		}
		return false
	})
	return out
}

// awaitFired waits for the first fired event of schedule whose nominal time
// is at or after from.
func (l *eventLog) awaitFired(t *testing.T, schedule string, from time.Time, timeout time.Duration) scheduleEvent {
	t.Helper()
	var out scheduleEvent
	l.await(t, "schedule "+schedule+" fired after "+from.Format(time.TimeOnly), timeout, func() bool {
		for _, ev := range l.schedule {
			if ev.ScheduleID == schedule && ev.Type == "fired" && !ev.nominal().Before(from.Truncate(time.Second)) {
				out = ev
				return true
			}
		}
		return false
	})
	return out
}

// runsOf maps each nominal time of schedule to the jobs that succeeded for it.
func (l *eventLog) runsOf(schedule string) map[time.Time][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[time.Time][]string{}
	for _, ev := range l.jobs {
		if ev.ScheduleID == schedule && ev.Type == "succeeded" {
			n, _ := time.Parse(time.RFC3339Nano, ev.NominalTime)
			out[n.UTC()] = append(out[n.UTC()], fmt.Sprintf("%s@%s", ev.JobID, ev.AgentID))
		}
	}
	return out
}

// readStream reads every message of stream on subject (a filter) with an
// ordered consumer.
func readStream(t *testing.T, js jetstream.JetStream, stream, subject string) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range info.State.Subjects {
		total += int(n)
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for len(out) < total {
		batch, err := cons.Fetch(total-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := len(out)
		for m := range batch.Messages() {
			out = append(out, m.Data())
		}
		if len(out) == n {
			t.Fatalf("read %d of %d messages on %s: %v", n, total, subject, batch.Error())
		}
	}
	return out
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.UintN(256))
	}
	return b
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
