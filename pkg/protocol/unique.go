package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Unique jobs (docs/protocol.md §2.5). A publisher claims a unique key in
// bucket unique before it publishes the job: the claim's bucket key is
// UniqueClaimKey(queue, kind, key), its value the job id, created only if
// absent (KV create) with a per-key TTL. Beside it, UniqueJobKey(job id)
// holds a UniqueHold, so the supervisor leader can find the claim of a job
// whose run ended and release it (UniqueReleasedBy).

// MaxUniqueKeyLength bounds a unique key, in bytes.
const MaxUniqueKeyLength = 256

// What ends a unique claim besides its TTL: the values of UniqueHold.Until.
const (
	// UniqueUntilFinished: the claim is released when the job's run is
	// over — succeeded, dead or cancelled.
	UniqueUntilFinished = "finished"
	// UniqueUntilPeriod: the claim lasts its period (its TTL); a job that
	// is dead or cancelled releases it early, so a failure never blocks
	// the key. A success keeps it until the period ends.
	UniqueUntilPeriod = "period"
)

// UniqueMarkerTTL is how long bucket unique keeps the marker of a claim
// that expired or was released (its LimitMarkerTTL, and the TTL of the
// purge that releases a claim): markers leave on their own, so claims of
// ever new keys do not pile up.
const UniqueMarkerTTL = time.Minute

// DefaultUniqueBackstop is the TTL of a claim held until its job finished
// when the publisher sets none: it frees a key whose job was never
// published (the publisher died between claim and publish) or whose end
// was never seen.
const DefaultUniqueBackstop = 24 * time.Hour

// Unique is a job's unique key and its lifetime.
type Unique struct {
	// Key is unique per queue and kind: at most MaxUniqueKeyLength bytes,
	// any bytes.
	Key string
	// For is the claim's TTL: the period of a period claim; for a claim
	// held UntilFinished, the backstop (zero: DefaultUniqueBackstop).
	For time.Duration
	// UntilFinished holds the claim until the job's run is over.
	UntilFinished bool
}

// Validate checks the key and the lifetime.
func (u Unique) Validate() error {
	var errs []error
	switch {
	case u.Key == "":
		errs = append(errs, errors.New("unique key is empty"))
	case len(u.Key) > MaxUniqueKeyLength:
		errs = append(errs, fmt.Errorf("unique key is %d bytes long, at most %d are allowed", len(u.Key), MaxUniqueKeyLength))
	}
	switch {
	case u.For < 0:
		errs = append(errs, fmt.Errorf("unique period %s is negative", u.For))
	case u.For > 0 && u.For < time.Second:
		errs = append(errs, fmt.Errorf("unique period %s is shorter than a second, the least TTL JetStream keeps", u.For))
	case u.For == 0 && !u.UntilFinished:
		errs = append(errs, errors.New("unique key needs a period or until-finished"))
	}
	return errors.Join(errs...)
}

// Until is UniqueUntilFinished or UniqueUntilPeriod.
func (u Unique) Until() string {
	if u.UntilFinished {
		return UniqueUntilFinished
	}
	return UniqueUntilPeriod
}

// TTL is the claim's per-key TTL for a job due at processAt (zero: now),
// seen at now: a backstop counts from when the job is due.
func (u Unique) TTL(now, processAt time.Time) time.Duration {
	if !u.UntilFinished {
		return u.For
	}
	ttl := u.For
	if ttl == 0 {
		ttl = DefaultUniqueBackstop
	}
	if processAt.After(now) {
		ttl += processAt.Sub(now)
	}
	return ttl
}

// UniqueClaimKey is the bucket key of a unique key of kind on queue:
// "key.<queue>.<kind>.<unpadded base64url of key>".
func UniqueClaimKey(queue, kind, key string) string {
	return "key." + queue + "." + kind + "." + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// UniqueJobKey is the bucket key of the UniqueHold of the job jobID:
// "job.<job token>".
func UniqueJobKey(jobID string) string { return "job." + JobToken(jobID) }

// UniqueHold is the value of a job's UniqueJobKey, JSON: the claim the job
// holds and what releases it.
type UniqueHold struct {
	// Key is the claim's bucket key (UniqueClaimKey).
	Key string `json:"key"`
	// Until is UniqueUntilFinished or UniqueUntilPeriod.
	Until string `json:"until"`
}

// MarshalUniqueHold encodes h.
func MarshalUniqueHold(h UniqueHold) []byte {
	data, _ := json.Marshal(h) // two strings: cannot fail
	return data
}

// ParseUniqueHold decodes a UniqueHold.
func ParseUniqueHold(data []byte) (UniqueHold, error) {
	var h UniqueHold
	if err := json.Unmarshal(data, &h); err != nil {
		return h, fmt.Errorf("unique hold: %w", err)
	}
	if h.Key == "" {
		return h, errors.New("unique hold: no key")
	}
	return h, nil
}

// UniqueReleasedBy reports whether a job event of type eventType releases
// a claim held until until: the end of the run for UniqueUntilFinished,
// dead and cancelled only for UniqueUntilPeriod (any other value is taken
// as UniqueUntilFinished).
func UniqueReleasedBy(until, eventType string) bool {
	switch eventType {
	case EventDead, EventCancelled:
		return true
	case EventSucceeded:
		return until != UniqueUntilPeriod
	}
	return false
}
