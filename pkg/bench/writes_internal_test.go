package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWritesBetweenCountsAppendsAndAckRemovals(t *testing.T) {
	before := map[string]streamTally{
		"JOBS":      {lastSeq: 100, msgs: 5, ackRemoves: true},
		"EVENTS":    {lastSeq: 1000, msgs: 1000},
		"KV_agents": {lastSeq: 7, msgs: 2},
	}
	after := map[string]streamTally{
		"JOBS":      {lastSeq: 110, msgs: 0, ackRemoves: true}, // 10 stored, 15 acked (5 from before)
		"EVENTS":    {lastSeq: 1020, msgs: 1010},               // limits drop old events without a write
		"KV_agents": {lastSeq: 9, msgs: 2},
		"NEW":       {lastSeq: 3, msgs: 3},
	}
	w := writesBetween(before, after, 10)
	assert.InDelta(t, 1.0, w.jobsAppends, 1e-9)
	assert.InDelta(t, 1.5, w.jobsAcks, 1e-9)
	assert.InDelta(t, 2.0, w.events, 1e-9)
	assert.InDelta(t, 0.2, w.keyValue, 1e-9)
	assert.InDelta(t, 0.3, w.other, 1e-9)
	assert.InDelta(t, 5.0, w.total(), 1e-9)
	assert.Equal(t, "5.00 writes/job (JOBS 1.00 + acks 1.50, EVENTS 2.00, key-value 0.20, other 0.30)", w.String())
}
