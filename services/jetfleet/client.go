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
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/natsconn"
)

// clientFlags are the connection flags of every command that talks to a fleet.
type clientFlags struct {
	cfg     natsconn.Config
	timeout time.Duration
}

func addClientFlags(fs *flag.FlagSet) *clientFlags {
	c := &clientFlags{}
	def := os.Getenv("NATS_URL")
	if def == "" {
		def = natsconn.DefaultURL
	}
	fs.StringVar(&c.cfg.URL, "server", def, "NATS server `url`s, comma-separated (or $NATS_URL)")
	fs.StringVar(&c.cfg.CredsFile, "creds", os.Getenv("NATS_CREDS"), "user credentials `file` (or $NATS_CREDS)")
	fs.StringVar(&c.cfg.User, "user", os.Getenv("NATS_USER"), "user `name` (or $NATS_USER)")
	c.cfg.Password = os.Getenv("NATS_PASSWORD")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "bound on each request to the fleet")
	return c
}

// client is a connection for one command.
type client struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	timeout time.Duration
}

func (c *clientFlags) connect() (*client, error) {
	cfg := c.cfg
	cfg.ConnectTimeout = c.timeout
	nc, err := natsconn.Connect(cfg, "jetfleet-cli", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &client{nc: nc, js: js, timeout: c.timeout}, nil
}

func (c *client) close() { c.nc.Close() }

// ctx bounds one request.
func (c *client) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, c.timeout)
}

func newFlagSet(name, argsUsage, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet("jetfleet "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: jetfleet %s [flags] %s\n\n%s\n\nflags:\n", name, argsUsage, summary)
		fs.PrintDefaults()
	}
	return fs
}
