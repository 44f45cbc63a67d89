// Package freeport picks loopback TCP ports for test servers and processes
// that must be told their port before they start (a restarted nats-server,
// a role's metrics listener, a cluster's routes).
//
// A port taken from the kernel with ":0" lies in the ephemeral range, which
// the kernel also hands to outgoing connections: between closing the probe and
// the server binding, or while a killed process is down before its restart, a
// client connection may take it ("bind: address already in use"). Ports here
// come from below that range, where outgoing connections do not land (other
// processes binding ports of their own still may: Pick checks that the port
// is free, and picks at random among thousands).
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

const (
	// lowest is the first port handed out: above the well-known and most
	// registered service ports.
	lowest = 15000
	// defaultEphemeralLow is Linux's default start of the ephemeral range,
	// used when /proc does not say.
	defaultEphemeralLow = 32768
	attempts            = 200
)

var (
	mu     sync.Mutex
	issued = map[int]bool{} // handed out by this process: the probe's close frees them again
)

// Pick returns a loopback TCP port below the ephemeral range that nobody
// listened on at the time of the call and that this process has not handed
// out before.
func Pick() (int, error) {
	highest := ephemeralLow() - 1
	if highest-lowest < 1000 {
		// A host whose ephemeral range starts low leaves no room below it:
		// the kernel's pick, as before.
		return kernelPort()
	}
	return pickFrom(func() int { return lowest + rand.IntN(highest-lowest+1) })
}

// kernelPort is a port the kernel hands out for ":0".
func kernelPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("freeport: %w", err)
	}
	defer func() { _ = l.Close() }() // only its port was wanted
	return l.Addr().(*net.TCPAddr).Port, nil
}

// pickFrom tries the candidates next returns.
func pickFrom(next func() int) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	var lastErr error
	for range attempts {
		port := next()
		if issued[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			lastErr = err
			continue
		}
		_ = l.Close() // only the port was wanted
		issued[port] = true
		return port, nil
	}
	if lastErr == nil {
		lastErr = errors.New("every port tried was handed out before")
	}
	return 0, fmt.Errorf("freeport: no free port after %d tries: %w", attempts, lastErr)
}

// ephemeralLow reads the start of the kernel's ephemeral port range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemeralLow
	}
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		return defaultEphemeralLow
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil {
		return defaultEphemeralLow
	}
	return low
}
