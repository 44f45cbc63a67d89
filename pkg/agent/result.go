package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Job results (docs/protocol.md §3.10): what a handler returns travels
// with the job's succeeded event, so whoever reads the job's status reads
// its result (jetfleet.Client.Job and Wait, jetfleet jobs get).

// Bounds of a job's result: agent.max_result, by default DefaultMaxResult,
// at most MaxResult (the succeeded event carries it, base64-encoded, with
// the output tail, and must fit the server's max_payload).
const (
	DefaultMaxResult = 64 << 10
	MaxResult        = protocol.MaxResult
)

// ErrResultTooLarge is what RecordResult returns for a result above the
// agent's max_result; ErrInvalidResult for one that is not JSON.
var (
	ErrResultTooLarge = errors.New("agent: result too large")
	ErrInvalidResult  = errors.New("agent: result is not a JSON document")
)

// RecordResult records the result of the job in ctx: v encoded as JSON (a
// json.RawMessage is taken as it is, once checked). It is stored with the
// job's succeeded event; a job that does not succeed keeps no result. A
// later call replaces an earlier one. It returns ErrResultTooLarge when the
// encoded result is larger than the agent's max_result (64 KiB by default):
// the attempt then fails, non-retryable, with that reason, even if the
// handler returns nil (unless a later call records a result that fits).
// It returns ErrInvalidResult for a RawMessage that is not JSON. It is a no-op
// outside a handler (after encoding v).
func RecordResult(ctx context.Context, v any) error {
	var data []byte
	if raw, ok := v.(json.RawMessage); ok {
		if !json.Valid(raw) {
			return fmt.Errorf("%w: %.40q", ErrInvalidResult, raw)
		}
		var compact bytes.Buffer
		_ = json.Compact(&compact, raw) // valid: checked above
		data = compact.Bytes()
	} else {
		var err error
		if data, err = json.Marshal(v); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidResult, err)
		}
	}
	j := JobFrom(ctx)
	if j == nil || j.ex == nil {
		return nil
	}
	return j.ex.recordResult(data)
}

func (ex *execution) recordResult(data []byte) error {
	limit := ex.agent.cfg.MaxResult
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if int64(len(data)) > int64(limit) {
		err := fmt.Errorf("%w: %d bytes of JSON, agent.max_result is %s", ErrResultTooLarge, len(data), limit)
		ex.result, ex.resultRefused = nil, err
		return err
	}
	ex.result, ex.resultRefused = data, nil
	return nil
}

// refusedResult is the non-retryable failure of an attempt whose handler
// returned nil after its latest result was refused: running it again
// would produce the same result.
func (ex *execution) refusedResult() error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.resultRefused == nil {
		return nil
	}
	return NonRetryable(fmt.Errorf("the handler returned without error, but its result was refused: %w", ex.resultRefused))
}
