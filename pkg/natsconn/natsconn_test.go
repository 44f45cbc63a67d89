package natsconn

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natstest"
)

func TestConnect(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, err := Connect(Config{URL: srv.ClientURL()}, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	defer nc.Close()
	assert.True(t, nc.IsConnected())
}

func TestConnectErrorHidesPassword(t *testing.T) {
	t.Parallel()
	_, err := Connect(Config{URL: "nats://bob:s3cret@127.0.0.1:1", ConnectTimeout: 200_000_000}, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret")
	assert.Contains(t, err.Error(), "127.0.0.1:1")
}

func TestValidate(t *testing.T) {
	t.Parallel()
	assert.ErrorContains(t, Config{User: "a", Token: "b"}.Validate("nats"), "nats.user")
	assert.ErrorContains(t, Config{Password: "p"}.Validate("nats"), "nats.password")
	assert.NoError(t, Config{User: "a", Password: "p"}.Validate("nats"))
	assert.ErrorContains(t, Config{PingInterval: time.Millisecond}.Validate("nats"), "nats.ping_interval")
}

// TestNothingSentWhileDisconnectedArrivesLater: a publish made while the
// server is away fails at once, and is not delivered once the connection
// is back — a caller that gave up on it must not see it acted on later.
func TestNothingSentWhileDisconnectedArrivesLater(t *testing.T) {
	t.Parallel()
	srv := natstest.RestartableServer(t, embedded.Options{})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	nc, err := Connect(Config{URL: srv.URL()}, "test", logger)
	require.NoError(t, err)
	defer nc.Close()
	reconnected := make(chan struct{}, 1)
	nc.SetReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} })
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "STALE", Subjects: []string{"stale.>"}})
	require.NoError(t, err)

	srv.Stop()
	require.Eventually(t, func() bool { return !nc.IsConnected() }, 10*time.Second, 5*time.Millisecond)
	assert.ErrorIs(t, nc.Publish("stale.write", []byte("late")), nats.ErrReconnectBufExceeded)
	_, err = nc.Request("stale.request", []byte("late"), 100*time.Millisecond)
	assert.Error(t, err)

	srv.Start(t)
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("not reconnected")
	}
	// Anything held back would go out before this, at the reconnect.
	_, err = js.Publish(ctx, "stale.fresh", []byte("now"))
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter("stale.>"))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"stale.fresh": 1}, info.State.Subjects, "only the fresh message was stored")
}

// TestSilentServerIsLeftForAnother: a server that stops answering without
// closing the connection (a partition: no reset, no FIN) is noticed by the
// pings and left for another server of the list — within a few ping
// intervals, not NATS's default of minutes.
func TestSilentServerIsLeftForAnother(t *testing.T) {
	t.Parallel()
	proxies := map[string]*natstest.Proxy{}
	var urls []string
	for range 2 {
		p := natstest.NewProxy(t, strings.TrimPrefix(natstest.Server(t).ClientURL(), "nats://"))
		proxies[p.URL()] = p
		urls = append(urls, p.URL())
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	nc, err := Connect(Config{URL: strings.Join(urls, ","), PingInterval: 200 * time.Millisecond}, "test", logger)
	require.NoError(t, err)
	defer nc.Close()
	frozen := nc.ConnectedUrl()
	require.Contains(t, proxies, frozen)
	moved := make(chan string, 1)
	nc.SetReconnectHandler(func(c *nats.Conn) { moved <- c.ConnectedUrl() })
	proxies[frozen].Pause() // the connection stays open; nothing crosses it any more
	select {
	case url := <-moved:
		assert.NotEqual(t, frozen, url)
	case <-time.After(30 * time.Second): // a bound for a loaded machine; it takes about 4 intervals
		t.Fatal("the client stayed on a server that no longer answers")
	}
}

// TestReconnectDialGivesUpOnASilentServerSoon: a cut-off server leaves a
// dial unanswered, no refusal. The first connection's dials wait
// connect_timeout; a reconnection's at most ReconnectDialTimeout, so a
// service tries the next server soon.
func TestReconnectDialGivesUpOnASilentServerSoon(t *testing.T) {
	t.Parallel()
	silent := silentAddress(t)
	d := &dialer{first: time.Minute}
	d.connected.Store(true)
	start := time.Now()
	conn, err := d.Dial("tcp", silent)
	if conn != nil {
		_ = conn.Close()
	}
	var netErr net.Error
	require.ErrorAs(t, err, &netErr, "the dial must not succeed: the address answers no dial")
	assert.True(t, netErr.Timeout(), "a timeout, not a refusal: %v", err)
	assert.Less(t, time.Since(start), 30*time.Second, "bounded by ReconnectDialTimeout (%s), not connect_timeout (1m)", ReconnectDialTimeout)

	first := &dialer{first: 100 * time.Millisecond}
	_, err = first.Dial("tcp", silent)
	require.ErrorAs(t, err, &netErr, "the first connection's dials wait connect_timeout, when shorter")
	assert.True(t, netErr.Timeout())
}

// silentAddress is a loopback address whose dials hang, as a cut-off
// server's do: a socket listening with a backlog of 0, its accept queue
// filled and never accepted, so the kernel drops further SYNs.
func silentAddress(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue: the fillers connect, later dials hang.
	for range 4 {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	return addr
}
