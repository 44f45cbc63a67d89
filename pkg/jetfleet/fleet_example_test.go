package jetfleet_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/devfleet"
)

// startDevFleet runs what `go tool task dev` runs — an embedded NATS server
// with JetStream, the scheduler, the supervisor and the dev agent (kinds
// echo, sleep and fail on queue default) — on a free port in a temporary
// directory, and connects to it. stop ends both.
func startDevFleet() (nc *nats.Conn, stop func()) {
	dir, err := os.MkdirTemp("", "jetfleet-example-")
	if err != nil {
		panic(err)
	}
	cfg := devfleet.DefaultConfig()
	cfg.Embedded.Port, cfg.Embedded.DataDir, cfg.Telemetry.HTTPAddr = -1, dir, ""
	cfg.Dashboard.Listen = devfleet.DashboardOff
	cfg.ApplyDefaults()
	fleet, err := devfleet.New(cfg, devfleet.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fleet.Start(ctx); err != nil {
		panic(err)
	}
	if nc, err = nats.Connect(fleet.ClientURL()); err != nil {
		panic(err)
	}
	return nc, func() {
		nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = fleet.Stop(ctx)
		_ = os.RemoveAll(dir)
	}
}
