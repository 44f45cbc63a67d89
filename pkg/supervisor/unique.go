package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Unique jobs (docs/protocol.md §2.5): the leader, reading the event that
// ends a job's run, releases the job's claim in bucket unique — found
// through the job's hold, protocol.UniqueJobKey — when the event releases
// it (protocol.UniqueReleasedBy), and only while the claim is still the
// job's: an expired claim taken by another job since stays. Each step is
// a revision-checked purge, so an event read again (a rewind, a new leader
// reading what the last one did not ack) changes nothing twice. A step
// that fails fails the event, which is read again.

// uniqueBucket is bucket unique, looked up on first use.
type uniqueBucket struct {
	mu sync.Mutex
	kv jetstream.KeyValue
	// holds are the lookups of one batch of events' holds, made at once
	// before the batch is handled in order (prefetchUniqueHolds): a lookup
	// per event in turn bounded the leader to about a thousand events a
	// second. The events consumer's goroutine alone uses it.
	holds map[string]holdLookup
}

// holdLookup is the result of reading a job's hold.
type holdLookup struct {
	value    []byte
	revision uint64
	err      error // jetstream.ErrKeyNotFound when the job holds none
}

// uniqueLookupBatch bounds the keys of one batched read: the server answers
// up to 1,024 of them at once.
const uniqueLookupBatch = 512

// prefetchUniqueHolds reads the hold of every job whose run an event of
// msgs ends, in one batched direct get (multi_last) per 512 jobs; a job
// without a hold — the usual case — costs no request of its own. A job's
// hold is written before the job is published, so it is there when its
// run ends; a read that failed is made again, alone, when its event is
// handled.
func (s *Supervisor) prefetchUniqueHolds(ctx context.Context, msgs []jetstream.Msg) {
	s.unique.holds = nil
	var keys []string
	for _, m := range msgs {
		subject, ok := protocol.ParseEventSubject(m.Subject())
		if !ok || subject.Of != "job" {
			continue
		}
		switch subject.Type {
		case protocol.EventSucceeded, protocol.EventDead, protocol.EventCancelled:
		default:
			continue
		}
		var ev jetfleetpb.JobEvent
		if protocol.Unmarshal(m.Data(), &ev) != nil || ev.GetJobId() == "" {
			continue
		}
		keys = append(keys, protocol.UniqueJobKey(ev.GetJobId()))
	}
	if len(keys) == 0 {
		return
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	const prefix = "$KV." + protocol.BucketUnique + "."
	s.unique.holds = make(map[string]holdLookup, len(keys))
	for chunk := range slices.Chunk(keys, uniqueLookupBatch) {
		subjects := make([]string, len(chunk))
		for i, k := range chunk {
			subjects[i] = prefix + k
		}
		found, err := protocol.DirectGetBatch(rctx, s.nc, "KV_"+protocol.BucketUnique,
			protocol.DirectGetRequest{MultiLast: subjects, Batch: len(subjects)})
		if err != nil {
			continue // each is read alone
		}
		for _, k := range chunk {
			s.unique.holds[k] = holdLookup{err: jetstream.ErrKeyNotFound}
		}
		for _, m := range found {
			if m.Header.Get(kvOperationHeader) != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
				continue // deleted, purged or expired: no hold
			}
			s.unique.holds[strings.TrimPrefix(m.Subject, prefix)] = holdLookup{value: m.Data, revision: m.Sequence}
		}
	}
}

// kvOperationHeader marks a key-value delete or purge.
const kvOperationHeader = "KV-Operation"

func (s *Supervisor) uniqueKV(ctx context.Context) (jetstream.KeyValue, error) {
	s.unique.mu.Lock()
	defer s.unique.mu.Unlock()
	if s.unique.kv == nil {
		kv, err := s.js.KeyValue(ctx, protocol.BucketUnique)
		if err != nil {
			return nil, fmt.Errorf("bucket %s: %w", protocol.BucketUnique, err)
		}
		s.unique.kv = kv
	}
	return s.unique.kv, nil
}

// releaseUnique releases the unique claim of the job whose run ev ends.
func (s *Supervisor) releaseUnique(ctx context.Context, ev *jetfleetpb.JobEvent) error {
	if ev.GetJobId() == "" {
		return nil
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	kv, err := s.uniqueKV(rctx)
	if err != nil {
		return err
	}
	jobKey := protocol.UniqueJobKey(ev.GetJobId())
	h, ok := s.unique.holds[jobKey]
	if ok {
		delete(s.unique.holds, jobKey) // used once: an event read again looks again
	} else if e, gerr := kv.Get(rctx, jobKey); gerr != nil {
		h.err = gerr
	} else {
		h.value, h.revision = e.Value(), e.Revision()
	}
	err = h.err
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil // holds no claim (the usual case), or released already
	}
	if err != nil {
		return fmt.Errorf("unique hold of job %s: %w", ev.GetJobId(), err)
	}
	log := s.log.With(telemetry.LogJobID, ev.GetJobId(), telemetry.LogQueue, ev.GetQueue(), telemetry.LogKind, ev.GetKind())
	hold, err := protocol.ParseUniqueHold(h.value)
	if err != nil {
		log.Warn("unreadable unique hold dropped; its claim ends with its TTL", telemetry.LogError, err)
	} else if protocol.UniqueReleasedBy(hold.Until, ev.GetType()) {
		if err := releaseClaim(rctx, kv, hold.Key, ev.GetJobId()); err != nil {
			return err
		}
		log.Info("released a unique key", "unique_key", hold.Key, "until", hold.Until, "event", ev.GetType())
	}
	// The run is over: the hold has served (a period claim that stays ends
	// with its TTL).
	err = kv.Purge(rctx, jobKey, jetstream.LastRevision(h.revision), jetstream.PurgeTTL(protocol.UniqueMarkerTTL))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !isWrongRevision(err) {
		return fmt.Errorf("drop the unique hold of job %s: %w", ev.GetJobId(), err)
	}
	return nil
}

// releaseClaim purges the claim key while jobID holds it.
func releaseClaim(ctx context.Context, kv jetstream.KeyValue, key, jobID string) error {
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return nil // expired, or released already
	case err != nil:
		return fmt.Errorf("unique key %s: %w", key, err)
	case string(e.Value()) != jobID:
		return nil // another job's since this one's expired
	}
	err = kv.Purge(ctx, key, jetstream.LastRevision(e.Revision()), jetstream.PurgeTTL(protocol.UniqueMarkerTTL))
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
