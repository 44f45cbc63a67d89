package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// LeaderGetLast is answered by the stream's leader alone: through a node
// cut off from it, no answer (the caller reads again), never the "not
// found" a replica that missed the message would give; through any node
// once the node is back, the message.
func TestLeaderGetLastIsAnsweredByTheLeaderAlone(t *testing.T) {
	c := natstest.StartPartitionableCluster(t, 3)
	// The nodes' own URLs, not ClientURLs: Cut leaves these connections up,
	// so a client on the cut node keeps asking it.
	nc0 := natstest.ConnectURL(t, c.Servers[0].ClientURL())
	nc2 := natstest.ConnectURL(t, c.Servers[2].ClientURL())
	js0, err := jetstream.New(nc0)
	require.NoError(t, err)
	ctx := t.Context()
	_, err = js0.CreateStream(ctx, jetstream.StreamConfig{
		Name: "HISTORY", Subjects: []string{"history.>"}, Replicas: 3, AllowDirect: true,
	})
	require.NoError(t, err)
	c.MoveStreamLeaderTo(t, js0, "HISTORY", 0)
	_, err = js0.Publish(ctx, "history.before", []byte("before"))
	require.NoError(t, err)
	// Node 2 has the stream's first message: a direct get asked through it
	// answers (from whichever replica; no event tells when it has it).
	require.Eventually(t, func() bool {
		m, err := directGetLast(ctx, nc2, "history.before")
		return err == nil && string(m) == "before"
	}, 10*time.Second, 20*time.Millisecond, "no direct get through node 2 answered with the stream's first message")

	c.Cut(2)
	_, err = js0.Publish(ctx, "history.job", []byte("succeeded"))
	require.NoError(t, err, "nodes 0 and 1 are a quorum")

	askCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = protocol.LeaderGetLast(askCtx, nc2, "HISTORY", "history.job")
	cancel()
	require.Error(t, err)
	assert.False(t, errors.Is(err, jetstream.ErrMsgNotFound), "a node without the leader answered the leader's read: %v", err)

	m, err := protocol.LeaderGetLast(ctx, nc0, "HISTORY", "history.job")
	require.NoError(t, err)
	assert.Equal(t, "succeeded", string(m.Data))
	assert.Equal(t, "history.job", m.Subject)
	_, err = protocol.LeaderGetLast(ctx, nc0, "HISTORY", "history.none")
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)

	c.Heal(2)
	require.Eventually(t, func() bool {
		askCtx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		m, err := protocol.LeaderGetLast(askCtx, nc2, "HISTORY", "history.job")
		return err == nil && string(m.Data) == "succeeded"
	}, 20*time.Second, 100*time.Millisecond, "the healed node never passed the read to the leader")
}

// directGetLast is a direct get of the last message on subject in stream
// HISTORY.
func directGetLast(ctx context.Context, nc *nats.Conn, subject string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.HISTORY."+subject, nil)
	if err != nil {
		return nil, err
	}
	if status := m.Header.Get("Status"); status == "404" {
		return nil, jetstream.ErrMsgNotFound
	} else if status != "" {
		return nil, fmt.Errorf("direct get: status %s", status)
	}
	return m.Data, nil
}
