package supervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Unique jobs (docs/protocol.md §2.4): the leader, reading the event that
// ends a job's run, releases the job's claim in bucket unique — found
// through the job's hold, protocol.UniqueJobKey — when the event releases
// it (protocol.UniqueReleasedBy), and only while the claim is still the
// job's: an expired claim taken by another job since stays. Each step is
// a revision-checked purge, so an event read again (a rewind, a new leader
// reading what the last one did not ack) changes nothing twice. A step
// that fails fails the event, which is read again.

// releaseUnique releases the unique claim of the job whose run ev ends.
func (s *Supervisor) releaseUnique(ctx context.Context, ev *jetfleetpb.JobEvent) error {
	if s.uniqueKV == nil || ev.GetJobId() == "" {
		return nil
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	jobKey := protocol.UniqueJobKey(ev.GetJobId())
	e, err := s.uniqueKV.Get(rctx, jobKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil // holds no claim (the usual case), or released already
	}
	if err != nil {
		return fmt.Errorf("unique hold of job %s: %w", ev.GetJobId(), err)
	}
	log := s.log.With(telemetry.LogJobID, ev.GetJobId(), telemetry.LogQueue, ev.GetQueue(), telemetry.LogKind, ev.GetKind())
	hold, err := protocol.ParseUniqueHold(e.Value())
	if err != nil {
		log.Warn("unreadable unique hold dropped; its claim ends with its TTL", telemetry.LogError, err)
	} else if protocol.UniqueReleasedBy(hold.Until, ev.GetType()) {
		if err := s.releaseClaim(rctx, hold.Key, ev.GetJobId()); err != nil {
			return err
		}
		log.Info("released a unique key", "unique_key", hold.Key, "until", hold.Until, "event", ev.GetType())
	}
	// The run is over: the hold has served (a period claim that stays ends
	// with its TTL).
	err = s.uniqueKV.Purge(rctx, jobKey, jetstream.LastRevision(e.Revision()), jetstream.PurgeTTL(protocol.UniqueMarkerTTL))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongRevision(err) {
		return fmt.Errorf("drop the unique hold of job %s: %w", ev.GetJobId(), err)
	}
	return nil
}

// releaseClaim purges the claim key while jobID holds it.
func (s *Supervisor) releaseClaim(ctx context.Context, key, jobID string) error {
	e, err := s.uniqueKV.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil // expired, or released already
	case err != nil:
		return fmt.Errorf("unique key %s: %w", key, err)
	case string(e.Value()) != jobID:
		return nil // another job's since this one's expired
	}
	err = s.uniqueKV.Purge(ctx, key, jetstream.LastRevision(e.Revision()), jetstream.PurgeTTL(protocol.UniqueMarkerTTL))
	if err != nil && !isWrongRevision(err) {
		return fmt.Errorf("release unique key %s of job %s: %w", key, jobID, err)
	}
	return nil // a wrong revision: it changed hands meanwhile
}

// isWrongRevision reports a revision-checked write refused because the key
// changed.
func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
