package protocol_test

import (
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func TestValidateProgress(t *testing.T) {
	t.Parallel()
	for _, ok := range []float64{0, 0.4, 1, math.Copysign(0, -1)} {
		assert.NoError(t, protocol.ValidateProgress(ok), "%v", ok)
	}
	for _, bad := range []float64{math.NaN(), -0.01, 1.0000001, math.Inf(1), math.Inf(-1)} {
		err := protocol.ValidateProgress(bad)
		if assert.Error(t, err, "%v", bad) {
			assert.Contains(t, err.Error(), "from 0 to 1")
		}
	}
}

func TestProgressMessage(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "resizing image 4 of 10", protocol.ProgressMessage("resizing image 4 of 10"))
	assert.Equal(t, "two  lines no", protocol.ProgressMessage("two\r\nlines\tno"), "control characters become spaces")
	assert.Equal(t, "bad   byte", protocol.ProgressMessage("bad \xff\xfe byte"), "invalid UTF-8 becomes a space")

	long := strings.Repeat("é", 200) // 400 bytes
	cut := protocol.ProgressMessage(long)
	assert.Equal(t, protocol.MaxProgressMessage, len(cut))
	assert.True(t, utf8.ValidString(cut))
	odd := "x" + long // a two-byte character straddles the limit
	cut = protocol.ProgressMessage(odd)
	assert.Equal(t, protocol.MaxProgressMessage-1, len(cut))
	assert.True(t, utf8.ValidString(cut))
}

func TestProgressEventMsgID(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "progress:JOBS:42:3:7", protocol.ProgressEventMsgID(42, 3, 7))
	assert.NotEqual(t, protocol.ProgressEventMsgID(42, 3, 1), protocol.ProgressEventMsgID(42, 3, 2), "each report has its own id")
	assert.Empty(t, protocol.ProgressEventMsgID(0, 1, 1))
}

func TestAttemptRunning(t *testing.T) {
	t.Parallel()
	assert.True(t, protocol.AttemptRunning(protocol.EventStarted))
	assert.True(t, protocol.AttemptRunning(protocol.EventProgress))
	assert.False(t, protocol.AttemptRunning(protocol.EventRetrying))
	assert.False(t, protocol.RunOver(protocol.EventProgress), "progress never ends a run")
}
