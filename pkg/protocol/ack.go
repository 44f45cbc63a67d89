package protocol

import (
	"fmt"

	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Bodies an agent (or the supervisor on its behalf) publishes to a job
// message's reply subject. See docs/protocol.md for their meaning.
const (
	AckBody        = "+ACK"
	NakBody        = "-NAK"
	InProgressBody = "+WPI"
	TermBody       = "+TERM"
)

// NakWithDelayBody asks JetStream to redeliver after delay.
func NakWithDelayBody(delay time.Duration) string {
	return fmt.Sprintf(`%s {"delay": %d}`, NakBody, delay.Nanoseconds())
}

// NakOnBehalf NAKs the delivery whose ack subject is ackSubject for the
// agent that holds it (the supervisor rescuing a dead agent's job, or
// failing an attempt that ignored its deadline): JetStream redelivers the
// job at once. Any connection of the account may answer a delivery; use the
// delivery's latest ack subject, as a heartbeat lists it.
func NakOnBehalf(nc *nats.Conn, ackSubject string) error {
	if ack, err := ParseAckSubject(ackSubject); err != nil {
		return err
	} else if ack.Stream != StreamJobs {
		return fmt.Errorf("ack subject %q is not of stream %s", ackSubject, StreamJobs)
	}
	return nc.Publish(ackSubject, []byte(NakBody))
}

// AckSubject is a parsed JetStream ack reply subject.
type AckSubject struct {
	// Domain and AccountHash are empty for the v1 format; a "_" domain reads as empty.
	Domain      string
	AccountHash string
	Stream      string
	Consumer    string
	// Delivered counts deliveries of the message, this one included.
	Delivered        uint64
	StreamSequence   uint64
	ConsumerSequence uint64
	Timestamp        time.Time
	Pending          uint64
}

// ParseAckSubject reads both ack subject formats:
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
//	v2: $JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]
func ParseAckSubject(subject string) (AckSubject, error) {
	var a AckSubject
	var buf [16]string // on the stack: a job's ack subject is parsed per delivery
	tokens := splitTokens(buf[:0], subject)
	if len(tokens) < 2 || tokens[0] != "$JS" || tokens[1] != "ACK" {
		return a, fmt.Errorf("ack subject %q does not start with $JS.ACK", subject)
	}
	var rest []string
	switch {
	case len(tokens) == 9:
		rest = tokens[2:]
	case len(tokens) >= 11:
		a.Domain, a.AccountHash = tokens[2], tokens[3]
		if a.Domain == "_" {
			a.Domain = ""
		}
		rest = tokens[4:11]
	default:
		return a, fmt.Errorf("ack subject %q has %d tokens; want 9 (v1) or at least 11 (v2)", subject, len(tokens))
	}
	a.Stream, a.Consumer = rest[0], rest[1]
	nums := make([]uint64, 5)
	for i, tok := range rest[2:7] {
		n, err := strconv.ParseUint(tok, 10, 64)
		if err != nil {
			return AckSubject{}, fmt.Errorf("ack subject %q: token %q is not a number", subject, tok)
		}
		nums[i] = n
	}
	a.Delivered, a.StreamSequence, a.ConsumerSequence = nums[0], nums[1], nums[2]
	a.Timestamp = time.Unix(0, int64(nums[3])).UTC()
	a.Pending = nums[4]
	if a.Stream == "" || a.Consumer == "" {
		return AckSubject{}, fmt.Errorf("ack subject %q has an empty stream or consumer", subject)
	}
	return a, nil
}

// splitTokens appends subject's dot-separated tokens to tokens, up to its
// capacity; the last one keeps the rest of the subject.
func splitTokens(tokens []string, subject string) []string {
	for len(tokens) < cap(tokens)-1 {
		i := strings.IndexByte(subject, '.')
		if i < 0 {
			break
		}
		tokens = append(tokens, subject[:i])
		subject = subject[i+1:]
	}
	return append(tokens, subject)
}
