package dashboard_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// invoices is a workflow of the dev agent's demo kinds: a fan-out of echo
// jobs that succeed, a fan-out of fail jobs that fail at once (each with
// its invoice in the error), a report that runs in any case and a page
// that runs because something failed.
const invoices = `{"name": "invoices", "description": "charge the day's invoices, then report", "steps": [
  {"name": "list", "kind": "echo", "input": {"day": "{{input.day}}"}},
  {"name": "render", "kind": "echo", "depends_on": ["list"], "for_each": [{"id": "inv-1"}, {"id": "inv-2"}, {"id": "inv-3"}],
   "input": {"invoice": "{{item.id}}"}},
  {"name": "charge", "kind": "fail", "depends_on": ["list"], "for_each": [{"id": "inv-1"}, {"id": "inv-2"}],
   "input": {"non_retryable": true, "message": "invoice {{item.id}}: card declined"}},
  {"name": "report", "kind": "echo", "depends_on": ["render", "charge"], "when": "always",
   "input": {"failed": "{{steps.charge.failed}}"}},
  {"name": "page", "kind": "echo", "depends_on": ["charge"], "when": "on_failure"}]}`

// TestWorkflowPages: the list of workflows and runs, filtered by the query
// string (a bad or hostile one is a 400 that reflects nothing); a run's
// page with its graph, steps and failed elements; an unknown run is a 404;
// retry-failed and cancel need the operator role and the CSRF token, are
// carried out and recorded on the run's page.
func TestWorkflowPages(t *testing.T) {
	t.Parallel()
	users := filepath.Join(t.TempDir(), "users")
	require.NoError(t, os.WriteFile(users, []byte("ada:ada-password:operator\nvic:vic-password:viewer\n"), 0o600))
	b := setup(t, dashboard.Config{Auth: dashboard.AuthConfig{UsersFile: users}}, nil)
	ctx := fleettest.Ctx(t, 90*time.Second)
	_, err := b.client.AddWorkflowDocument(ctx, []byte(invoices))
	require.NoError(t, err)
	_, err = b.client.AddWorkflowDocument(ctx, []byte(`{"name": "slow", "steps": [{"name": "nap", "kind": "sleep", "input": {"duration": "60s"}}]}`))
	require.NoError(t, err)
	_, err = b.client.RunWorkflow(ctx, "invoices", map[string]string{"day": "2026-11-26"}, jetfleet.RunID("day-2026-11-26"))
	require.NoError(t, err)
	run, err := b.client.WaitWorkflowRun(ctx, "day-2026-11-26")
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowFailed, run.Status)
	require.Equal(t, 2, run.FailedElements)

	login := func(user, password string) *http.Client {
		c := browser(t)
		status, body := post(t, c, b.url, "/login", "/login", url.Values{"user": {user}, "password": {password}, "next": {"/"}})
		require.Equal(t, http.StatusSeeOther, status, body)
		return c
	}
	operator, viewer := login("ada", "ada-password"), login("vic", "vic-password")

	t.Run("the list", func(t *testing.T) {
		status, body := get(t, viewer, b.url+"/workflows")
		require.Equal(t, http.StatusOK, status, body)
		assert.True(t, containsAll(body, `href="/workflows" aria-current="page"`, `data-workflow="invoices"`, "charge the day&#39;s invoices",
			`data-workflow="slow"`, `data-run="day-2026-11-26" data-status="failed"`, `href="/workflows/runs/day-2026-11-26"`), body)
		_, body = get(t, viewer, b.url+"/workflows?workflow=invoices&status=failed")
		assert.Contains(t, body, `data-run="day-2026-11-26"`)
		_, body = get(t, viewer, b.url+"/workflows?status=succeeded")
		assert.NotContains(t, body, `data-run="day-2026-11-26"`)
		assert.Contains(t, body, "No run matches")
		_, body = get(t, viewer, b.url+"/workflows?workflow=slow")
		assert.NotContains(t, body, `data-run="day-2026-11-26"`)
	})

	t.Run("bad and hostile query strings", func(t *testing.T) {
		for _, tc := range []struct {
			query, reason string
		}{
			{"status=bogus", "status: must be one of running, succeeded, failed, cancelled"},
			{"status=waiting", "status: must be one of"},
			{"workflow=a.b", "workflow: invalid workflow name"},
			{"workflow=" + strings.Repeat("w", 65), "at most 64 characters"},
			{"limit=0", "limit: must be a number from 1 to 1000"},
			{"limit=5000", "limit: must be a number from 1 to 1000"},
			{"status=failed&status=running", "status: is given more than once"},
			{"color=red", "color: is not a filter of this page"},
			{"workflow=%3Cscript%3Ealert(1)%3C/script%3E", "workflow: invalid workflow name &#34;&lt;script&gt;alert(1)&lt;/script&gt;&#34;"},
			{"status=%3Cimg%20src=x%20onerror=alert(1)%3E", "status: must be one of"},
			{"%3Cscript%3Ealert(1)%3C/script%3E=1", "&lt;script&gt;alert(1)&lt;/script&gt;: is not a filter of this page"},
		} {
			status, body := get(t, viewer, b.url+"/workflows?"+tc.query)
			assert.Equal(t, http.StatusBadRequest, status, tc.query)
			assert.Contains(t, body, tc.reason, tc.query)
			assert.NotContains(t, body, "<script>alert", tc.query)
			assert.NotContains(t, body, "<img", tc.query)
		}
	})

	t.Run("an unknown run is a 404", func(t *testing.T) {
		for path, reason := range map[string]string{
			"/workflows/runs/no-such-run":                "no workflow run &#34;no-such-run&#34;",
			"/workflows/runs/%3Cscript%3Ealert(1)%3C":    "No workflow run &lt;script&gt;alert(1)&lt;",
			"/workflows/runs/" + strings.Repeat("r", 65): "at most 64 characters",
		} {
			status, body := get(t, viewer, b.url+path)
			assert.Equal(t, http.StatusNotFound, status, path)
			assert.Contains(t, body, reason, path)
			assert.NotContains(t, body, "<script>alert", path)
		}
		status, body := get(t, viewer, b.url+"/workflows/runs/day-2026-11-26?color=red")
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Contains(t, body, "color: is not a filter of this page")
	})

	page := "/workflows/runs/day-2026-11-26"
	t.Run("the run's page", func(t *testing.T) {
		status, body := get(t, operator, b.url+page)
		require.Equal(t, http.StatusOK, status, body)
		// The header and the input.
		assert.True(t, containsAll(body, "Run <code>day-2026-11-26</code>", `href="/workflows?workflow=invoices"`,
			"charge the day&#39;s invoices", "&#34;day&#34;: &#34;2026-11-26&#34;"), body)
		// The graph: five boxes, four layers of arrows, the fan-out with failed elements marked.
		assert.Contains(t, body, `<svg class="wfgraph"`)
		assert.Contains(t, body, `data-steps="5" data-edges="5"`)
		assert.Regexp(t, `class="node g-succeeded has-failed fanout" data-step="charge"`, body)
		assert.Regexp(t, `class="node g-succeeded fanout" data-step="render"`, body)
		assert.Contains(t, body, `<tspan class="c-succeeded">0 succeeded</tspan> · <tspan class="c-failed">2 failed</tspan>`)
		assert.Contains(t, body, `<tspan class="c-succeeded">3 succeeded</tspan> · <tspan class="c-failed">0 failed</tspan>`)
		assert.Contains(t, body, ">on failure</text>")
		assert.Contains(t, body, ">always</text>")
		assert.Regexp(t, `class="edge e-on_failure" d="M[^"]+" marker-end="url\(#wf-arrow-fail\)" data-from="charge" data-to="page"`, body)
		// The steps, with their jobs linked.
		assert.Contains(t, body, `<tr id="step-page" data-step="page" data-status="succeeded">`)
		assert.Contains(t, body, `href="/jobs/wf:day-2026-11-26:list"`)
		// How long each ended step took: a duration, not the placeholder.
		took := regexp.MustCompile(`(?s)<tr id="step-list" .*?</td>\s*<td class="num">([^<]*)</td>`).FindStringSubmatch(body)
		require.Len(t, took, 2, body)
		assert.Regexp(t, `^[0-9]`, took[1], "the list step's duration")
		// The failed elements.
		rows := regexp.MustCompile(`<tr data-step="charge" data-index="(\d)">`).FindAllStringSubmatch(body, -1)
		require.Len(t, rows, 2, body)
		assert.True(t, containsAll(body, "invoice inv-1: card declined", "invoice inv-2: card declined",
			`{&#34;id&#34;:&#34;inv-2&#34;}`, `href="/jobs/wf:day-2026-11-26:charge:1"`), body)
		// Retry failed for an ended run with failures; no cancel.
		assert.Contains(t, body, `id="retry-failed"`)
		assert.NotContains(t, body, `id="cancel-run"`)

		_, body = get(t, viewer, b.url+page)
		assert.Contains(t, body, `id="failed"`, "the viewer reads the failures")
		assert.NotContains(t, body, `action="/actions/workflow/`, "no action forms for the viewer")
	})

	t.Run("retry failed needs the operator role and the CSRF token", func(t *testing.T) {
		status, body := post(t, viewer, b.url, page, "/actions/workflow/retry-failed", url.Values{"run_id": {"day-2026-11-26"}})
		assert.Equal(t, http.StatusForbidden, status)
		assert.Contains(t, body, "operator role")
		res, err := operator.PostForm(b.url+"/actions/workflow/retry-failed", url.Values{"run_id": {"day-2026-11-26"}})
		require.NoError(t, err)
		_ = res.Body.Close()
		assert.Equal(t, http.StatusForbidden, res.StatusCode, "without the CSRF token")
		run, err := b.client.WorkflowRun(ctx, "day-2026-11-26")
		require.NoError(t, err)
		assert.Equal(t, 0, run.Round, "nothing was retried")

		status, body = post(t, operator, b.url, page, "/actions/workflow/retry-failed", url.Values{"run_id": {"<bad>"}})
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Contains(t, body, "run_id: invalid run id")
		status, _ = post(t, operator, b.url, page, "/actions/workflow/rerun", url.Values{"run_id": {"day-2026-11-26"}})
		assert.Equal(t, http.StatusNotFound, status)
	})

	t.Run("retry failed runs the failed elements again, recorded", func(t *testing.T) {
		status, _ := post(t, operator, b.url, page, "/actions/workflow/retry-failed", url.Values{"run_id": {"day-2026-11-26"}})
		require.Equal(t, http.StatusSeeOther, status)
		run, err := b.client.WaitWorkflowRun(ctx, "day-2026-11-26")
		require.NoError(t, err)
		assert.Equal(t, 1, run.Round)
		assert.Equal(t, jetfleet.WorkflowFailed, run.Status, "the fail kind fails again")
		status, body := get(t, operator, b.url+page)
		require.Equal(t, http.StatusOK, status)
		assert.True(t, containsAll(body, "round 1", `href="/jobs/wf:day-2026-11-26:charge:0~1"`,
			`<span class="badge s-action">retry-failed</span> by <strong>ada</strong>`, "workflow run day-2026-11-26 of workflow invoices: round 1"), body)
	})

	t.Run("cancel a running run", func(t *testing.T) {
		_, err := b.client.RunWorkflow(ctx, "slow", nil, jetfleet.RunID("slow-1"))
		require.NoError(t, err)
		status, body := get(t, operator, b.url+"/workflows/runs/slow-1")
		require.Equal(t, http.StatusOK, status, body)
		assert.Contains(t, body, `id="cancel-run"`)
		assert.NotContains(t, body, `id="retry-failed"`)
		status, _ = post(t, viewer, b.url, "/workflows/runs/slow-1", "/actions/workflow/cancel", url.Values{"run_id": {"slow-1"}})
		assert.Equal(t, http.StatusForbidden, status)
		status, _ = post(t, operator, b.url, "/workflows/runs/slow-1", "/actions/workflow/cancel", url.Values{"run_id": {"slow-1"}})
		require.Equal(t, http.StatusSeeOther, status)
		run, err := b.client.WaitWorkflowRun(ctx, "slow-1")
		require.NoError(t, err)
		assert.Equal(t, jetfleet.WorkflowCancelled, run.Status)
		_, body = get(t, operator, b.url+"/workflows/runs/slow-1")
		assert.Contains(t, body, `<span class="badge s-action">cancel</span> by <strong>ada</strong>`)
		assert.NotContains(t, body, `id="cancel-run"`)
		// A second cancel (a forged form) is refused by the supervisor: the failure is shown and recorded.
		status, _ = post(t, operator, b.url, "/workflows/runs/slow-1", "/actions/workflow/cancel", url.Values{"run_id": {"slow-1"}})
		require.Equal(t, http.StatusSeeOther, status)
		_, body = get(t, operator, b.url+"/workflows/runs/slow-1")
		assert.Contains(t, body, "cancel of run slow-1 failed")
		assert.Contains(t, body, "cancel</span> by <strong>ada</strong> — failed")
	})
}
