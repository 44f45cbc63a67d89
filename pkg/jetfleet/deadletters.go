package jetfleet

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// The supervisor's dead-letter API: its wire types, and the Client's
// dead-letter methods.

// DLQFilter selects dead letters. Empty fields match everything.
type DLQFilter struct {
	Queue  string `json:"queue,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Reason string `json:"reason,omitempty"`
	JobID  string `json:"job_id,omitempty"`
	// Since and Until bound when the letter was stored (inclusive).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
}

// Empty reports whether f matches every dead letter.
func (f DLQFilter) Empty() bool {
	return f.Queue == "" && f.Kind == "" && f.Reason == "" && f.JobID == "" && f.Since.IsZero() && f.Until.IsZero()
}

// Validate checks f, naming the bad field.
func (f DLQFilter) Validate() error {
	if f.Queue != "" {
		if err := protocol.ValidateToken("queue", f.Queue); err != nil {
			return protocol.FieldError("queue", "%v", err)
		}
	}
	if f.Kind != "" {
		if err := protocol.ValidateToken("kind", f.Kind); err != nil {
			return protocol.FieldError("kind", "%v", err)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Until.Before(f.Since) {
		return protocol.FieldError("until", "is before since")
	}
	return nil
}

// Subject is the DLQ subject filter of f.
func (f DLQFilter) Subject() string {
	star := func(s string) string {
		if s == "" {
			return "*"
		}
		return s
	}
	return protocol.DLQSubject(star(f.Queue), star(f.Kind))
}

// DeadLetterEntry is one dead letter in a listing.
type DeadLetterEntry struct {
	// Sequence is the letter's sequence in the DLQ stream: its id.
	Sequence uint64    `json:"sequence"`
	Time     time.Time `json:"time"`
	JobID    string    `json:"job_id"`
	Queue    string    `json:"queue"`
	Kind     string    `json:"kind"`
	Reason   string    `json:"reason"`
	Attempts uint32    `json:"attempts"`
	// LastError is the first line of the last error.
	LastError        string `json:"last_error,omitempty"`
	ErrorCode        string `json:"error_code,omitempty"`
	AgentID          string `json:"agent_id,omitempty"`
	OriginalSubject  string `json:"original_subject"`
	OriginalSequence uint64 `json:"original_sequence"`
	// Replay says whether and when the letter was replayed.
	Replay *ReplayMarker `json:"replay,omitempty"`
	// Letter is the whole DeadLetter document (show only).
	Letter json.RawMessage `json:"letter,omitempty"`
}

// Decode returns the DeadLetter document of a shown entry.
func (e *DeadLetterEntry) Decode() (*jetfleetpb.DeadLetter, error) {
	var dl jetfleetpb.DeadLetter
	if len(e.Letter) == 0 {
		return nil, errors.New("entry has no letter document")
	}
	return &dl, protocol.Unmarshal(e.Letter, &dl)
}

// ReplayMarker records replays of one dead letter.
type ReplayMarker struct {
	DLQSequence uint64    `json:"dlq_sequence"`
	At          time.Time `json:"at"`
	// JobSequence is the replayed job's sequence in JOBS (latest replay).
	JobSequence uint64 `json:"job_sequence"`
	// Count of replays so far.
	Count int `json:"count"`
}

// ReplayResult is what one replay did.
type ReplayResult struct {
	DLQSequence uint64 `json:"dlq_sequence"`
	JobID       string `json:"job_id"`
	// JobSequence is the new job message's sequence in JOBS.
	JobSequence uint64 `json:"job_sequence"`
	// AlreadyReplayed: the letter was replayed before and force was not
	// set; nothing was published (JobSequence is the earlier replay's).
	AlreadyReplayed bool   `json:"already_replayed,omitempty"`
	Error           string `json:"error,omitempty"`
}

// DLQListRequest pages through dead letters matching a filter, oldest first.
type DLQListRequest struct {
	DLQFilter
	// After is the Next of the previous page.
	After uint64 `json:"after,omitempty"`
	// Limit defaults to 100; at most 1000.
	Limit int `json:"limit,omitempty"`
}

// DLQListResponse is one page; Next is the After of the next page, 0 on the last.
type DLQListResponse struct {
	Letters []DeadLetterEntry `json:"letters"`
	Next    uint64            `json:"next,omitempty"`
}

// DeadLetterRequest names one dead letter.
type DeadLetterRequest struct {
	Sequence uint64 `json:"sequence"`
}

// ReplayRequest replays one letter (Sequence), the letters matching the
// filter, or all of them (All with an empty filter).
type ReplayRequest struct {
	Sequence uint64 `json:"sequence,omitempty"`
	DLQFilter
	All bool `json:"all,omitempty"`
	// Force replays letters replayed before once more.
	Force bool `json:"force,omitempty"`
	// Limit bounds how many letters a filtered replay publishes. Letters
	// replayed before (without Force) are skipped and do not count.
	// Defaults to 1000; at most 10000.
	Limit int `json:"limit,omitempty"`
	// After is the Next of the previous response: a filtered replay goes on
	// with the letters above it.
	After uint64 `json:"after,omitempty"`
}

// ReplayResponse lists what was replayed.
type ReplayResponse struct {
	// Results lists each letter replayed, or that failed to be. A replay of
	// one letter (Sequence) lists it even when it was replayed before.
	Results []ReplayResult `json:"results"`
	// AlreadyReplayed counts the letters a filtered replay skipped because
	// they were replayed before.
	AlreadyReplayed int `json:"already_replayed,omitempty"`
	// Truncated is set when more letters matched than Limit; Next is then
	// the After of a request that goes on.
	Truncated bool   `json:"truncated,omitempty"`
	Next      uint64 `json:"next,omitempty"`
}

// PurgeRequest deletes one letter (Sequence), the letters matching the
// filter, or all of them (All with an empty filter).
type PurgeRequest struct {
	Sequence uint64 `json:"sequence,omitempty"`
	DLQFilter
	All bool `json:"all,omitempty"`
}

// PurgeResponse counts deleted letters.
type PurgeResponse struct {
	Purged int `json:"purged"`
}
