package demo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/agent/demo"
)

// TestEchoLogsThePayloadSize: a 500 KiB job once wrote 500 KiB to the log.
func TestEchoLogsThePayloadSize(t *testing.T) {
	t.Parallel()
	var log bytes.Buffer
	h, err := demo.Handler(demo.Echo, slog.New(slog.NewJSONHandler(&log, nil)))
	require.NoError(t, err)
	payload := []byte(`"` + strings.Repeat("x", 500<<10) + `"`)
	require.NoError(t, h(context.Background(), &agent.Job{ID: "big-1", Payload: payload}))

	var rec map[string]any
	require.NoError(t, json.Unmarshal(log.Bytes(), &rec), log.String())
	assert.Equal(t, "echo", rec["msg"])
	assert.Equal(t, "big-1", rec["job_id"])
	assert.InDelta(t, len(payload), rec["payload_bytes"], 0)
	assert.Less(t, log.Len(), 200, "the log line holds the size, not the payload")
}
