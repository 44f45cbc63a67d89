package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// jobSpec is one job message to publish.
type jobSpec struct {
	subject string
	// id is the Nats-Msg-Id, and the Jetfleet-Job-Id unless header sets one.
	id      string
	header  nats.Header
	payload []byte
}

// publishedJob is a publish JetStream acknowledged, and its sequence in
// JOBS (the first message's, when a retry was acknowledged as a duplicate).
type publishedJob struct {
	jobSpec
	seq uint64
}

// publisher publishes jobs through JetStream and keeps what was
// acknowledged: only those count as published.
type publisher struct {
	js jetstream.JetStream
	// giveUp bounds the retries of one publish whose outcome stays unknown.
	giveUp time.Duration

	mu      sync.Mutex
	acked   []publishedJob
	refused map[string]error // by id: the server answered with an error
	unknown map[string]error // by id: never acknowledged, never refused
}

func newPublisher(js jetstream.JetStream) *publisher {
	return &publisher{js: js, giveUp: time.Minute, refused: map[string]error{}, unknown: map[string]error{}}
}

// publish publishes one job. A publish whose outcome is unknown (a
// timeout, no responders, a lost connection) is sent again with the same
// Nats-Msg-Id until JetStream answers or giveUp passes: the server's
// duplicate check makes the retries one message. An error answer from the
// server (e.g. the message is too large) is final.
func (pb *publisher) publish(ctx context.Context, spec jobSpec) (publishedJob, error) {
	msg := spec.msg()
	deadline := time.Now().Add(pb.giveUp)
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := pb.js.PublishMsg(attemptCtx, msg)
		cancel()
		if err == nil {
			return pb.ack(spec, ack), nil
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) || errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) {
			pb.mu.Lock()
			pb.refused[spec.id] = err
			pb.mu.Unlock()
			return publishedJob{}, err
		}
		lastErr = err
		if ctx.Err() != nil || time.Now().After(deadline) {
			pb.mu.Lock()
			pb.unknown[spec.id] = lastErr
			pb.mu.Unlock()
			return publishedJob{}, fmt.Errorf("publish %s (id %s): outcome unknown after retries: %w", spec.subject, spec.id, lastErr)
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// msg is the job message: Nats-Msg-Id is the id, and so is
// Jetfleet-Job-Id unless the spec's header sets one.
func (spec jobSpec) msg() *nats.Msg {
	msg := nats.NewMsg(spec.subject)
	for k, v := range spec.header {
		msg.Header[k] = v
	}
	msg.Header.Set(protocol.HeaderMsgID, spec.id)
	if _, set := spec.header[protocol.HeaderJobID]; !set {
		msg.Header.Set(protocol.HeaderJobID, spec.id)
	}
	msg.Data = spec.payload
	return msg
}

func (pb *publisher) ack(spec jobSpec, ack *jetstream.PubAck) publishedJob {
	job := publishedJob{jobSpec: spec, seq: ack.Sequence}
	pb.mu.Lock()
	defer pb.mu.Unlock()
	pb.acked = append(pb.acked, job)
	delete(pb.unknown, spec.id)
	return job
}

// publishBurst publishes specs with up to the connection's asynchronous
// window in flight at once (a burst), then publishes again, one by one,
// every spec whose outcome is unknown.
func (pb *publisher) publishBurst(ctx context.Context, specs []jobSpec) {
	futures := make([]jetstream.PubAckFuture, len(specs))
	for i, spec := range specs {
		if ctx.Err() != nil {
			return
		}
		futures[i], _ = pb.js.PublishMsgAsync(spec.msg()) // nil on error: retried below
	}
	for i, fut := range futures {
		if fut != nil {
			select {
			case ack := <-fut.Ok():
				pb.ack(specs[i], ack)
				continue
			case <-fut.Err(): //nolint:errcheck // the outcome is unknown: published again below
			case <-ctx.Done():
				return
			}
		}
		_, _ = pb.publish(ctx, specs[i])
	}
}

// publishAll publishes what arrives on specs with workers publishes in
// flight, until specs is closed.
func (pb *publisher) publishAll(ctx context.Context, specs <-chan jobSpec, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for spec := range specs {
				_, _ = pb.publish(ctx, spec)
			}
		})
	}
	wg.Wait()
}

// paced sends n specs made by next, evenly over d, then closes the
// channel. It stops early when ctx ends.
func paced(ctx context.Context, n int, d time.Duration, next func(i int) jobSpec) <-chan jobSpec {
	ch := make(chan jobSpec)
	go func() {
		defer close(ch)
		start := time.Now()
		for i := range n {
			if wait := time.Until(start.Add(d * time.Duration(i) / time.Duration(n))); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			select {
			case <-ctx.Done():
				return
			case ch <- next(i):
			}
		}
	}()
	return ch
}

// published returns the acknowledged jobs, each id once (a retried publish
// whose first attempt was stored is acknowledged as a duplicate).
func (pb *publisher) published() []publishedJob {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	seen := map[string]bool{}
	var out []publishedJob
	for _, j := range pb.acked {
		if !seen[j.id] {
			seen[j.id] = true
			out = append(out, j)
		}
	}
	return out
}

// notAcknowledged counts publishes given up with an unknown outcome.
func (pb *publisher) notAcknowledged() int {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	return len(pb.unknown)
}

func effectJob(prefix string, i int) jobSpec {
	return jobSpec{subject: protocol.JobSubject(queueDefault, kindEffect), id: fmt.Sprintf("%s-%06d", prefix, i)}
}
