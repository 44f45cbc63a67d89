package bench_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/natstest"
)

// BenchmarkSyncedBatches answers issue 22's question "does a batch cost one
// sync?" on one server with every write synced (sync_interval: always): the
// same 300-byte messages (an event's size) stored one at a time, as fast
// batches (how agents publish events: allow_batched) and as atomic batches
// (allow_atomic), each batch committed and confirmed before the next.
// Each reports msgs/s; a batch that cost one sync would store far more per
// second than messages one at a time.
//
//	go test -run X -bench SyncedBatches ./bench   (in pkg)
func BenchmarkSyncedBatches(b *testing.B) {
	srv := natstest.ServerWith(b, embedded.Options{SyncAlways: true})
	nc, js := natstest.JetStream(b, srv)
	ctx := context.Background()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SYNCED", Subjects: []string{"synced.>"},
		AllowAtomicPublish: true, AllowBatchPublish: true})
	require.NoError(b, err)
	data := make([]byte, 300)
	run := 0
	subject := func(i int) string { return "synced." + strconv.Itoa(run) + "." + strconv.Itoa(i) }

	b.Run("one at a time", func(b *testing.B) {
		run++
		for i := 0; b.Loop(); i++ {
			_, err := js.Publish(ctx, subject(i), data)
			require.NoError(b, err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	for _, size := range []int{10, 50, 200} {
		b.Run(fmt.Sprintf("fast batches of %d", size), func(b *testing.B) {
			run++
			inbox := nc.NewInbox()
			answers := make(chan *nats.Msg, 1024)
			sub, err := nc.ChanSubscribe(inbox+".>", answers)
			require.NoError(b, err)
			defer func() { _ = sub.Unsubscribe() }()
			published, batch := 0, 0
			for b.Loop() {
				batch++
				reply := inbox + ".b" + strconv.Itoa(batch) + ".500.fail."
				for j := 1; j <= size; j++ {
					op := "1"
					if j == 1 {
						op = "0"
					}
					require.NoError(b, nc.PublishMsg(&nats.Msg{Subject: subject(published), Data: data,
						Reply: reply + strconv.Itoa(j) + "." + op + ".$FI"}))
					published++
				}
				require.NoError(b, nc.PublishMsg(&nats.Msg{Subject: subject(-1), Reply: reply + strconv.Itoa(size+1) + ".3.$FI"}))
				awaitBatchEnd(b, answers, size)
			}
			b.ReportMetric(float64(published)/b.Elapsed().Seconds(), "msgs/s")
		})
		b.Run(fmt.Sprintf("atomic batches of %d", size), func(b *testing.B) {
			run++
			published, batch := 0, 0
			for b.Loop() {
				batch++
				id := "a" + strconv.Itoa(run) + "-" + strconv.Itoa(batch)
				for j := 1; j <= size; j++ {
					m := &nats.Msg{Subject: subject(published), Data: data, Header: nats.Header{}}
					m.Header.Set("Nats-Batch-Id", id)
					m.Header.Set("Nats-Batch-Sequence", strconv.Itoa(j))
					published++
					if j < size {
						require.NoError(b, nc.PublishMsg(m))
						continue
					}
					m.Header.Set("Nats-Batch-Commit", "1")
					ack, err := nc.RequestMsg(m, 10*time.Second)
					require.NoError(b, err)
					require.Contains(b, string(ack.Data), fmt.Sprintf(`"count":%d`, size))
				}
			}
			b.ReportMetric(float64(published)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// awaitBatchEnd waits for a fast batch's publish ack, past its flow acks.
func awaitBatchEnd(b *testing.B, answers <-chan *nats.Msg, size int) {
	b.Helper()
	for {
		select {
		case a := <-answers:
			if strings.Contains(string(a.Data), `"batch"`) {
				require.Contains(b, string(a.Data), fmt.Sprintf(`"count":%d`, size))
				return
			}
			require.NotContains(b, string(a.Data), "error")
		case <-time.After(10 * time.Second):
			b.Fatal("no answer to a fast batch")
		}
	}
}
