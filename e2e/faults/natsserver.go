package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jetfleet/jetfleet/pkg/natstest/freeport"
)

// natsServer is the fleet's standalone nats-server: a file store with
// sync_interval always (as config/nats/jetfleet.conf), no authentication,
// on a loopback port that stays the same across restarts.
type natsServer struct {
	bin, dir string
	port     int
	procs    *procSet
	// p is the current process; gen counts the processes started.
	p   *proc
	gen int
}

func newNATSServer(bin, dir string, procs *procSet) (*natsServer, error) {
	port, err := freeport.Pick()
	if err != nil {
		return nil, err
	}
	s := &natsServer{bin: bin, dir: dir, port: port, procs: procs}
	conf := fmt.Sprintf(`# Written by the fault run (e2e/faults): one server, loopback only.
server_name: faults
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
  sync_interval: always
}
`, port, filepath.Join(dir, "nats-store"))
	if err := os.WriteFile(s.confPath(), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *natsServer) confPath() string { return filepath.Join(s.dir, "nats-server.conf") }

func (s *natsServer) url() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// start runs the server and returns when it accepts connections: readyAt
// is the first moment a TCP connection to it succeeded, then its log says
// it is ready (JetStream recovered).
func (s *natsServer) start(ctx context.Context) (readyAt time.Time, err error) {
	s.gen++
	p, err := startProc(procSpec{
		name:     fmt.Sprintf("nats-server#%d", s.gen),
		path:     s.bin,
		args:     []string{"-c", s.confPath()},
		env:      []string{"PATH=/usr/bin:/bin"},
		logPath:  filepath.Join(s.dir, fmt.Sprintf("nats-server.%d.log", s.gen)),
		remember: []string{"Server is ready"},
	})
	if err != nil {
		return time.Time{}, err
	}
	s.procs.add(p)
	s.p = p
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	addr := "127.0.0.1:" + strconv.Itoa(s.port)
	for {
		conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			readyAt = time.Now()
			_ = conn.Close()
			break
		}
		if p.exited() {
			return time.Time{}, fmt.Errorf("%s exited (%v):\n%s", p.spec.name, p.waitErr, p.tail(20))
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s does not accept connections on %s: %w", p.spec.name, addr, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if _, err := p.line(ctx, "Server is ready"); err != nil {
		return time.Time{}, err
	}
	return readyAt, nil
}

// halt ends the server with sig (SIGTERM: a clean shutdown; SIGKILL: a
// crash) and waits until it is gone.
func (s *natsServer) halt(sig syscall.Signal) error {
	if err := s.p.signal(sig); err != nil {
		return err
	}
	return s.p.wait(30 * time.Second)
}
