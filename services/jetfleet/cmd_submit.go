package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func init() {
	register(command{name: "submit", summary: "publish a job: submit <queue> <kind> [payload|-]", run: runSubmit})
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

func runSubmit(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlagSet("submit", "<queue> <kind> [payload|-]",
		"Publish one job to jobs.<queue>.<kind> and wait for JetStream to store it.\nThe payload is the third argument, or standard input when it is '-'.")
	cf := addClientFlags(fs)
	id := fs.String("id", "", "job id (also the idempotency key)")
	timeout := fs.Duration("job-timeout", 0, "bound on one attempt (Jetfleet-Timeout)")
	attempts := fs.Int("max-attempts", 0, "attempts before the job is dead-lettered")
	backoff := fs.String("backoff", "", "retry delays, comma-separated (1s,10s,1m)")
	headers := &headerFlag{h: nats.Header{}}
	fs.Var(headers, "header", "extra header `name=value` (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 2 || fs.NArg() > 3 {
		fs.Usage()
		return errUsage
	}
	job := protocol.Job{ID: *id, Queue: fs.Arg(0), Kind: fs.Arg(1), Timeout: *timeout, MaxAttempts: *attempts, Header: headers.h}
	if *backoff != "" {
		b, err := protocol.ParseBackoff(*backoff)
		if err != nil {
			return fmt.Errorf("-backoff %q %v", *backoff, err)
		}
		job.Backoff = b
	}
	switch payload := fs.Arg(2); payload {
	case "-":
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return fmt.Errorf("read payload: %w", err)
		}
		job.Payload = data
	default:
		job.Payload = []byte(payload)
	}
	msg, err := job.Msg()
	if err != nil {
		return err
	}
	c, err := cf.connect()
	if err != nil {
		return err
	}
	defer c.close()
	rctx, cancel := c.ctx(ctx)
	defer cancel()
	start := time.Now()
	ack, err := c.js.PublishMsg(rctx, msg)
	if err != nil {
		return fmt.Errorf("publish to %s: %w", msg.Subject, err)
	}
	jobID := job.ID
	if jobID == "" {
		jobID = protocol.FallbackJobID(ack.Sequence)
	}
	if ack.Duplicate {
		fmt.Fprintf(out, "duplicate: job %s was already published to %s (stream %s seq %d); not published again\n", jobID, msg.Subject, ack.Stream, ack.Sequence)
		return nil
	}
	fmt.Fprintf(out, "published job %s to %s (stream %s seq %d) in %s\n", jobID, msg.Subject, ack.Stream, ack.Sequence, time.Since(start).Round(time.Microsecond))
	return nil
}
