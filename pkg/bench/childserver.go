package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/embedded"
)

// A scenario that measures the memory of the fleet's processes (delayed,
// durability) runs its NATS servers in child processes: the same
// executable, started with childServerEnv holding the server's options
// (embedded.Options, as JSON). The child starts an embedded server, writes
// its client URL on stdout and runs until its stdin closes, so the bench's
// own heap is the fleet's alone and each server's memory is its process's.
const childServerEnv = "JETFLEET_BENCH_CHILD_SERVER"

// RunChildServerIfAsked runs the bench's child NATS server and exits when
// this process was started as one, and returns at once otherwise. Call it
// first thing in main, and in TestMain of tests that run the bench.
func RunChildServerIfAsked() {
	spec := os.Getenv(childServerEnv)
	if spec == "" {
		return
	}
	var opts embedded.Options
	if err := json.Unmarshal([]byte(spec), &opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench child server: options:", err)
		os.Exit(1)
	}
	srv, err := embedded.Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench child server:", err)
		os.Exit(1)
	}
	fmt.Println(srv.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the bench closes it, or dies
	srv.Shutdown()
	srv.WaitForShutdown()
	os.Exit(0)
}

// childServer is a NATS server in a child process.
type childServer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	url   string
}

// startChildServer starts a child server with opts.
func startChildServer(ctx context.Context, opts embedded.Options) (*childServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childServerEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the child server: %w", err)
	}
	c := &childServer{cmd: cmd, stdin: stdin}
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case c.url = <-lines:
	case <-ctx.Done():
		c.stop()
		return nil, fmt.Errorf("child server: %w", ctx.Err())
	case <-time.After(childStartTimeout):
		c.stop()
		return nil, fmt.Errorf("child server printed no URL within %s", childStartTimeout)
	}
	if !strings.HasPrefix(c.url, "nats://") {
		c.stop()
		return nil, fmt.Errorf("child server printed %q, not its URL (does this executable call bench.RunChildServerIfAsked?)", c.url)
	}
	return c, nil
}

// childStartTimeout bounds a child server's start; a cluster node's waits
// for its routes and its JetStream meta leader.
const childStartTimeout = time.Minute

// stop ends the child: its stdin closes, it shuts its server down.
func (c *childServer) stop() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() {
		_ = c.cmd.Wait() // told to stop (or killed): its exit status says nothing more
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// rss returns the child's resident set size and its peak, from /proc
// (Linux); zeros elsewhere.
func (c *childServer) rss() (current, peak int64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(c.cmd.Process.Pid) + "/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		field, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch field {
		case "VmRSS":
			current = kb * 1024
		case "VmHWM":
			peak = kb * 1024
		}
	}
	return current, peak
}
