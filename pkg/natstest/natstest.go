// Package natstest starts real NATS servers with JetStream for tests: one
// server per test on a random loopback port with a temporary store, or an
// in-process three-node cluster where replication matters.
package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natstest/freeport"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Server starts a single JetStream server for the test and shuts it down
// when the test ends. The server's URL is srv.ClientURL().
func Server(t testing.TB) *server.Server {
	t.Helper()
	return ServerWith(t, embedded.Options{})
}

// ServerWith is Server with options; Port and StoreDir default to a random
// port and t.TempDir().
func ServerWith(t testing.TB, opts embedded.Options) *server.Server {
	t.Helper()
	if opts.Port == 0 {
		opts.Port = -1
	}
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	srv, err := embedded.Start(opts)
	if err != nil {
		t.Fatalf("natstest: start server: %v", err)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// Connect opens a connection to srv that is closed when the test ends.
func Connect(t testing.TB, srv *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return ConnectURL(t, srv.ClientURL(), opts...)
}

// ConnectURL opens a connection to url that is closed when the test ends.
func ConnectURL(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// JetStream opens a connection to srv and returns its JetStream context.
func JetStream(t testing.TB, srv *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := Connect(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

// Cluster is an in-process JetStream cluster.
type Cluster struct {
	Servers []*server.Server
	// routeProxies carries each node's routes to each other node, keyed by
	// (from, to); only in a cluster from StartPartitionableCluster.
	routeProxies map[[2]int]*Proxy
	// clientProxies are those of ClientURLs, by node.
	clientProxies map[int][]*Proxy
}

// ClientURLs is a comma-separated list of a new proxy to each node's client
// port, in the nodes' order: a client given it reaches a node cut off (Cut)
// no more, as in a real partition, and moves to another. In a cluster from
// StartPartitionableCluster, the nodes do not tell their clients of the
// others' real URLs, so that none bypasses the proxies.
func (c *Cluster) ClientURLs(t testing.TB) string {
	t.Helper()
	if c.clientProxies == nil {
		c.clientProxies = map[int][]*Proxy{}
	}
	urls := make([]string, len(c.Servers))
	for i, srv := range c.Servers {
		p := NewProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
		c.clientProxies[i] = append(c.clientProxies[i], p)
		urls[i] = p.URL()
	}
	return strings.Join(urls, ",")
}

// URLs is a comma-separated list of every server's client URL, ready for nats.Connect.
func (c *Cluster) URLs() string {
	var s string
	for i, srv := range c.Servers {
		if i > 0 {
			s += ","
		}
		s += srv.ClientURL()
	}
	return s
}

// StartCluster starts an n-node JetStream cluster on loopback, each node with
// its own temporary store, and waits until it has a meta leader. It is shut
// down when the test ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	ports := clusterPorts(t, n)
	routes := make([]string, n)
	for i, port := range ports {
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", port)
	}
	return startCluster(t, ports, func(int) []string { return routes }, "", nil)
}

// StartPartitionableCluster is StartCluster with every route from one node
// to another through a proxy of its own, so that a test can cut a node off
// from the others (Cut) the way a network partition does: the node and its
// clients keep running, and nothing passes between it and the other nodes
// until Heal. Routes a node learns of through another node (implicit ones)
// would bypass the proxies, so every node advertises a closed port for them.
func StartPartitionableCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	ports := clusterPorts(t, n)
	proxies := make(map[[2]int]*Proxy, n*(n-1))
	for from := range n {
		for to := range n {
			if from != to {
				proxies[[2]int{from, to}] = NewProxy(t, fmt.Sprintf("127.0.0.1:%d", ports[to]))
			}
		}
	}
	routesOf := func(from int) []string {
		var routes []string
		for to := range n {
			if p := proxies[[2]int{from, to}]; p != nil {
				routes = append(routes, "nats-route://"+p.ln.Addr().String())
			}
		}
		return routes
	}
	return startCluster(t, ports, routesOf, fmt.Sprintf("127.0.0.1:%d", freePort(t)), proxies)
}

// Cut freezes every route between node i and the other nodes, in both
// directions, and the connections of clients that reach it through
// ClientURLs: the others elect new leaders for what it led once their
// election timeouts pass.
func (c *Cluster) Cut(i int) {
	c.eachRouteOf(i, (*Proxy).Pause)
	for _, p := range c.clientProxies[i] {
		p.Pause()
	}
}

// Heal lets the routes and client proxies of node i pass again, what they
// held first.
func (c *Cluster) Heal(i int) {
	c.eachRouteOf(i, (*Proxy).Unpause)
	for _, p := range c.clientProxies[i] {
		p.Unpause()
	}
}

// StreamLeader is the name of the node that leads stream, or "" while it
// has no leader, or none that answers within a second.
func StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return ""
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return ""
	}
	return info.Cluster.Leader
}

// StepDownStream asks stream's leader to step down, so that the others
// elect one of them, and waits until the stream is led again.
func StepDownStream(t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	reply, err := js.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("natstest: step down the leader of %s: %v", stream, err)
	}
	var answer struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &answer); err != nil || answer.Error != nil {
		t.Fatalf("natstest: step down the leader of %s: %s", stream, reply.Data)
	}
	awaitLeader(t, js, stream, 10*time.Second, "a leader", func(string) bool { return true })
}

// MoveStreamLeaderOff steps stream's leader down until a node other than
// node keep leads it, and returns that node's index: the node a test cuts
// off while its clients stay on node keep.
func (c *Cluster) MoveStreamLeaderOff(t testing.TB, js jetstream.JetStream, stream string, keep int) int {
	t.Helper()
	for stepDowns := 0; ; stepDowns++ { // each election picks one of the nodes at random
		if l := StreamLeader(context.Background(), js, stream); l != "" && l != c.Servers[keep].Name() {
			i := slices.IndexFunc(c.Servers, func(s *server.Server) bool { return s.Name() == l })
			if i < 0 {
				t.Fatalf("natstest: %s is led by %s, no node of the cluster", stream, l)
			}
			return i
		}
		if stepDowns == 5 {
			t.Fatalf("natstest: %s is still led by node %d after five step-downs", stream, keep)
		}
		StepDownStream(t, js, stream)
	}
}

// MoveStreamLeaderTo asks stream's leader to step down in favour of node
// i until node i is seen leading it: the setup of a test in which one node
// leads what a service needs.
func (c *Cluster) MoveStreamLeaderTo(t testing.TB, js jetstream.JetStream, stream string, i int) {
	t.Helper()
	name := c.Servers[i].Name()
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatalf("natstest: %s is not led by %s after five step-downs in its favour", stream, name)
		}
		awaitCurrent(t, js, stream, name)
		if StreamLeader(context.Background(), js, stream) == name {
			return
		}
		req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, name)
		reply, err := js.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req), 5*time.Second)
		if err != nil {
			t.Fatalf("natstest: step down the leader of %s for %s: %v", stream, name, err)
		}
		var answer struct {
			Error *jetstream.APIError `json:"error"`
		}
		if err := json.Unmarshal(reply.Data, &answer); err != nil {
			t.Fatalf("natstest: step down the leader of %s for %s: %s", stream, name, reply.Data)
		}
		if answer.Error == nil {
			// The server may hand the lead to another node than the one
			// preferred (one it has not heard from lately): check.
			awaitLeader(t, js, stream, 10*time.Second, "a leader", func(string) bool { return true })
			if StreamLeader(context.Background(), js, stream) == name {
				return
			}
		}
		time.Sleep(100 * time.Millisecond) // a pause before asking again, not a synchronisation
	}
}

// CutUntilElected cuts node i off (Cut) and waits until another node leads
// stream. It returns when the cut was made and when the election was seen;
// the server sends no event for an election, so this polls.
func (c *Cluster) CutUntilElected(t testing.TB, js jetstream.JetStream, stream string, i int) (cut, elected time.Time) {
	t.Helper()
	c.Cut(i)
	cut = time.Now()
	awaitLeader(t, js, stream, time.Minute, "a leader other than the cut node", func(l string) bool { return l != c.Servers[i].Name() })
	return cut, time.Now()
}

// awaitCurrent polls until node name is a current replica of stream (or
// leads it): a step-down in its favour is refused before.
func awaitCurrent(t testing.TB, js jetstream.JetStream, stream, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if s, err := js.Stream(context.Background(), stream); err == nil && s.CachedInfo().Cluster != nil {
			cl := s.CachedInfo().Cluster
			if cl.Leader == name || slices.ContainsFunc(cl.Replicas, func(p *jetstream.PeerInfo) bool { return p.Name == name && p.Current }) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: %s is not a current replica of %s after 10s", name, stream)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream's state: there is no event to wait on
	}
}

// awaitLeader polls until stream has a leader that accept takes; want
// says which, for the failure.
func awaitLeader(t testing.TB, js jetstream.JetStream, stream string, timeout time.Duration, want string, accept func(leader string) bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; {
		if l := StreamLeader(context.Background(), js, stream); l != "" && accept(l) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: %s has no %s after %s", stream, want, timeout)
		}
		time.Sleep(20 * time.Millisecond) // polling the stream's state: there is no event to wait on
	}
}

func (c *Cluster) eachRouteOf(i int, do func(*Proxy)) {
	if c.routeProxies == nil {
		panic("natstest: Cut and Heal need a cluster from StartPartitionableCluster")
	}
	for pair, p := range c.routeProxies {
		if pair[0] == i || pair[1] == i {
			do(p)
		}
	}
}

func clusterPorts(t testing.TB, n int) []int {
	ports := make([]int, n)
	for i := range ports {
		ports[i] = freePort(t)
	}
	return ports
}

// startCluster starts a node per route port, node i routing to
// routesOf(i), and waits until the cluster can place a stream on each.
func startCluster(t testing.TB, ports []int, routesOf func(i int) []string, advertise string, proxies map[[2]int]*Proxy) *Cluster {
	t.Helper()
	n := len(ports)
	name := fmt.Sprintf("jf-%d", time.Now().UnixNano())
	c := &Cluster{routeProxies: proxies}
	type result struct {
		i   int
		srv *server.Server
		err error
	}
	results := make(chan result, n)
	for i := range n {
		go func() {
			srv, err := embedded.Start(embedded.Options{
				Port: -1, StoreDir: t.TempDir(), ServerName: fmt.Sprintf("%s-n%d", name, i),
				Cluster: embedded.ClusterOptions{Name: name, Port: ports[i], Routes: routesOf(i), Advertise: advertise,
					NoAdvertise: proxies != nil},
				ReadyTimeout: 30 * time.Second,
			})
			results <- result{i, srv, err}
		}()
	}
	c.Servers = make([]*server.Server, n)
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("natstest: start cluster node %d: %v", r.i, r.err)
		}
		c.Servers[r.i] = r.srv
	}
	t.Cleanup(func() {
		for _, srv := range c.Servers {
			srv.Shutdown()
		}
		for _, srv := range c.Servers {
			srv.WaitForShutdown()
		}
	})
	if proxies != nil {
		t.Cleanup(func() { // before the nodes shut down: a node does not wait on a frozen route
			for _, p := range proxies {
				p.Unpause()
			}
		})
	}
	c.WaitForMetaLeader(t, 30*time.Second)
	c.WaitForPlacement(t, 30*time.Second)
	return c
}

// WaitForMetaLeader waits until JetStream in the cluster answers account
// requests, which needs an elected meta leader.
func (c *Cluster) WaitForMetaLeader(t testing.TB, timeout time.Duration) {
	t.Helper()
	nc := ConnectURL(t, c.URLs())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: cluster has no JetStream meta leader after %s: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond) // polling an external condition; no event to wait on
	}
}

// WaitForPlacement waits until the cluster can place a stream on every node,
// which needs every node to have sent the stats the placement reads. Before
// that, creating one fails with "no suitable peers for placement, peer
// offline" (JetStream error 10005; seen on a loaded machine). The server
// offers no event for it, so this probes: it creates and deletes a small
// stream with a replica on each node.
func (c *Cluster) WaitForPlacement(t testing.TB, timeout time.Duration) {
	t.Helper()
	js, err := jetstream.New(ConnectURL(t, c.URLs()))
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PLACEMENT_PROBE", Subjects: []string{"natstest.placement.probe"},
			Replicas: len(c.Servers), Storage: jetstream.MemoryStorage})
		if err == nil {
			if err := js.DeleteStream(ctx, "PLACEMENT_PROBE"); err != nil {
				t.Fatalf("natstest: delete the placement probe: %v", err)
			}
			return
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != topology.ErrCodeNoPeers {
			t.Fatalf("natstest: placement probe: %v", err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("natstest: the cluster cannot place an R%d stream after %s: %v", len(c.Servers), timeout, err)
		case <-time.After(20 * time.Millisecond): // polling the servers' state: there is no event to wait on
		}
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Pick()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return port
}

// Restartable is a JetStream server a test stops and starts again on the
// same port and store, as an operator restarts nats-server: clients
// reconnect to it and find their streams, consumers and buckets.
type Restartable struct {
	opts embedded.Options

	mu  sync.Mutex
	srv *server.Server
}

// RestartableServer starts a server the test may Stop and Start; it is shut
// down when the test ends.
func RestartableServer(t testing.TB, opts embedded.Options) *Restartable {
	t.Helper()
	if opts.Port == 0 {
		opts.Port = freePort(t)
	}
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	r := &Restartable{opts: opts}
	r.Start(t)
	t.Cleanup(r.Stop)
	return r
}

// URL is the server's client URL, the same across restarts.
func (r *Restartable) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", r.opts.Port) }

// Server is the running server, nil while stopped.
func (r *Restartable) Server() *server.Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.srv
}

// Stop shuts the server down and waits until it is gone; clients see a
// disconnection. Stopping a stopped server does nothing.
func (r *Restartable) Stop() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Start starts the server again (or the first time) and waits until it
// accepts connections with JetStream ready.
func (r *Restartable) Start(t testing.TB) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.srv != nil {
		return
	}
	var err error
	// The port may take a moment to be free again after a shutdown.
	for attempt := 0; attempt < 50; attempt++ {
		if r.srv, err = embedded.Start(r.opts); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond) // no event announces a freed port
	}
	t.Fatalf("natstest: restart server: %v", err)
}

// Proxy forwards TCP connections to a NATS server and can freeze them in
// both directions, the way SIGSTOP freezes a process: nothing is lost,
// everything arrives late.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	paused bool
	resume chan struct{}
	conns  []net.Conn
	wg     sync.WaitGroup
}

func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natstest: proxy: %v", err)
	}
	p := &Proxy{ln: ln, target: target, resume: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *Proxy) pipe(from, to net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			p.gate()
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			_ = to.Close() // EOF or a closed socket: pass the close on
			return
		}
	}
}

// gate blocks while the proxy is paused.
func (p *Proxy) gate() {
	p.mu.Lock()
	paused, resume := p.paused, p.resume
	p.mu.Unlock()
	if paused {
		<-resume
	}
}

// Pause freezes every connection through the proxy in both directions.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
}

// Unpause lets everything held pass on, in order.
func (p *Proxy) Unpause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		close(p.resume)
		p.resume = make(chan struct{})
	}
}

// Close ends the proxy and its connections (also at the end of the test).
func (p *Proxy) Close() {
	p.Unpause()
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// VerifyNoLeaks runs the tests of m and then fails when goroutines are left
// over — except those the embedded NATS server and its store keep until
// their last references are gone, which are not the tested package's. Call
// it from TestMain: func TestMain(m *testing.M) { natstest.VerifyNoLeaks(m) }.
func VerifyNoLeaks(m *testing.M) { goleak.VerifyTestMain(m, leakOptions...) }

// FindLeaks reports goroutines left over, as VerifyNoLeaks judges them, for
// a TestMain that does more around m.Run.
func FindLeaks() error { return goleak.Find(leakOptions...) }

var leakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start.func1"),
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).syncBlocks"),
	// A stream create that reaches the server while it shuts down (a
	// supervisor leader provisioning TRENDS as its test ends) leaves that
	// stream's file store running: its flush loop and its registration with
	// the server's access-time service. The server's, not ours; seen in about
	// one full pkg/supervisor run in three on a loaded machine.
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"),
	// JOBS sources DELAYED: the server waits for its source consumer's
	// answer on a timer (srcConsumerWaitTime) that a shutdown does not stop.
	goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*stream).trySetupSourceConsumer.func3"),
}
