package agent

import (
	"fmt"
	"sync"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// DefaultOutputTail is how many bytes of a job's output are kept;
// MaxOutputTail is the most agent.output_tail allows.
const (
	DefaultOutputTail = 4096
	MaxOutputTail     = 64 << 10
)

// OutputTail keeps the last bytes written to it and counts the rest. It is
// safe for concurrent writers (a process's stdout and stderr).
type OutputTail struct {
	mu      sync.Mutex
	limit   int
	buf     []byte
	dropped int64
}

// NewOutputTail keeps the last limit bytes.
func NewOutputTail(limit int) *OutputTail {
	o := &OutputTail{}
	o.init(limit)
	return o
}

func (o *OutputTail) init(limit int) {
	if limit <= 0 {
		limit = DefaultOutputTail
	}
	o.limit = limit
}

// Write implements io.Writer; it never fails.
func (o *OutputTail) Write(p []byte) (int, error) {
	if o == nil {
		return len(p), nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	n := len(p)
	o.buf = append(o.buf, p...)
	if over := len(o.buf) - o.limit; over > 0 {
		o.dropped += int64(over)
		o.buf = append(o.buf[:0], o.buf[over:]...)
	}
	return n, nil
}

// String is the kept tail, prefixed with a note when bytes were dropped.
func (o *OutputTail) String() string {
	if o == nil {
		return ""
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.dropped > 0 {
		return fmt.Sprintf("[truncated: %d earlier bytes dropped]\n%s", o.dropped, protocol.ToValidUTF8(string(o.buf)))
	}
	return protocol.ToValidUTF8(string(o.buf))
}

// Dropped is how many bytes were written beyond the kept tail.
func (o *OutputTail) Dropped() int64 {
	if o == nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.dropped
}
