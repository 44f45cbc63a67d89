package protocol_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// A replica cut off from its stream's leader answers direct gets from what
// it has — "not found" for a message stored without it, which made agents
// run succeeded jobs again after a partition healed. LeaderGetLast asked
// through that node gets no answer instead (the caller reads again), and
// through any node once the node is back, the message.
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
	require.Eventually(t, func() bool { return localLastSeq(t, c.Servers[2], "HISTORY") == 1 },
		10*time.Second, 20*time.Millisecond, "node 2's replica never stored the first message") // no event tells

	c.Cut(2)
	_, err = js0.Publish(ctx, "history.job", []byte("succeeded"))
	require.NoError(t, err, "nodes 0 and 1 are a quorum")
	require.Equal(t, uint64(1), localLastSeq(t, c.Servers[2], "HISTORY"), "the cut replica stored the second message")

	// The defect's cause: a direct get is a request to a queue group of the
	// stream's replicas, and the cut replica answers the share that reaches
	// it (the rest goes to routes that pass nothing) with "not found".
	staleAnswer := false
	for try := 0; try < 40 && !staleAnswer; try++ {
		_, err := directGetLast(ctx, nc2, "history.job", 250*time.Millisecond)
		staleAnswer = errors.Is(err, jetstream.ErrMsgNotFound)
	}
	require.True(t, staleAnswer, "the premise: the cut replica answers a direct get without the message it missed")

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
// HISTORY, answered within wait.
func directGetLast(ctx context.Context, nc *nats.Conn, subject string, wait time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
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

// localLastSeq is the last sequence of srv's own replica of stream.
func localLastSeq(t *testing.T, srv *server.Server, stream string) uint64 {
	t.Helper()
	info, err := srv.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
	require.NoError(t, err)
	for _, acc := range info.AccountDetails {
		for _, st := range acc.Streams {
			if st.Name == stream {
				return st.State.LastSeq
			}
		}
	}
	return 0
}
