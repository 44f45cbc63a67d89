package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

const (
	queue      = "default"
	kindEffect = "effect"
)

// loader publishes jobs of kind effect at a steady rate. A job counts as
// published once JetStream acknowledged it; a publish that fails is sent
// again with the same Nats-Msg-Id (deduplicated by the stream) until it is
// acknowledged or giveUp passes.
type loader struct {
	js     jetstream.JetStream
	prefix string
	rate   int

	mu     sync.Mutex
	acked  map[string]time.Time
	failed int // gave up: never acknowledged (may still run)
}

const giveUp = 90 * time.Second

func newLoader(js jetstream.JetStream, prefix string, rate int) *loader {
	return &loader{js: js, prefix: prefix, rate: rate, acked: map[string]time.Time{}}
}

// run publishes until ctx ends; it returns once every publish in flight is
// acknowledged or given up.
func (l *loader) run(ctx context.Context) {
	const tick = 20 * time.Millisecond
	perTick := max(1, l.rate*int(tick)/int(time.Second))
	t := time.NewTicker(tick)
	defer t.Stop()
	var wg sync.WaitGroup
	// A bounded pool of publishers: a cluster that stops answering slows
	// the load down instead of piling up goroutines.
	sem := make(chan struct{}, 256)
	for n := 0; ; {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
		}
		for range perTick {
			id := fmt.Sprintf("%s-%07d", l.prefix, n)
			n++
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				wg.Wait()
				return
			}
			wg.Go(func() {
				defer func() { <-sem }()
				l.publish(id)
			})
		}
	}
}

// publish sends job id until it is acknowledged or giveUp passes.
func (l *loader) publish(id string) {
	msg := nats.NewMsg(protocol.JobSubject(queue, kindEffect))
	msg.Header.Set(protocol.HeaderMsgID, id)
	msg.Header.Set(protocol.HeaderJobID, id)
	msg.Data = []byte(`{}`)
	deadline := time.Now().Add(giveUp)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := l.js.PublishMsg(ctx, msg)
		cancel()
		if err == nil {
			l.mu.Lock()
			l.acked[id] = time.Now()
			l.mu.Unlock()
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
	l.mu.Lock()
	l.failed++
	l.mu.Unlock()
}

// published is what JetStream acknowledged, by job id.
func (l *loader) published() map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]time.Time, len(l.acked))
	for k, v := range l.acked {
		m[k] = v
	}
	return m
}

func (l *loader) notAcknowledged() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

// addSchedules creates n schedules firing kind effect every second, each
// nominal time caught up after downtime (fire_all): every second of the
// run must run once.
func addSchedules(ctx context.Context, nc *nats.Conn, prefix string, n int) ([]string, error) {
	client := jetfleet.NewClient(nc)
	ids := make([]string, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			opCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, errs[i] = client.AddSchedule(opCtx, &jetfleet.Schedule{
				ID:     ids[i],
				Spec:   jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(time.Second)}},
				Target: jetfleet.Target{Queue: queue, Kind: kindEffect},
				Policy: jetfleet.Policy{Misfire: "fire_all", MaxCatchUp: 1000},
			})
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}
