package protocol

import (
	"sort"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// DeadLetterMsgID is the Nats-Msg-Id of the dead letter of the message at
// seq in stream. Whoever dead-letters a job — the agent after its last
// attempt, the supervisor after max deliveries — uses it, so the DLQ stream
// keeps exactly one letter per job message.
func DeadLetterMsgID(stream string, seq uint64) string {
	return "dlq:" + stream + ":" + strconv.FormatUint(seq, 10)
}

// DeadLetterMsg builds the DLQ message for dl.
func DeadLetterMsg(dl *jetfleetpb.DeadLetter) (*nats.Msg, error) {
	data, err := Marshal(dl)
	if err != nil {
		return nil, err
	}
	kind := dl.GetKind()
	if ValidateToken("kind", kind) != nil {
		kind = "_invalid"
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
