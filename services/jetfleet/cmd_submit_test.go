package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestSubmitWithPassword connects with -user and a password from
// $NATS_PASSWORD or -password. Not parallel: it sets the environment.
func TestSubmitWithPassword(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "auth.conf")
	require.NoError(t, os.WriteFile(conf, []byte("authorization { user: bob, password: hunter2 }\n"), 0o600))
	srv := natstest.ServerWith(t, embedded.Options{ConfigFile: conf})
	nc := natstest.Connect(t, srv, nats.UserInfo("bob", "hunter2"))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	for _, name := range []string{"NATS_USER", "NATS_PASSWORD", "NATS_TOKEN", "NATS_CREDS", "NATS_NKEY", "NATS_URL"} {
		t.Setenv(name, "")
	}
	submit := func(args ...string) error {
		full := append([]string{"submit", "-server", srv.ClientURL(), "-timeout", "5s"}, args...)
		return run(ctx, append(full, "nobody", "report", `{}`), io.Discard)
	}

	assert.ErrorContains(t, submit("-user", "bob"), "Authorization Violation", "no password")
	assert.ErrorContains(t, submit("-user", "bob", "-password", "wrong"), "Authorization Violation")
	require.NoError(t, submit("-user", "bob", "-password", "hunter2"))
	t.Setenv("NATS_PASSWORD", "hunter2")
	require.NoError(t, submit("-user", "bob"), "the password from $NATS_PASSWORD")
	t.Setenv("NATS_USER", "bob")
	require.NoError(t, submit(), "both from the environment")
}
