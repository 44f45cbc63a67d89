package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestClusterProvisionsR3 opens a run on the durability scenario's cluster
// setting: three real servers come up with sync_interval: always, and the
// topology is provisioned with a replica of every stream on each node.
func TestClusterProvisionsR3(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := &bencher{cfg: Config{}.WithDefaults(), id: "clustertest", report: &Report{}}
	rs, err := b.open(ctx, serverOptions{syncAlways: true, nodes: 3, embeddedOnly: true})
	require.NoError(t, err)
	defer rs.close(ctx)

	require.Len(t, rs.cluster.servers, 3)
	assert.Len(t, strings.Split(rs.url, ","), 3, "clients get every node's URL")
	for _, srv := range rs.cluster.servers {
		assert.True(t, srv.JetStreamIsClustered(), "%s runs clustered JetStream", srv.Name())
		assert.True(t, srv.JetStreamEnabled())
	}
	env, err := rs.connect("check")
	require.NoError(t, err)
	for _, name := range []string{protocol.StreamJobs, protocol.StreamEvents, "KV_" + protocol.BucketAgents} {
		s, err := env.JetStream.Stream(ctx, name)
		require.NoError(t, err, name)
		info := s.CachedInfo()
		assert.Equal(t, 3, info.Config.Replicas, name)
		require.NotNil(t, info.Cluster, name)
		assert.NotEmpty(t, info.Cluster.Leader, name)
		assert.Len(t, info.Cluster.Replicas, 2, "%s: a leader and two replicas", name)
	}
	// A queue's consumer is replicated with its stream, and a job is stored.
	q := rs.queue("r3")
	_, err = topology.EnsureQueue(ctx, env.JetStream, rs.topo, q)
	require.NoError(t, err)
	_, err = env.JetStream.Publish(ctx, protocol.JobSubject(q, kindNoop), []byte(`{}`))
	require.NoError(t, err)
	cons, err := env.JetStream.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer(q))
	require.NoError(t, err)
	// The consumer's leader may be another node than the stream's: its count
	// of pending messages follows the stored job a moment later (it read 0 in
	// a CI run). Its info is polled, as no event announces it.
	var info *jetstream.ConsumerInfo
	require.Eventually(t, func() bool {
		info, err = cons.Info(ctx)
		return err == nil && info.NumPending == 1
	}, 10*time.Second, 20*time.Millisecond, "the consumer counts the stored job as pending")
	require.NotNil(t, info.Cluster)
	assert.Len(t, info.Cluster.Replicas, 2, "the queue's consumer has a replica on each other node")

	rs.close(ctx)
	for _, srv := range rs.cluster.servers {
		assert.False(t, srv.Running(), "%s shut down", srv.Name())
	}
}
