package jetfleet_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// TestEnqueueRefusesHeadersAnAgentCannotUse: a Jetfleet-* header given
// through WithHeader is read as the protocol says; a value an agent could
// not use is refused at enqueue, with the header named, and nothing is
// stored — it is not dead-lettered later. A usable one takes effect.
func TestEnqueueRefusesHeadersAnAgentCannotUse(t *testing.T) {
	t.Parallel()
	b := setupUnique(t)
	_, err := b.client.Enqueue(b.ctx, echo{}, jetfleet.WithHeader(protocol.HeaderTimeout, "soon"))
	require.Error(t, err)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.Contains(t, err.Error(), `header Jetfleet-Timeout: "soon" is not a positive duration such as 30s`)
	results, err := b.client.EnqueueMany(b.ctx, []jetfleet.EnqueueParams{
		{Args: echo{}, Options: []jetfleet.EnqueueOption{jetfleet.WithHeader(protocol.HeaderMaxAttempts, "none")}},
	})
	require.NoError(t, err)
	assert.ErrorContains(t, results[0].Err, `header Jetfleet-Max-Attempts: "none" is not a whole number of at least 1`)
	assert.Zero(t, b.jobsStored(t), "nothing stored")

	res, err := b.client.Enqueue(b.ctx, echo{}, jetfleet.WithHeader(protocol.HeaderMaxAttempts, "7"))
	require.NoError(t, err)
	assert.NotZero(t, res.Sequence)
	_, err = b.client.Enqueue(b.ctx, echo{}, jetfleet.WithHeader(protocol.HeaderTimeout, "soon"), jetfleet.WithTimeout(time.Minute))
	require.NoError(t, err, "the option's value replaces the header's: what is sent is checked")
}
