package protocol

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// DeadLetterMsgID is the Nats-Msg-Id of the dead letter of the message at
// seq in stream. Whoever dead-letters a job — the agent after its last
// attempt, the supervisor after max deliveries — uses it, so the DLQ stream
// keeps exactly one letter per job message.
func DeadLetterMsgID(stream string, seq uint64) string {
	return "dlq:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// InvalidToken stands for the queue or kind of a job subject whose token
// is not valid, in the subjects of its dead letter and events.
const InvalidToken = "_invalid"

// JobSubjectTokens returns the queue and kind of a job subject, each
// InvalidToken when it is not a valid token (jobs.default has no kind).
func JobSubjectTokens(subject string) (queue, kind string) {
	queue, kind = InvalidToken, InvalidToken
	if q, k, err := ParseJobSubject(subject); err == nil {
		return q, k
	}
	parts := strings.Split(subject, ".")
	if len(parts) > 1 && ValidateToken("queue", parts[1]) == nil {
		queue = parts[1]
	}
	if len(parts) == 3 && ValidateToken("kind", parts[2]) == nil {
		kind = parts[2]
	}
	return queue, kind
}

// NewDeadLetter starts the dead letter of the JOBS message at seq, as it
// was stored (subject, header, payload) and as job was read from it: its
// identity (the fallback id when it has none), queue and kind (InvalidToken
// for an unusable token), original subject, stream and sequence, headers
// and payload, and now as failed_at. Whoever dead-letters a job — an agent,
// the supervisor — completes it with reason, attempts, error and code.
func NewDeadLetter(job Job, subject string, header nats.Header, payload []byte, seq uint64, failedAt time.Time) *jetfleetpb.DeadLetter {
	if job.ID == "" {
		job.ID = FallbackJobID(seq)
	}
	if job.Queue == "" || job.Kind == "" {
		job.Queue, job.Kind = JobSubjectTokens(subject)
	}
	return &jetfleetpb.DeadLetter{JobId: job.ID, Queue: job.Queue, Kind: job.Kind, OriginalSubject: subject,
		OriginalStream: StreamJobs, OriginalSequence: seq, Headers: HeadersDoc(header), Payload: payload,
		FailedAt: timestamppb.New(failedAt)}
}

// DeadLetterMsg builds the DLQ message for dl.
func DeadLetterMsg(dl *jetfleetpb.DeadLetter) (*nats.Msg, error) {
	data, err := Marshal(dl)
	if err != nil {
		return nil, err
	}
	kind := dl.GetKind()
	if ValidateToken("kind", kind) != nil {
		kind = InvalidToken
	}
	h := nats.Header{}
	h.Set(HeaderMsgID, DeadLetterMsgID(dl.GetOriginalStream(), dl.GetOriginalSequence()))
	h.Set(HeaderDeadReason, dl.GetReason())
	if dl.GetJobId() != "" {
		h.Set(HeaderJobID, dl.GetJobId())
	}
	return &nats.Msg{Subject: DLQSubject(dl.GetQueue(), kind), Header: h, Data: data}, nil
}

// HeadersDoc converts NATS headers to the DeadLetter form; invalid UTF-8 is
// replaced, so a poison message can always be dead-lettered.
func HeadersDoc(h nats.Header) map[string]*jetfleetpb.HeaderValues {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]*jetfleetpb.HeaderValues, len(h))
	for k, v := range h {
		values := make([]string, len(v))
		for i := range v {
			values[i] = ToValidUTF8(v[i])
		}
		out[ToValidUTF8(k)] = &jetfleetpb.HeaderValues{Values: values}
	}
	return out
}

// HeadersFromDoc converts the DeadLetter form back to NATS headers.
func HeadersFromDoc(m map[string]*jetfleetpb.HeaderValues) nats.Header {
	h := nats.Header{}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		h[k] = append([]string(nil), m[k].GetValues()...)
	}
	return h
}
