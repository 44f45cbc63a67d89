package agent

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
)

// connGate lets job events wait for the connection to the server to come
// back instead of spending their tries while it is down: an outage longer
// than the tries would otherwise leave finished jobs unanswered, to run
// again on their redelivery.
type connGate struct {
	nc *nats.Conn
	// onDisconnect is called when the connection drops: answers awaited on
	// it will never come.
	onDisconnect []func()

	mu   sync.Mutex
	back chan struct{} // closed, and replaced, whenever the connection comes back or closes
}

func newConnGate(nc *nats.Conn) *connGate {
	return &connGate{nc: nc, back: make(chan struct{})}
}

// run follows the connection's status until ctx ends.
func (g *connGate) run(ctx context.Context) {
	changes := g.nc.StatusChanged(nats.CONNECTED, nats.DISCONNECTED, nats.RECONNECTING, nats.CLOSED)
	defer g.nc.RemoveStatusListener(changes)
	for {
		select {
		case <-ctx.Done():
			g.open()
			return
		case status := <-changes:
			if status == nats.DISCONNECTED || status == nats.RECONNECTING {
				for _, f := range g.onDisconnect {
					f()
				}
				continue
			}
			g.open()
		}
	}
}

func (g *connGate) open() {
	g.mu.Lock()
	close(g.back)
	g.back = make(chan struct{})
	g.mu.Unlock()
}

// connected reports whether the connection is up.
func (g *connGate) connected() bool { return g.nc.IsConnected() }

// waitConnected returns true once the connection is up, false when it is
// closed for good or stop is closed first.
func (g *connGate) waitConnected(stop <-chan struct{}) bool {
	for {
		g.mu.Lock()
		back := g.back
		g.mu.Unlock()
		if g.nc.IsConnected() {
			return true
		}
		if g.nc.IsClosed() {
			return false
		}
		select {
		case <-back:
		case <-stop:
			return false
		}
	}
}
