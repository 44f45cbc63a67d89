package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
)

// clientFlags are the connection flags of every command that talks to a fleet.
type clientFlags struct {
	url         string
	credentials *credentialFlags
	timeout     time.Duration
}

func addClientFlags(fs *flag.FlagSet) *clientFlags {
	c := &clientFlags{}
	fs.StringVar(&c.url, "server", "", "NATS server `urls`, comma-separated ($NATS_URL; default "+natsconn.DefaultURL+")")
	c.credentials = addCredentialFlags(fs)
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "bound on connecting and on each request to the fleet")
	return c
}

// credentialFlags are -user, -password, -token, -creds and -nkey. Each
// defaults to its environment variable, read when the command runs: the
// help never shows a secret as a flag's default.
type credentialFlags struct {
	user, password, token, creds, nkey string
}

func addCredentialFlags(fs *flag.FlagSet) *credentialFlags {
	c := &credentialFlags{}
	fs.StringVar(&c.user, "user", "", "user `name` ($NATS_USER), with -password")
	fs.StringVar(&c.password, "password", "", "`password` of -user ($NATS_PASSWORD; prefer the variable: flags show in ps)")
	fs.StringVar(&c.token, "token", "", "authentication `token` ($NATS_TOKEN; prefer the variable)")
	fs.StringVar(&c.creds, "creds", "", "user credentials `file`, JWT and NKey seed ($NATS_CREDS)")
	fs.StringVar(&c.nkey, "nkey", "", "`file` holding an NKey seed ($NATS_NKEY)")
	return c
}

// apply sets the credentials on cfg, each from its flag or else from its
// environment variable.
func (c *credentialFlags) apply(cfg *natsconn.Config) error {
	or := func(flag, env string) string {
		if flag != "" {
			return flag
		}
		return os.Getenv(env)
	}
	v := credentialFlags{user: or(c.user, "NATS_USER"), password: or(c.password, "NATS_PASSWORD"), token: or(c.token, "NATS_TOKEN"),
		creds: or(c.creds, "NATS_CREDS"), nkey: or(c.nkey, "NATS_NKEY")}
	methods := 0
	for _, set := range []string{v.user, v.token, v.creds, v.nkey} {
		if set != "" {
			methods++
		}
	}
	if methods > 1 {
		return fmt.Errorf("set only one of -user, -token, -creds and -nkey (or of $NATS_USER, $NATS_TOKEN, $NATS_CREDS and $NATS_NKEY)")
	}
	if v.password != "" && v.user == "" {
		return fmt.Errorf("-password ($NATS_PASSWORD) needs -user ($NATS_USER)")
	}
	cfg.User, cfg.Password, cfg.Token, cfg.CredsFile, cfg.NKeySeedFile = v.user, v.password, v.token, v.creds, v.nkey
	return nil
}

// client is a connection for one command.
type client struct {
	nc      *nats.Conn
	timeout time.Duration
}

func (c *clientFlags) connect() (*client, error) {
	cfg := natsconn.Config{URL: c.url, ConnectTimeout: c.timeout}
	if cfg.URL == "" {
		cfg.URL = os.Getenv("NATS_URL")
	}
	if err := c.credentials.apply(&cfg); err != nil {
		return nil, err
	}
	nc, err := natsconn.Connect(cfg, "jetfleet-cli", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	return &client{nc: nc, timeout: c.timeout}, nil
}

func (c *client) close() { c.nc.Close() }

// ctx bounds one request.
func (c *client) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, c.timeout)
}

// connectAPI connects and returns a client of the fleet's APIs.
func (inv *invocation) connectAPI(opts ...jetfleet.ClientOption) (*client, *jetfleet.Client, error) {
	c, err := inv.conn.connect()
	if err != nil {
		return nil, nil, err
	}
	return c, jetfleet.NewClient(c.nc, opts...), nil
}

// withAPI connects, runs fn with a context bounded by -timeout, and closes.
func (inv *invocation) withAPI(ctx context.Context, fn func(ctx context.Context, api *jetfleet.Client) error) error {
	c, api, err := inv.connectAPI()
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	return fn(rctx, api)
}
