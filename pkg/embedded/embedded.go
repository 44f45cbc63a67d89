// Package embedded runs a NATS server with JetStream inside the current
// process: the single-process dev fleet, the benchmarks and the tests use it.
package embedded

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure an embedded server.
// AtomicBatchesPerStream is how many atomic batches a stream may have open
// at once (the server's jetstream.limits.batch.max_inflight_per_stream):
// every agent keeps its events in one or two, and the server's default of 50
// would send the events of a fleet of more than 50 agents one by one for
// seconds at a time. config/nats/*.conf set the same.
const AtomicBatchesPerStream = 1000

type Options struct {
	// Host to listen on. Defaults to 127.0.0.1.
	Host string
	// Port for clients. Defaults to 4222; -1 picks a free port.
	Port int
	// StoreDir is the JetStream file store directory. Required.
	StoreDir string
	// ServerName is the server's name; required in a cluster. Defaults to the server's id.
	ServerName string
	// SyncAlways makes every write reach the disk before it is acknowledged
	// ("sync_interval: always"). Otherwise SyncInterval applies.
	SyncAlways bool
	// SyncInterval between file store flushes. Zero keeps the server default (2 minutes).
	SyncInterval time.Duration
	// MaxPayload bounds one message. Zero keeps the server default (1 MiB).
	MaxPayload int32
	// ConfigFile is a nats-server configuration file (accounts, users,
	// permissions). Options above override what it sets.
	ConfigFile string
	// Cluster joins the server to a JetStream cluster when Name is set.
	Cluster ClusterOptions
	// ReadyTimeout bounds the wait for the server to accept connections. Defaults to 10s.
	ReadyTimeout time.Duration
}

// ClusterOptions configure clustering.
type ClusterOptions struct {
	Name string
	Host string
	// Port for routes; -1 picks a free port.
	Port int
	// Routes are nats-route:// URLs of the other servers.
	Routes []string
	// Advertise is the host:port this server tells the others to route to
	// when they learn of it through a third server (an implicit route);
	// empty means its own. Tests that route through proxies point it at a
	// closed port, so that no route bypasses them.
	Advertise string
	// NoAdvertise keeps the other nodes' client URLs from this server's
	// clients, so that a client reaches only the servers it was given (tests
	// that reach the nodes through proxies).
	NoAdvertise bool
}

// Start runs a server and waits until it accepts connections and JetStream
// is ready. The caller owns it: Shutdown, then WaitForShutdown.
func Start(opts Options) (*server.Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("embedded: StoreDir is required")
	}
	sopts := &server.Options{}
	if opts.ConfigFile != "" {
		var err error
		if sopts, err = server.ProcessConfigFile(opts.ConfigFile); err != nil {
			return nil, fmt.Errorf("embedded: read %s: %w", opts.ConfigFile, err)
		}
	}
	sopts.Host = opts.Host
	if sopts.Host == "" {
		sopts.Host = "127.0.0.1"
	}
	sopts.Port = opts.Port
	if sopts.Port == 0 {
		sopts.Port = 4222
	}
	sopts.ServerName = opts.ServerName
	sopts.JetStream = true
	sopts.StoreDir = opts.StoreDir
	sopts.SyncAlways = opts.SyncAlways
	sopts.SyncInterval = opts.SyncInterval
	if opts.MaxPayload > 0 {
		sopts.MaxPayload = opts.MaxPayload
	}
	if sopts.JetStreamLimits.MaxBatchInflightPerStream == 0 {
		sopts.JetStreamLimits.MaxBatchInflightPerStream = AtomicBatchesPerStream
	}
	sopts.NoSigs = true
	sopts.NoLog = true
	sopts.DisableJetStreamBanner = true
	if opts.Cluster.Name != "" {
		sopts.Cluster.Name = opts.Cluster.Name
		sopts.Cluster.Host = opts.Cluster.Host
		if sopts.Cluster.Host == "" {
			sopts.Cluster.Host = sopts.Host
		}
		sopts.Cluster.Port = opts.Cluster.Port
		sopts.Cluster.Advertise = opts.Cluster.Advertise
		sopts.Cluster.NoAdvertise = opts.Cluster.NoAdvertise
		for _, r := range opts.Cluster.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("embedded: route %q: %w", r, err)
			}
			sopts.Routes = append(sopts.Routes, u)
		}
	}

	srv, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	srv.Start()
	ready := opts.ReadyTimeout
	if ready == 0 {
		ready = 10 * time.Second
	}
	if !srv.ReadyForConnections(ready) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded: server on %s:%d not ready after %s", sopts.Host, sopts.Port, ready)
	}
	return srv, nil
}
