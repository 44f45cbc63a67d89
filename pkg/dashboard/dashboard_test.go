package dashboard_test

import (
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// TestEveryViewRendersTheFleet runs jobs and a schedule on a dev fleet and
// reads every view: each answers 200 and shows what the fleet holds.
func TestEveryViewRendersTheFleet(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{}, nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	events := fleettest.WatchJobEvents(t, b.nc)
	_, err := b.client.AddSchedule(ctx, &jetfleet.Schedule{ID: "nightly", Spec: jetfleet.Spec{Cron: "30 2 * * *", Zone: "Europe/Berlin"},
		Target: jetfleet.Target{Queue: "default", Kind: "echo"}})
	require.NoError(t, err)
	tr, err := b.client.TriggerSchedule(ctx, "nightly")
	require.NoError(t, err)
	events.WaitFor(t, 20*time.Second, tr.JobID, protocol.EventSucceeded)
	res, err := b.client.Enqueue(ctx, failArgs{NonRetryable: true})
	require.NoError(t, err)
	events.WaitFor(t, 20*time.Second, res.JobID, protocol.EventDead)

	c := browser(t)
	for _, p := range []struct {
		path string
		want []string
	}{
		{"/", []string{"Overview", "dev-agent", "default", "Leaders"}},
		{"/schedules", []string{"nightly", "every day at 02:30 (Europe/Berlin)"}},
		{"/schedules/nightly", []string{"Next fires", "Europe/Berlin", tr.JobID, "succeeded"}},
		{"/kinds", []string{"echo", "fail"}},
		{"/kinds/default/echo", []string{"Kind echo", tr.JobID}},
		{"/jobs?state=succeeded", []string{tr.JobID}},
		{"/jobs?state=dead", []string{res.JobID}},
		{"/jobs/" + url.PathEscape(tr.JobID), []string{"Timeline", "succeeded", "JOBS keeps a job only until", "Result", "payload_bytes"}},
		{"/jobs/" + url.PathEscape(res.JobID), []string{"Dead letter", "non_retryable", "Payload"}},
		{"/running", []string{"dev-agent"}},
		{"/dlq", []string{res.JobID}},
		{"/agents", []string{"dev-agent", "echo"}},
	} {
		// History and trends are written by the supervisor after the
		// events: wait until the page shows them.
		var status int
		var body string
		require.Eventually(t, func() bool {
			status, body = get(t, c, b.url+p.path)
			return status == http.StatusOK && containsAll(body, p.want...)
		}, 20*time.Second, 100*time.Millisecond, "%s: status %d:\n%s", p.path, status, body)
	}
}

// TestBadInput: an unknown id is a 404 page, a malformed filter a 400 that
// says why, an unknown path a 404.
func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, dashboard.Config{}, nil)
	c := browser(t)
	for _, tc := range []struct {
		path   string
		status int
		reason string
	}{
		{"/jobs/no-such-job", http.StatusNotFound, "No event of job no-such-job"},
		{"/schedules/no-such-schedule", http.StatusNotFound, "404"},
		{"/dlq/999999", http.StatusNotFound, "404"},
		{"/dlq/abc", http.StatusNotFound, "sequence number"},
		{"/kinds/default/never-ran", http.StatusNotFound, "No run of kind"},
		{"/nowhere", http.StatusNotFound, "There is no page"},
		{"/jobs?state=bogus", http.StatusBadRequest, "state: must be one of"},
		{"/jobs?since=yesterday", http.StatusBadRequest, "since: must be a time"},
		{"/jobs?limit=0", http.StatusBadRequest, "limit: must be a number"},
		{"/dlq?queue=a.b", http.StatusBadRequest, "queue"},
		{"/schedules?paused=maybe", http.StatusBadRequest, "paused: must be yes or no"},
		{"/schedules?color=red", http.StatusBadRequest, "color: is not a filter of this page"},
		{"/jobs?since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z", http.StatusBadRequest, "until: is before since"},
		{"/schedules/nightly?res=x", http.StatusBadRequest, "res: must be m"},
		{"/lookup?id=", http.StatusBadRequest, "Malformed job id"},
	} {
		status, body := get(t, c, b.url+tc.path)
		assert.Equal(t, tc.status, status, tc.path)
		assert.Contains(t, body, tc.reason, tc.path)
	}
}
