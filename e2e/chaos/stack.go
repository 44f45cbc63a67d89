package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// The compose files of the stack, relative to the repository's root.
var composeFiles = []string{"docker-compose.yml", "docker-compose.cluster.yml", "e2e/chaos/compose.chaos.yml"}

// hostPortVars are docker-compose.yml's host ports; the run sets them to 0
// (free ports), so that it never meets a stack already running here.
var hostPortVars = []string{
	"NATS_PORT", "NATS_MONITOR_PORT", "JAEGER_UI_PORT", "JAEGER_OTLP_HTTP_PORT", "JAEGER_OTLP_GRPC_PORT",
	"AGENT_1_PORT", "AGENT_2_PORT", "SCHEDULER_1_PORT", "SCHEDULER_2_PORT", "SUPERVISOR_PORT",
	"DASHBOARD_PORT", "DASHBOARD_METRICS_PORT",
}

// natsNodes are the compose services of the three NATS servers.
var natsNodes = []string{"nats", "nats-2", "nats-3"}

// serverName is the server_name of NATS node service node
// (docker-compose.cluster.yml).
func serverName(node string) string {
	if node == "nats" {
		return "nats-1"
	}
	return node
}

// streamLeader is the server_name of the node that leads stream name.
func (s *stack) streamLeader(ctx context.Context, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, name)
	if err != nil {
		return "", fmt.Errorf("stream %s: %w", name, err)
	}
	info := st.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return "", fmt.Errorf("stream %s has no leader", name)
	}
	return info.Cluster.Leader, nil
}

// stack is one compose project of the run.
type stack struct {
	root, project, dir string
	env                []string
	passwords          map[string]string
	// containers: service name → container id, read once the stack is up.
	containers map[string]string
	// urls are the nodes' client ports as the host reaches them.
	urls []string

	mu sync.Mutex
	// holderByStart: lease holder names by container id and start time.
	holderByStart map[string]string
	// nc is the harness's connection (user admin), to every node.
	nc *nats.Conn
	js jetstream.JetStream
}

// syncSetting is the sync_interval of a stack's NATS servers.
type syncSetting string

const (
	syncAlways  syncSetting = "always"
	syncDefault syncSetting = "default" // the line removed: NATS's 2-minute default
)

// startStack writes the run's configuration (the effect kind pointing at
// recorderURL, NATS with sync), brings the project up from scratch and
// waits until every container is healthy and the harness is connected.
func startStack(ctx context.Context, root string, sync syncSetting, recorderURL string) (*stack, error) {
	passwords, err := readDotEnv(filepath.Join(root, ".env"))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "jetfleet-chaos-")
	if err != nil {
		return nil, err
	}
	s := &stack{root: root, project: "jetfleetchaos" + randomHex(4), dir: dir, passwords: passwords, holderByStart: map[string]string{}}
	if err := s.writeConfig(sync, recorderURL); err != nil {
		return s, err
	}
	s.env = append(os.Environ(), "CHAOS_DIR="+dir, "JETFLEET_BIND=127.0.0.1", "COMPOSE_PROJECT_NAME="+s.project)
	for _, v := range hostPortVars {
		s.env = append(s.env, v+"=0")
	}
	// The nodes' ports stay the same across their restarts (the harness
	// reconnects to them); 0 would pick a new one at every start.
	pinned := []string{"NATS_PORT", "NATS_MONITOR_PORT", "CHAOS_NATS_2_PORT", "CHAOS_NATS_2_MONITOR_PORT",
		"CHAOS_NATS_3_PORT", "CHAOS_NATS_3_MONITOR_PORT"}
	ports, err := freePorts(len(pinned))
	if err != nil {
		return s, err
	}
	for i, v := range pinned {
		s.env = append(s.env, fmt.Sprintf("%s=%d", v, ports[i])) // the last one wins
	}
	if out, err := s.compose(ctx, "up", "--detach", "--no-build"); err != nil {
		return s, fmt.Errorf("docker-compose up: %w\n%s", err, out)
	}
	if err := s.awaitHealthy(ctx, 4*time.Minute); err != nil {
		return s, err
	}
	s.containers = map[string]string{}
	for _, svc := range append(slices.Clone(natsNodes), "scheduler-1", "scheduler-2", "supervisor", "agent-1", "agent-2", "dashboard") {
		out, err := s.compose(ctx, "ps", "--quiet", svc)
		if err != nil || strings.TrimSpace(string(out)) == "" {
			return s, fmt.Errorf("docker-compose ps %s: %v: %s", svc, err, out)
		}
		s.containers[svc] = strings.TrimSpace(string(out))
	}
	var urls []string
	for _, node := range natsNodes {
		out, err := s.compose(ctx, "port", node, "4222")
		if err != nil {
			return s, fmt.Errorf("docker-compose port %s 4222: %w: %s", node, err, out)
		}
		urls = append(urls, "nats://"+strings.TrimSpace(string(out)))
	}
	s.urls = urls
	s.nc, err = connectHost(urls, "admin", passwords["ADMIN_NATS_PASSWORD"], "jetfleet chaos harness")
	if err != nil {
		return s, fmt.Errorf("connect to %v as admin: %w", urls, err)
	}
	s.js, err = jetstream.New(s.nc)
	return s, err
}

// connectHost connects from the host to the nodes' published ports. The
// addresses the cluster advertises (nats-2:4222) mean nothing here. A node
// killed or cut off behind Docker's port proxy may leave the connection open
// and silent: pings every second find that out.
func connectHost(urls []string, user, password, name string, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(strings.Join(urls, ","), append([]nats.Option{nats.UserInfo(user, password), nats.Name(name),
		nats.IgnoreDiscoveredServers(), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.Timeout(5 * time.Second), nats.PingInterval(time.Second), nats.MaxPingsOutstanding(3),
		nats.ReconnectBufSize(-1)}, opts...)...) // fail at once while reconnecting: every caller retries
}

// writeConfig writes dir/config/agent.yaml and dir/nats/ (a copy of
// config/nats with the run's sync interval).
func (s *stack) writeConfig(sync syncSetting, recorderURL string) error {
	if err := os.MkdirAll(filepath.Join(s.dir, "config"), 0o755); err != nil {
		return err
	}
	agent := fmt.Sprintf(`# Written by e2e/chaos: kind effect reports each execution to the harness.
agent:
  concurrency: 32
handlers:
  effect:
    type: http
    url: %s
    timeout: 30s
    request_timeout: 10s
    max_attempts: 25
    backoff: {initial_delay: 1s, multiplier: 1.5, max_delay: 5s}
`, recorderURL)
	if err := os.WriteFile(filepath.Join(s.dir, "config", "agent.yaml"), []byte(agent), 0o644); err != nil {
		return err
	}
	natsDir := filepath.Join(s.dir, "nats")
	if err := os.MkdirAll(natsDir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"accounts.conf", "cluster.conf", "jetfleet.conf"} {
		b, err := os.ReadFile(filepath.Join(s.root, "config", "nats", name))
		if err != nil {
			return err
		}
		if name == "cluster.conf" {
			line := regexp.MustCompile(`(?m)^\s*sync_interval:.*$`)
			if !line.Match(b) {
				return errors.New("config/nats/cluster.conf sets no sync_interval: the run cannot choose one")
			}
			if sync == syncDefault {
				b = line.ReplaceAll(b, []byte("  # sync_interval: the default (2 minutes), set by e2e/chaos"))
			}
		}
		if err := os.WriteFile(filepath.Join(natsDir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// compose runs docker-compose on the project.
func (s *stack) compose(ctx context.Context, args ...string) ([]byte, error) {
	full := []string{"--project-name", s.project}
	for _, f := range composeFiles {
		full = append(full, "--file", filepath.Join(s.root, f))
	}
	cmd := exec.CommandContext(ctx, "docker-compose", append(full, args...)...)
	cmd.Dir, cmd.Env = s.root, s.env
	return cmd.CombinedOutput()
}

// docker runs the Docker CLI.
func docker(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// down removes the project's containers, networks and volumes and the
// run's directory, also after a failure; keep leaves the directory, with
// every container's whole log in it (logs.txt).
func (s *stack) down(keep bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if s.nc != nil {
		s.nc.Close()
	}
	if keep {
		out, _ := s.compose(ctx, "logs", "--no-color", "--timestamps")
		if err := os.WriteFile(filepath.Join(s.dir, "logs.txt"), out, 0o600); err == nil {
			fmt.Fprintf(os.Stderr, "chaos: the logs of project %s are in %s\n", s.project, filepath.Join(s.dir, "logs.txt"))
		}
	}
	// Paused containers do not stop; disconnected ones are removed anyway.
	for _, id := range s.containers {
		_ = docker(ctx, "unpause", id)
	}
	// Anonymous volumes (an image's VOLUME) carry no project label: note
	// them before the containers go.
	var anonymous []string
	for _, id := range s.containers {
		out, err := execOutput(ctx, "docker", "inspect", "--format", `{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}`, id)
		if err == nil {
			anonymous = append(anonymous, strings.Fields(out)...)
		}
	}
	if out, err := s.compose(ctx, "down", "--volumes", "--remove-orphans", "--timeout", "5"); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: docker-compose down of %s: %v\n%s\n", s.project, err, out)
	}
	// Whatever compose left (it failed, or was interrupted): by the
	// project's label.
	label := "label=com.docker.compose.project=" + s.project
	for _, kind := range [][]string{{"ps", "-aq"}, {"network", "ls", "-q"}, {"volume", "ls", "-q"}} {
		out, err := execOutput(ctx, "docker", append(kind, "--filter", label)...)
		if ids := strings.Fields(out); err == nil && len(ids) > 0 {
			rm := map[string][]string{"ps": {"rm", "-f"}, "network": {"network", "rm"}, "volume": {"volume", "rm", "-f"}}[kind[0]]
			if err := docker(ctx, append(rm, ids...)...); err != nil {
				fmt.Fprintf(os.Stderr, "chaos: removing what %s left: %v\n", s.project, err)
			}
		}
	}
	for _, v := range anonymous {
		_ = docker(ctx, "volume", "rm", "-f", v) // gone already when compose removed it
	}
	if !keep {
		_ = os.RemoveAll(s.dir)
	}
}

// logs is the tail of every container's log, for a failed run.
func (s *stack) logs(ctx context.Context, lines int) string {
	out, _ := s.compose(ctx, "logs", "--no-color", "--tail", fmt.Sprint(lines))
	return string(out)
}

// awaitHealthy waits until every container runs and is healthy.
func (s *stack) awaitHealthy(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if last = s.healthy(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack %s not healthy within %s: %w", s.project, timeout, last)
		case <-time.After(time.Second):
		}
	}
}

func (s *stack) healthy(ctx context.Context) error {
	out, err := s.compose(ctx, "ps", "--quiet")
	if err != nil {
		return fmt.Errorf("docker-compose ps: %v: %s", err, out)
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		return errors.New("no containers")
	}
	out, err = exec.CommandContext(ctx, "docker", append([]string{"inspect", "--format",
		`{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}`}, ids...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("docker inspect: %v: %s", err, out)
	}
	var waiting []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[1] != "running" || (f[2] != "healthy" && f[2] != "none") {
			waiting = append(waiting, strings.TrimPrefix(line, "/"))
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("waiting for %s", strings.Join(waiting, ", "))
	}
	return nil
}

// network is the project's compose network.
func (s *stack) network() string { return s.project + "_default" }

// leaseHolder is who holds role's lease ("" when nobody does).
func (s *stack) leaseHolder(ctx context.Context, role string) (string, error) {
	kv, err := s.js.KeyValue(ctx, protocol.BucketLeases)
	if err != nil {
		return "", err
	}
	entry, err := kv.Get(ctx, role)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var v struct {
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal(entry.Value(), &v); err != nil {
		return "", fmt.Errorf("lease %s: %w", role, err)
	}
	return v.Holder, nil
}

// holders maps the lease holder names of services to their compose
// service. A replica names its holder in its first log lines ("scheduler
// started"), new at every start of its process: the log is read from the
// container's last start, only until that line, and remembered per start.
func (s *stack) holders(ctx context.Context, services ...string) (map[string]string, error) {
	m := map[string]string{}
	for _, svc := range services {
		id := s.containers[svc]
		started, err := execOutput(ctx, "docker", "inspect", "--format", "{{.State.StartedAt}}", id)
		if err != nil {
			return nil, err
		}
		key := id + "@" + strings.TrimSpace(started)
		s.mu.Lock()
		holder, ok := s.holderByStart[key]
		s.mu.Unlock()
		if !ok {
			if holder, err = firstHolder(ctx, id, strings.TrimSpace(started)); err != nil {
				return nil, fmt.Errorf("%s: %w", svc, err)
			}
			s.mu.Lock()
			s.holderByStart[key] = holder
			s.mu.Unlock()
		}
		if holder != "" {
			m[holder] = svc
		}
	}
	return m, nil
}

// firstHolder reads container id's log from since until a line names a
// holder ("" when none does yet).
func firstHolder(ctx context.Context, id, since string) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops docker logs once the line is found
	cmd := exec.CommandContext(ctx, "docker", "logs", "--since", since, id)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	cmd.Stderr = cmd.Stdout // the services log to stderr
	if err := cmd.Start(); err != nil {
		return "", err
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Holder string `json:"holder"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Holder != "" {
			return line.Holder, nil
		}
	}
	return "", nil
}

// leader is the compose service holding role's lease, waiting up to
// timeout for one among services.
func (s *stack) leader(ctx context.Context, role string, timeout time.Duration, services ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		opCtx, cancel := context.WithTimeout(ctx, 3*time.Second) // a request lost with a node is asked again
		holder, err := s.leaseHolder(opCtx, role)
		cancel()
		if err == nil && holder != "" {
			var names map[string]string
			if names, err = s.holders(ctx, services...); err == nil {
				if svc, ok := names[holder]; ok {
					return svc, nil
				}
				err = fmt.Errorf("holder %s is none of %v", holder, services)
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no %s leader within %s (%v)", role, timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// freePorts is n distinct TCP ports free on 127.0.0.1 right now, below
// 32768: Docker hands out the ports it publishes for a port of 0 from
// 32768 up, and one of those, taken by another container of the stack
// before a node started, made the node's start fail.
func freePorts(n int) ([]int, error) {
	var ports []int
	for try := 0; len(ports) < n && try < 1000; try++ {
		port := 20000 + mathrand.IntN(12000)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken
		}
		defer func() { _ = ln.Close() }() // held until all are chosen: no port twice
		ports = append(ports, port)
	}
	if len(ports) < n {
		return nil, fmt.Errorf("no %d free ports between 20000 and 32000 on 127.0.0.1", n)
	}
	return ports, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// readDotEnv reads the repository's .env: the stack's dev-only passwords.
func readDotEnv(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			if env, set := os.LookupEnv(k); set {
				v = env
			}
			m[k] = v
		}
	}
	return m, nil
}
