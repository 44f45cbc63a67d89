// Command healthcheck probes endpoints from inside a FROM-scratch container,
// where there is no shell, curl or wget to write a compose health check with.
//
//	healthcheck http://127.0.0.1:13133/status   # GET must answer 2xx
//	healthcheck tcp://127.0.0.1:4222            # a TCP connection must succeed
//
// Every argument is probed; the exit status is 0 only when all succeed. Each probe
// times out after HEALTHCHECK_TIMEOUT (a Go duration, default 3s).
//
// HTTP is spoken by hand (one HTTP/1.0 GET, only the status line is read) instead of
// with net/http, which keeps the binary at about a third of the size. No https: the
// probes target plain-HTTP health endpoints on the loopback interface.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: healthcheck http://host:port/path | tcp://host:port ...")
		os.Exit(2)
	}
	timeout := 3 * time.Second
	if s := os.Getenv("HEALTHCHECK_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "HEALTHCHECK_TIMEOUT: %v\n", err)
			os.Exit(2)
		}
		timeout = d
	}
	status := 0
	for _, target := range os.Args[1:] {
		if err := probe(target, timeout); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", target, err)
			status = 1
		}
	}
	os.Exit(status)
}

func probe(target string, timeout time.Duration) error {
	u, err := url.Parse(target)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "tcp":
		conn, err := net.DialTimeout("tcp", u.Host, timeout)
		if err != nil {
			return err
		}
		return conn.Close()
	case "http":
		return probeHTTP(u, timeout)
	default:
		return fmt.Errorf("unsupported scheme %q (want http or tcp)", u.Scheme)
	}
}

func probeHTTP(u *url.URL, timeout time.Duration) error {
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	req := "GET " + u.RequestURI() + " HTTP/1.0\r\nHost: " + u.Host +
		"\r\nUser-Agent: jetfleet-healthcheck\r\nConnection: close\r\n\r\n"
	if _, err := conn.Write([]byte(req)); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the status line: %w", err)
	}
	// "HTTP/1.1 200 OK"
	fields := strings.Fields(line)
	if len(fields) < 2 || !strings.HasPrefix(fields[0], "HTTP/") {
		return fmt.Errorf("not an HTTP response: %q", strings.TrimSpace(line))
	}
	code, err := strconv.Atoi(fields[1])
	if err != nil {
		return fmt.Errorf("bad status line %q", strings.TrimSpace(line))
	}
	if code < 200 || code > 299 {
		return errors.New("HTTP status " + strings.TrimSpace(strings.Join(fields[1:], " ")))
	}
	return nil
}
