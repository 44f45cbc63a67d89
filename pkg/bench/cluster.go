package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natstest/freeport"
)

// cluster is a JetStream cluster on loopback: the bench's replicated
// setting. Each node has its own store under a directory of the run, its
// client port and route port picked at random, and runs in the bench's
// process (servers) or in a child process of its own (children).
type cluster struct {
	servers  []*server.Server
	children []*childServer
}

// startCluster starts n nodes with their stores under dir, every node
// routing to every other, and returns once the cluster has a JetStream meta
// leader and can place a stream with a replica on every node. syncAlways
// starts each node with sync_interval: always; inChildren runs each in a
// child process.
func startCluster(ctx context.Context, dir string, n int, syncAlways, inChildren bool) (_ *cluster, err error) {
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range n {
		if ports[i], err = freeport.Pick(); err != nil {
			return nil, err
		}
		routes[i] = fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i])
	}
	name := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	type result struct {
		i     int
		srv   *server.Server
		child *childServer
		err   error
	}
	// Started together: a node's JetStream waits for its routes.
	results := make(chan result, n)
	for i := range n {
		go func() {
			opts := embedded.Options{
				Port: -1, StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i)), ServerName: fmt.Sprintf("%s-n%d", name, i),
				SyncAlways: syncAlways, Cluster: embedded.ClusterOptions{Name: name, Port: ports[i], Routes: routes},
				ReadyTimeout: 30 * time.Second,
			}
			r := result{i: i}
			if inChildren {
				r.child, r.err = startChildServer(ctx, opts)
			} else {
				r.srv, r.err = embedded.Start(opts)
			}
			results <- r
		}()
	}
	c := &cluster{servers: make([]*server.Server, n)}
	if inChildren {
		c.servers, c.children = nil, make([]*childServer, n)
	}
	var errs []error
	for range n {
		r := <-results
		if r.err != nil {
			errs = append(errs, fmt.Errorf("cluster node %d: %w", r.i, r.err))
		}
		if inChildren {
			c.children[r.i] = r.child
		} else {
			c.servers[r.i] = r.srv
		}
	}
	if err := errors.Join(errs...); err != nil {
		c.stop()
		return nil, err
	}
	if err := c.waitReady(ctx, 30*time.Second); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// url lists every node's client URL, comma-separated, as nats.Connect takes them.
func (c *cluster) url() string {
	var urls []string
	for _, srv := range c.servers {
		urls = append(urls, srv.ClientURL())
	}
	for _, child := range c.children {
		urls = append(urls, child.url)
	}
	return strings.Join(urls, ",")
}

// nodes is the cluster's size.
func (c *cluster) nodes() int { return len(c.servers) + len(c.children) }

// waitReady waits until JetStream answers account requests (a meta leader
// is elected) and a stream with a replica on every node can be placed
// (every node has sent the stats placement reads; before that, creating
// one fails with "no suitable peers for placement", error 10005). The
// server offers no event for either, so this probes, as natstest does.
func (c *cluster) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := nats.Connect(c.url(), nats.Name("jetfleet-bench-cluster-probe"))
	if err != nil {
		return fmt.Errorf("cluster: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	const probe = "BENCH_PLACEMENT_PROBE"
	for {
		// Each try gets a second: a request nobody answers yet (no meta
		// leader) would otherwise wait out the whole timeout.
		tryCtx, cancelTry := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(tryCtx)
		if err == nil {
			_, err = js.CreateStream(tryCtx, jetstream.StreamConfig{Name: probe, Subjects: []string{"bench.placement.probe"},
				Replicas: c.nodes(), Storage: jetstream.MemoryStorage})
		}
		cancelTry()
		if err == nil {
			return js.DeleteStream(ctx, probe)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: no meta leader or no placement of an R%d stream after %s: %w", c.nodes(), timeout, err)
		case <-time.After(50 * time.Millisecond): // polling the servers' state: there is no event to wait on
		}
	}
}

// stop shuts every node down and waits for it.
func (c *cluster) stop() {
	for _, srv := range c.servers {
		if srv != nil {
			srv.Shutdown()
		}
	}
	for _, srv := range c.servers {
		if srv != nil {
			srv.WaitForShutdown()
		}
	}
	var wg sync.WaitGroup
	for _, child := range c.children {
		if child != nil {
			wg.Go(child.stop)
		}
	}
	wg.Wait()
}
