package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// startSupervisor runs a supervisor on srv for the CLI's API calls, stopped
// at the end of the test.
func startSupervisor(ctx context.Context, t *testing.T, srv *server.Server) {
	t.Helper()
	sup, err := supervisor.New(supervisor.Config{CheckInterval: 50 * time.Millisecond}, fleettest.NewEnv(t, srv, topology.Config{}).Env, clock.Real())
	require.NoError(t, err)
	require.NoError(t, sup.Start(ctx))
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
}

// cliOn runs the CLI against srv: the command's first two words, then
// -server, then the rest.
func cliOn(ctx context.Context, srv *server.Server) func(args ...string) (string, error) {
	return func(args ...string) (string, error) {
		var out bytes.Buffer
		full := append(append(append([]string(nil), args[:2]...), "-server", srv.ClientURL()), args[2:]...)
		err := run(ctx, full, &out)
		return out.String(), err
	}
}
