package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// LeadersElsewhere is a leader's task that keeps the streams it cannot act
// without (the scheduler's: the lease bucket, its state bucket, JOBS and
// EVENTS) led from a NATS server other than the one it is connected to.
//
// Why: when the leader's server is cut off or dies, the leader must move to
// another server and keep (or another replica take) the lease within the
// lease TTL. If that server also led those streams, they first have no
// leader until the others elect one — 4 to 9 s in nats-server, not
// configurable — and the two waits add up: the leader's fires stop for the
// election plus the resend, past the TTL. With the streams led elsewhere, the
// loss of the leader's server costs one failover, not two.
//
// Every interval, once it has been on one server for a whole interval, it
// reads each stream's info; where the connected server leads a replicated stream, it asks the
// leader to step down in favour of the current replica most recently heard
// from. A single server, or a stream of one replica, has no other replica
// to hand over to and is left alone; so is a stream with no such replica
// until one has caught up. A step-down
// drops what is in flight to the old leader unanswered, which the
// scheduler's resend covers (scheduler.resend_after).
func LeadersElsewhere(js jetstream.JetStream, streams []string, interval time.Duration, log *slog.Logger) Task {
	return Task{Name: "stream leaders elsewhere", Lead: func(ctx context.Context) {
		t := time.NewTicker(interval)
		defer t.Stop()
		var server string
		// A stream whose step-down failed is left for a number of rounds
		// that doubles with each failure (up to maxSkip), and its failure
		// is logged as a warning once per leadership: a NATS user not
		// allowed to ask gets no answer at all, and the server's permission
		// error reaches only the connection's error log.
		failures, skip, warned := map[string]int{}, map[string]int{}, map[string]bool{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// Only on a server the replica has been on for a whole interval:
			// right after it won the lease or moved to another server, it is
			// busy catching up or renewing its lease, and a step-down would
			// drop those writes in flight.
			if now := js.Conn().ConnectedServerName(); now != server {
				server = now
				continue
			}
			for _, stream := range streams {
				if skip[stream] > 0 {
					skip[stream]--
					continue
				}
				err := moveLeaderOff(ctx, js, stream, interval, log)
				if err == nil || ctx.Err() != nil {
					failures[stream] = 0
					continue
				}
				level := slog.LevelDebug
				if !warned[stream] {
					level, warned[stream] = slog.LevelWarn, true
				}
				failures[stream] = min(failures[stream]+1, maxSkipShift)
				skip[stream] = min(1<<(failures[stream]-1), maxSkip)
				log.Log(ctx, level, "cannot move a stream's leader off this replica's server", "stream", stream,
					"server", server, "next_try_in_rounds", skip[stream]+1, telemetry.LogError, err)
			}
		}
	}}
}

// maxSkip bounds the rounds a stream whose step-downs fail is left for;
// maxSkipShift is the failure count that reaches it.
const maxSkip, maxSkipShift = 32, 6

// recentlySeen is how recently a replica must have answered its leader to
// take the lead over: two of nats-server's 1 s Raft heartbeats.
const recentlySeen = 2 * time.Second

// moveLeaderOff asks stream's leader to step down if it is the server js is
// connected to (see LeadersElsewhere). It returns the error of a step-down
// that was asked for and not made (a NATS user not allowed to ask gets no
// answer: a timeout); the next round tries again.
func moveLeaderOff(ctx context.Context, js jetstream.JetStream, stream string, timeout time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil // no leader right now (an election), or the stream is gone: the next round sees
	}
	own := js.Conn().ConnectedServerName()
	cl := s.CachedInfo().Cluster
	if cl == nil || own == "" || cl.Leader != own {
		return nil
	}
	successor, seen := "", recentlySeen
	for _, p := range cl.Replicas {
		// nats-server may call a replica current until it has been silent
		// for 10 s: a replica cut off a moment ago can be "current" too. Handing
		// the lead to it would leave the stream without a leader until an
		// election, so only a replica heard from within the last
		// heartbeats qualifies.
		if p.Current && !p.Offline && p.Active < seen {
			successor, seen = p.Name, p.Active
		}
	}
	if successor == "" {
		return nil
	}
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": successor}})
	reply, err := js.Conn().RequestWithContext(ctx, jetstream.DefaultAPIPrefix+"STREAM.LEADER.STEPDOWN."+stream, req)
	if err != nil {
		return fmt.Errorf("step-down in favour of %s: %w", successor, err)
	}
	var answer struct {
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(reply.Data, &answer); err != nil {
		return fmt.Errorf("step-down in favour of %s: answer %q: %w", successor, reply.Data, err)
	}
	if answer.Error != nil {
		return fmt.Errorf("step-down in favour of %s: %w", successor, answer.Error)
	}
	log.Info("moved a stream's leader off this replica's server", "stream", stream, "from", own, "preferred", successor)
	return nil
}
