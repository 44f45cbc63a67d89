package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// fleetStreams are the streams of a jetfleet topology, key-value buckets
// included; the supervisor adds its own.
var fleetStreams = topology.StreamNames()

// errNeedsOwnServer is returned by open for a scenario that runs a
// scheduler or supervisor against a server that already holds a fleet.
var errNeedsOwnServer = errors.New("needs a server without a jetfleet fleet: it runs a scheduler or supervisor, which would act on the fleet's schedules and agents")

// errNeedsEmbedded is returned by open for the durability scenario on a
// given server: the sync interval is the server's setting.
var errNeedsEmbedded = errors.New("needs the embedded server: sync_interval is a setting of the server")

// serverOptions say what one run needs of its server.
type serverOptions struct {
	// syncAlways starts the embedded server with sync_interval: always.
	syncAlways bool
	// nodes > 1 runs an in-process cluster of that many embedded servers
	// on loopback instead of one, and provisions the topology with as many
	// replicas.
	nodes int
	// ownFleet: the run starts a scheduler or supervisor.
	ownFleet bool
	// embeddedOnly: the run needs the embedded server.
	embeddedOnly bool
	// topology to provision (on the embedded server, or on a given server
	// without a jetfleet topology).
	topology topology.Config
	// childServer runs the embedded server (or each node of the cluster) in
	// a child process, so that this process's heap is the fleet's alone.
	childServer bool
}

// runServer is the server one run of a scenario uses, and what the run
// made there: it cleans that up in close.
type runServer struct {
	b   *bencher
	url string
	srv *server.Server // embedded; nil on a given server
	// cluster is the embedded cluster (nodes > 1).
	cluster *cluster
	// child is the embedded server in a child process (childServer).
	child *childServer
	dir   string
	topo  topology.Config
	tel   *telemetry.Telemetry
	// created: the run provisioned the topology and deletes it in close.
	created bool
	// queues the run used; their consumers and messages go in close.
	queues []string
	envs   []*service.Env
}

// open returns the server for one run: a fresh embedded one, or the given
// one (its topology provisioned when it has none).
func (b *bencher) open(ctx context.Context, opts serverOptions) (_ *runServer, err error) {
	rs := &runServer{b: b, topo: opts.topology}
	defer func() {
		if err != nil {
			rs.close(context.WithoutCancel(ctx))
		}
	}()
	if rs.tel, err = telemetry.Setup(ctx, telemetry.Options{ServiceName: "jetfleet-bench"}); err != nil {
		return nil, err
	}
	if b.cfg.Server == "" {
		if rs.dir, err = os.MkdirTemp("", "jetfleet-bench-"); err != nil {
			return nil, err
		}
		switch {
		case opts.nodes > 1:
			if rs.cluster, err = startCluster(ctx, rs.dir, opts.nodes, opts.syncAlways, opts.childServer); err != nil {
				return nil, err
			}
			rs.url = rs.cluster.url()
			rs.topo.Replicas = opts.nodes
		case opts.childServer:
			if rs.child, err = startChildServer(ctx, embedded.Options{Port: -1, StoreDir: rs.dir, SyncAlways: opts.syncAlways}); err != nil {
				return nil, err
			}
			rs.url = rs.child.url
		default:
			if rs.srv, err = embedded.Start(embedded.Options{Port: -1, StoreDir: rs.dir, SyncAlways: opts.syncAlways}); err != nil {
				return nil, err
			}
			rs.url = rs.srv.ClientURL()
		}
		rs.created = true
		env, err := rs.connect("provision")
		if err != nil {
			return nil, err
		}
		if err := topology.Ensure(ctx, env.JetStream, rs.topo); err != nil {
			return nil, fmt.Errorf("provision: %w", err)
		}
		return rs, nil
	}

	if opts.embeddedOnly {
		return nil, errNeedsEmbedded
	}
	rs.url = b.cfg.Server
	env, err := rs.connect("provision")
	if err != nil {
		return nil, err
	}
	existing, err := fleetStreamsOn(ctx, env.JetStream)
	if err != nil {
		return nil, err
	}
	switch {
	case len(existing) == 0:
		if err := topology.Ensure(ctx, env.JetStream, rs.topo); err != nil {
			return nil, fmt.Errorf("provision: %w", err)
		}
		rs.created = true
	case opts.ownFleet:
		return nil, errNeedsOwnServer
	case len(existing) < len(fleetStreams):
		return nil, fmt.Errorf("the server holds part of a jetfleet topology (%v); start a fleet service to complete it, or use a server of its own", existing)
	default:
		// A fleet's topology: used as it is, never changed.
		if err := topology.Verify(ctx, env.JetStream, rs.topo); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// fleetStreamsOn lists the jetfleet streams the server holds.
func fleetStreamsOn(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var out []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if slices.Contains(fleetStreams, name) || name == protocol.StreamSupervisor {
			out = append(out, name)
		}
	}
	if err := names.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	return out, nil
}

// connect opens a connection of its own for one component of the run.
func (rs *runServer) connect(name string) (*service.Env, error) {
	cfg := rs.b.cfg.NATS
	cfg.URL = rs.url
	nc, err := natsconn.Connect(cfg, "jetfleet-bench-"+name, rs.b.cfg.Logger)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	env := &service.Env{Name: name, Base: &service.Base{Topology: rs.topo}, Logger: rs.b.cfg.Logger,
		Telemetry: rs.tel, Conn: nc, JetStream: js}
	rs.envs = append(rs.envs, env)
	return env, nil
}

// queue returns a queue name for this run, cleaned up in close.
func (rs *runServer) queue(name string) string {
	q := fmt.Sprintf("bench-%s-%s-%d", rs.b.id, name, len(rs.queues))
	rs.queues = append(rs.queues, q)
	return q
}

// close removes what the run made and releases the server: an embedded
// server and its store go; on a given server, the topology goes when the
// run created it, and otherwise the run's consumers and messages.
func (rs *runServer) close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if rs.srv == nil && rs.child == nil && rs.cluster == nil && rs.url != "" {
		if err := rs.cleanGiven(ctx); err != nil {
			rs.b.progress("cleanup on %s: %v", rs.url, err)
		}
	}
	for _, env := range rs.envs {
		env.Conn.Close()
	}
	rs.envs = nil
	if rs.tel != nil {
		_ = rs.tel.Shutdown(ctx)
	}
	if rs.srv != nil {
		rs.srv.Shutdown()
		rs.srv.WaitForShutdown()
	}
	if rs.child != nil {
		rs.child.stop()
	}
	if rs.cluster != nil {
		rs.cluster.stop()
	}
	if rs.dir != "" {
		_ = os.RemoveAll(rs.dir)
	}
}

// cleanGiven cleans up a given server.
func (rs *runServer) cleanGiven(ctx context.Context) error {
	cfg := rs.b.cfg.NATS
	cfg.URL = rs.url
	nc, err := natsconn.Connect(cfg, "jetfleet-bench-cleanup", rs.b.cfg.Logger)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var errs []error
	if rs.created {
		names, err := fleetStreamsOn(ctx, js)
		if err != nil {
			return err
		}
		for _, name := range names {
			if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				errs = append(errs, fmt.Errorf("delete stream %s: %w", name, err))
			}
		}
		return errors.Join(errs...)
	}
	for _, q := range rs.queues {
		for _, p := range protocol.Priorities {
			if err := js.DeleteConsumer(ctx, protocol.StreamJobs, protocol.PriorityConsumer(q, p)); err != nil &&
				!errors.Is(err, jetstream.ErrConsumerNotFound) {
				errs = append(errs, err)
			}
		}
		for _, p := range []struct{ stream, subject string }{
			{protocol.StreamJobs, protocol.QueueAllSubjects(q)},
			{protocol.StreamEvents, "events.job." + q + ".>"},
			{protocol.StreamDLQ, "dlq." + q + ".>"},
			{protocol.StreamDelayed, "delayed." + q + ".>"},
			{protocol.StreamDelayed, "due." + q + ".>"},
		} {
			s, err := js.Stream(ctx, p.stream)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if err := s.Purge(ctx, jetstream.WithPurgeSubject(p.subject)); err != nil {
				errs = append(errs, fmt.Errorf("purge %s from %s: %w", p.subject, p.stream, err))
			}
		}
	}
	return errors.Join(errs...)
}
