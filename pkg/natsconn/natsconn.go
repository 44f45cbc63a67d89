// Package natsconn opens the NATS connection of a jetfleet component from
// its configuration: servers, credentials, and reconnection that never gives
// up, logged through the component's logger.
//
// While it reconnects, a connection buffers nothing: a publish or a request
// fails at once instead of waiting in the client's reconnect buffer. A
// buffered message goes out after the reconnect, however long after its
// caller gave up on it: a lease renewal that outlived its deadline, the
// deletion of a consumer that has been created again since, a scheduled job
// its scheduler already counted as not published. Every caller in jetfleet
// retries what failed, with the state it has then.
package natsconn

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/config"
)

// Config is the nats section of every service's configuration.
type Config struct {
	// URL lists the servers, comma-separated. Defaults to nats://127.0.0.1:4222.
	URL string `koanf:"url"`
	// User and Password authenticate with a username and password.
	User     string `koanf:"user"`
	Password string `koanf:"password" secret:"true"`
	// Token authenticates with a token.
	Token string `koanf:"token" secret:"true"`
	// CredsFile is a JWT user credentials file.
	CredsFile string `koanf:"creds_file"`
	// NKeySeedFile is a file holding an NKey seed.
	NKeySeedFile string `koanf:"nkey_seed_file"`
	// ConnectTimeout bounds the first connection. Defaults to 10s; the
	// connection then retries in the background for ever, each dial
	// bounded by ReconnectDialTimeout.
	ConnectTimeout time.Duration `koanf:"connect_timeout"`
	// PingInterval is how often the client pings its server; after
	// MaxPingsOut unanswered pings in a row the connection counts as dead
	// and the client moves to another server. That is how a silent loss —
	// a partition, a frozen server, a peer gone without a reset — is
	// noticed: within 2 to 3 intervals (2-3 s by default, against NATS's
	// default of 2 minutes × 2). It must stay well inside a leader's lease
	// (topology.lease_ttl, 5 s): a scheduler whose replicas were all
	// connected to a node cut off resumes its fires only once one of them
	// has left it. Defaults to 1s.
	PingInterval time.Duration `koanf:"ping_interval"`
}

// Defaults of Config.
const (
	DefaultURL            = "nats://127.0.0.1:4222"
	DefaultConnectTimeout = 10 * time.Second
	DefaultPingInterval   = time.Second
	// MaxPingsOut is how many pings may go unanswered before the
	// connection counts as dead.
	MaxPingsOut = 2
	// ReconnectDialTimeout bounds each dial of a reconnection (or
	// connect_timeout, if shorter). A server in the list that is cut off
	// does not refuse a connection, it leaves the dial unanswered: with
	// connect_timeout's 10 s per dial, a service that tried it first stayed
	// away from every server for 10 s (the cluster fault run). Servers of
	// one fleet answer a dial within milliseconds.
	ReconnectDialTimeout = 2 * time.Second
)

// dialer dials the first connection within connect_timeout and each
// reconnection's within ReconnectDialTimeout at most.
type dialer struct {
	first     time.Duration
	connected atomic.Bool // set once the first connection is up
}

func (d *dialer) Dial(network, address string) (net.Conn, error) {
	timeout := d.first
	if d.connected.Load() {
		timeout = min(timeout, ReconnectDialTimeout)
	}
	return (&net.Dialer{Timeout: timeout}).Dial(network, address)
}

// WithDefaults returns c with zero values replaced by defaults.
func (c Config) WithDefaults() Config {
	if c.URL == "" {
		c.URL = DefaultURL
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.PingInterval == 0 {
		c.PingInterval = DefaultPingInterval
	}
	return c
}

// Validate checks c; keys are reported below section (for example "nats").
func (c Config) Validate(section string) error {
	var errs []error
	methods := 0
	for _, set := range []bool{c.User != "", c.Token != "", c.CredsFile != "", c.NKeySeedFile != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		errs = append(errs, config.Invalid(section+".user", "set only one of user, token, creds_file and nkey_seed_file"))
	}
	if c.Password != "" && c.User == "" {
		errs = append(errs, config.Invalid(section+".password", "needs %s.user", section))
	}
	if c.ConnectTimeout < 0 {
		errs = append(errs, config.Invalid(section+".connect_timeout", "must not be negative"))
	}
	if c.PingInterval < 0 || (c.PingInterval > 0 && c.PingInterval < 100*time.Millisecond) {
		errs = append(errs, config.Invalid(section+".ping_interval", "must be at least 100ms (0: the default, %s), got %s", DefaultPingInterval, c.PingInterval))
	}
	return errors.Join(errs...)
}

// Connect opens a connection named name (shown in the server's monitoring).
func Connect(c Config, name string, logger *slog.Logger) (*nats.Conn, error) {
	c = c.WithDefaults()
	servers, timeout := c.URL, c.ConnectTimeout
	dial := &dialer{first: timeout}
	opts := []nats.Option{
		nats.Name(name),
		nats.Timeout(timeout),
		nats.SetCustomDialer(dial),
		nats.PingInterval(c.PingInterval),
		nats.MaxPingsOutstanding(MaxPingsOut),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.ReconnectBufSize(-1), // see the package doc
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("nats reconnected", "server", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			logger.Error("nats async error", "error", err, "subject", subject)
		}),
	}
	switch {
	case c.User != "":
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	case c.Token != "":
		opts = append(opts, nats.Token(c.Token))
	case c.CredsFile != "":
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	case c.NKeySeedFile != "":
		opt, err := nats.NkeyOptionFromSeed(c.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats: nkey seed file: %w", err)
		}
		opts = append(opts, opt)
	}
	nc, err := nats.Connect(servers, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", redact(servers), err)
	}
	dial.connected.Store(true)
	return nc, nil
}

// redact hides credentials embedded in a comma-separated URL list.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			u.User = url.User("redacted")
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
