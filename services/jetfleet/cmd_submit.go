package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(&command{name: "submit", args: "<queue> <kind> [payload|-]", summary: "publish a job: submit <queue> <kind> [payload|-]",
		help: "Publishes one job to jobs.<queue>.<kind> and waits for JetStream to store it. The payload is the\n" +
			"third argument, or standard input when it is '-' (a payload starting with '-' goes after '--').",
		fleet: true, output: true, setup: setupSubmit})
}

type headerFlag struct{ h nats.Header }

func (f *headerFlag) String() string { return "" }
func (f *headerFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want name=value, got %q", v)
	}
	f.h.Add(k, val)
	return nil
}

// submitted is what submit prints with -o json.
type submitted struct {
	jetfleet.EnqueueResult
	Subject string `json:"subject"`
	Stream  string `json:"stream"`
}

func setupSubmit(fs *flag.FlagSet) action {
	var job protocol.Job
	fs.StringVar(&job.ID, "id", "", "job `id`, also the idempotency key")
	fs.DurationVar(&job.Timeout, "job-timeout", 0, "bound on one attempt (Jetfleet-Timeout)")
	fs.IntVar(&job.MaxAttempts, "max-attempts", 0, "attempts before the job is dead-lettered")
	backoff := fs.String("backoff", "", "retry delays, comma-separated (1s,10s,1m)")
	headers := &headerFlag{h: nats.Header{}}
	fs.Var(headers, "header", "extra header `name=value` (repeatable)")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(2, "the <queue>", "the <kind>", "the [payload]"); err != nil {
			return err
		}
		job.Queue, job.Kind, job.Header = inv.args[0], inv.args[1], headers.h
		if *backoff != "" {
			b, err := protocol.ParseBackoff(*backoff)
			if err != nil {
				return fmt.Errorf("-backoff %q %v", *backoff, err)
			}
			job.Backoff = b
		}
		if len(inv.args) == 3 {
			job.Payload = []byte(inv.args[2])
			if inv.args[2] == "-" {
				data, err := io.ReadAll(os.Stdin)
				if err != nil {
					return fmt.Errorf("read payload: %w", err)
				}
				job.Payload = data
			}
		}
		return submit(ctx, inv, job)
	}
}

func submit(ctx context.Context, inv *invocation, job protocol.Job) error {
	msg, err := job.Msg()
	if err != nil {
		return err
	}
	c, err := inv.conn.connect()
	if err != nil {
		return err
	}
	defer c.close()
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	start := time.Now()
	ack, err := js.PublishMsg(rctx, msg)
	if err != nil {
		return fmt.Errorf("publish to %s: %w", msg.Subject, err)
	}
	took := time.Since(start)
	if job.ID == "" {
		job.ID = protocol.FallbackJobID(ack.Sequence)
	}
	out := submitted{EnqueueResult: jetfleet.EnqueueResult{JobID: job.ID, Queue: job.Queue, Kind: job.Kind, Sequence: ack.Sequence,
		Duplicate: ack.Duplicate}, Subject: msg.Subject, Stream: ack.Stream}
	return inv.print(out, func(w io.Writer) error {
		if ack.Duplicate {
			_, err := fmt.Fprintf(w, "duplicate: job %s was already published to %s (stream %s seq %d); not published again\n",
				job.ID, msg.Subject, ack.Stream, ack.Sequence)
			return err
		}
		_, err := fmt.Fprintf(w, "published job %s to %s (stream %s seq %d) in %s\n", job.ID, msg.Subject, ack.Stream, ack.Sequence,
			took.Round(time.Microsecond))
		return err
	})
}
