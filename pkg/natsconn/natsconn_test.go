package natsconn

import (
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/natstest"
)

func TestConnect(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, err := Connect(Config{URL: srv.ClientURL()}, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	defer nc.Close()
	assert.True(t, nc.IsConnected())
}

func TestConnectErrorHidesPassword(t *testing.T) {
	t.Parallel()
	_, err := Connect(Config{URL: "nats://bob:s3cret@127.0.0.1:1", ConnectTimeout: 200_000_000}, "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "s3cret")
	assert.Contains(t, err.Error(), "127.0.0.1:1")
}

func TestValidate(t *testing.T) {
	t.Parallel()
	assert.ErrorContains(t, Config{User: "a", Token: "b"}.Validate("nats"), "nats.user")
	assert.ErrorContains(t, Config{Password: "p"}.Validate("nats"), "nats.password")
	assert.NoError(t, Config{User: "a", Password: "p"}.Validate("nats"))
}
