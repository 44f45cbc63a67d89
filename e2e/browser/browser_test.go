package browser

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

type echoArgs struct {
	Hello string `json:"hello"`
}

func (echoArgs) Kind() string { return "echo" }

type sleepArgs struct {
	Duration string `json:"duration"`
}

func (sleepArgs) Kind() string { return "sleep" }

type reportArgs struct {
	Day string `json:"day"`
}

func (reportArgs) Kind() string  { return "report" }
func (reportArgs) Queue() string { return "reports" }

type flakyArgs struct {
	Order int `json:"order"`
}

func (flakyArgs) Kind() string  { return "flaky" }
func (flakyArgs) Queue() string { return "reports" }

// billingWorkflow is a month-end billing run: list the invoices, render
// each one's PDF and charge each one's card (fan-outs over the run's
// input), then send the receipts, write the ledger report in any case and
// tell finance when a charge failed.
const billingWorkflow = `{"name": "month-end-billing", "description": "render and charge the month's invoices, then report to finance",
  "steps": [
    {"name": "list-invoices", "kind": "echo", "input": {"month": "{{input.month}}"}},
    {"name": "render-pdf", "kind": "echo", "depends_on": ["list-invoices"], "for_each": "{{input.invoices}}",
     "input": {"invoice": "{{item.id}}"}},
    {"name": "charge", "kind": "charge-invoice", "queue": "reports", "depends_on": ["list-invoices"], "for_each": "{{input.invoices}}",
     "parallelism": 2, "input": {"invoice": "{{item.id}}", "customer": "{{item.customer}}", "amount": "{{item.amount}}"}},
    {"name": "send-receipts", "kind": "echo", "depends_on": ["charge"], "input": {"charged": "{{steps.charge.succeeded}}"}},
    {"name": "ledger-report", "kind": "report", "queue": "reports", "depends_on": ["render-pdf", "charge"], "when": "always",
     "input": {"day": "{{input.month}}"}},
    {"name": "notify-finance", "kind": "echo", "depends_on": ["charge"], "when": "on_failure",
     "input": {"declined": "{{steps.charge.failed}}"}}]}`

var billingInput = map[string]any{"month": "2026-11", "invoices": []map[string]any{
	{"id": "INV-2026-11-0041", "customer": "Acme Corp", "amount": 1250.00},
	{"id": "INV-2026-11-0042", "customer": "Globex Corporation", "amount": 980.50},
	{"id": "INV-2026-11-0043", "customer": "Umbrella Health", "amount": 4300.00},
	{"id": "INV-2026-11-0044", "customer": "Initech", "amount": 310.25},
	{"id": "INV-2026-11-0045", "customer": "Stark Industries", "amount": 15999.99},
}}

// TestDashboardInABrowser is issue 18's acceptance in a real Chromium: the
// overview shows the dev agent; a schedule added through the API appears
// without a reload and its runs stream in; pausing it from the page pauses
// it; a dead letter replayed from the page runs and succeeds; a running
// sleep job is cancelled from the page; a trend chart has points after a
// few runs and a kind made slow is marked degrading; a workflow run's page
// draws its graph and lists its failed elements, and retry failed from the
// page runs them again and follows the run to its end; with credentials, an
// anonymous request is refused and the read-only role cannot act. It saves
// a screenshot of every view on the way.
func TestDashboardInABrowser(t *testing.T) {
	st := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Something of everything for the views.
	_, err := st.client.AddSchedule(ctx, &jetfleet.Schedule{ID: "nightly-report", Description: "the sales report",
		Spec: jetfleet.Spec{Cron: "30 2 * * *", Zone: "Europe/Berlin"}, Target: jetfleet.Target{Queue: "reports", Kind: "report"},
		Policy: jetfleet.Policy{Overlap: jetfleet.OverlapSkip}})
	must(t, err)
	_, err = st.client.AddSchedule(ctx, &jetfleet.Schedule{ID: "hourly-cleanup", Spec: jetfleet.Spec{Cron: "0 * * * *"},
		Target: jetfleet.Target{Queue: "default", Kind: "echo"}})
	must(t, err)
	for i := range 5 {
		_, err := st.client.Enqueue(ctx, echoArgs{Hello: fmt.Sprint("world ", i)})
		must(t, err)
	}

	t.Run("overview shows the dev agent", func(t *testing.T) {
		st.t = t
		st.do(chromedp.Navigate(st.url+"/"), chromedp.WaitVisible(`main h1`),
			until(`document.querySelector('main').innerText.includes('dev-agent')`),
			until(`document.querySelector('main').innerText.includes('reports-agent')`))
	})

	t.Run("a schedule added through the API appears without a reload and its runs stream in", func(t *testing.T) {
		st.t = t
		st.do(chromedp.Navigate(st.url+"/schedules"), chromedp.WaitVisible(`#schedules`),
			until(`document.getElementById('main').dataset.live_connected === 'yes'`))
		st.do(js(`window.__sameDocument = true`))
		_, err := st.client.AddSchedule(ctx, &jetfleet.Schedule{ID: "every-second", Description: "a heartbeat job",
			Spec: jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(time.Second)}}, Target: jetfleet.Target{Queue: "default", Kind: "echo"}})
		must(t, err)
		st.do(until(`!!document.querySelector('tr[data-schedule="every-second"]')`), until(`window.__sameDocument === true`))
		st.do(chromedp.Navigate(st.url+"/schedules/every-second"), chromedp.WaitVisible(`#runs-h`),
			until(`document.getElementById('main').dataset.live_connected === 'yes'`))
		st.do(js(`window.__sameDocument = true`))
		st.do(until(`document.querySelectorAll('tr.r-run .s-succeeded').length >= 3`), until(`window.__sameDocument === true`))
	})

	t.Run("pausing from the page pauses the schedule", func(t *testing.T) {
		st.t = t
		st.doOnLivePage(chromedp.Navigate(st.url+"/schedules/every-second"), chromedp.WaitVisible(`#pause`),
			chromedp.SendKeys(`#pause-note`, "deploy in progress"), chromedp.Click(`#pause`), chromedp.WaitVisible(`#resume`))
		info, err := st.client.GetSchedule(ctx, "every-second")
		must(t, err)
		if !info.Schedule.Paused || !strings.Contains(info.Schedule.Note, "deploy in progress") {
			t.Fatalf("schedule after the pause: paused %v, note %q", info.Schedule.Paused, info.Schedule.Note)
		}
		st.do(until(`document.querySelector('main').innerText.includes('pause by anonymous@')`))
		st.shot("schedule")
	})

	t.Run("a dead letter replayed from the page runs and succeeds", func(t *testing.T) {
		st.t = t
		st.broken.Store(true)
		res, err := st.client.Enqueue(ctx, flakyArgs{Order: 42})
		must(t, err)
		first, err := st.client.Wait(ctx, res.JobID)
		if err == nil || first == nil || first.State != protocol.EventDead {
			t.Fatalf("the flaky job while broken: %+v, %v; want dead", first, err)
		}
		st.broken.Store(false) // the upstream is fixed: replay
		st.do(chromedp.Navigate(st.url+"/dlq?kind=flaky"), chromedp.WaitVisible(`#letters tr[data-job="`+res.JobID+`"]`))
		st.shot("dlq")
		st.do(chromedp.Click(`#letters tr[data-job="`+res.JobID+`"] th a`), chromedp.WaitVisible(`#replay`))
		st.shot("dlq-letter")
		st.do(chromedp.Click(`#replay`), chromedp.WaitVisible(`.flash`))
		// The job keeps its id: until the replay's events arrive, its latest
		// event is still the first run's dead one, which Wait returns at once
		// (with the job's error). Wait for the replay's outcome: an event
		// stored after that one.
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		var info *jetfleet.JobInfo
		for {
			info, err = st.client.Wait(wctx, res.JobID)
			stillFirst := info != nil && info.Event.GetStreamSequence() == first.Event.GetStreamSequence()
			if (!stillFirst && info != nil) || wctx.Err() != nil {
				break
			}
			select { // still the first run's end: look again shortly
			case <-wctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
		if err != nil || info.State != protocol.EventSucceeded {
			t.Fatalf("replayed job: %+v, %v", info, err)
		}
		st.do(chromedp.Navigate(st.url+"/jobs/"+url.PathEscape(res.JobID)),
			until(`document.querySelector('main').innerText.includes('replay by anonymous@')`),
			until(`document.querySelectorAll('ol.timeline .s-succeeded').length >= 1`),
			until(`!!document.querySelector('svg.waterfall')`))
		st.shot("job")
	})

	t.Run("a running sleep job is cancelled from the page", func(t *testing.T) {
		st.t = t
		res, err := st.client.Enqueue(ctx, sleepArgs{Duration: "60s"})
		must(t, err)
		row := `tr[data-job="` + res.JobID + `"]`
		st.do(chromedp.Navigate(st.url+"/running"), until(`!!document.querySelector('`+row+`')`),
			until(`!!document.querySelector('`+row+` progress') && document.querySelector('`+row+`').innerText.includes('slept ')`))
		st.shot("running")
		st.doOnLivePage(chromedp.Navigate(st.url+"/running"), until(`!!document.querySelector('`+row+`')`),
			clickNow(row+` button`), chromedp.WaitVisible(`.flash`))
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		info, err := st.client.Wait(wctx, res.JobID)
		if info == nil || info.State != protocol.EventCancelled {
			t.Fatalf("cancelled job: %+v, %v", info, err)
		}
	})

	t.Run("trend charts have points and a kind made slow is marked degrading", func(t *testing.T) {
		st.t = t
		base := time.Now().Add(-2 * time.Hour)
		for i := range 30 { // the baseline: runs of 10ms two hours ago, as an agent reported them
			st.publishPastRun(i, "reports", "report", base.Add(time.Duration(i)*time.Minute), 10*time.Millisecond)
		}
		st.do(chromedp.Navigate(st.url+"/kinds/default/echo"),
			until(`Number(document.querySelector('figure[data-chart=runs] svg').dataset.points) >= 1`))
		st.shot("kind-echo")
		st.slow.Store(true)
		for i := range 4 {
			res, err := st.client.Enqueue(ctx, reportArgs{Day: fmt.Sprint("2026-11-", 20+i)})
			must(t, err)
			_, err = st.client.Wait(ctx, res.JobID)
			must(t, err)
		}
		st.do(chromedp.Navigate(st.url+"/kinds/reports/report"), chromedp.WaitVisible(`#trends-h`),
			until(`document.querySelector('main').innerText.includes('Degrading')`))
		st.shot("kind")
		st.do(chromedp.Navigate(st.url+"/kinds"), chromedp.WaitVisible(`main table`))
		st.shot("kinds")
	})

	t.Run("a workflow run's graph and failed elements, and retry failed from the page", func(t *testing.T) {
		st.t = t
		st.declined.Store(true)
		_, err := st.client.AddWorkflowDocument(ctx, []byte(billingWorkflow))
		must(t, err)
		_, err = st.client.AddWorkflowDocument(ctx, []byte(`{"name": "nightly-export", "description": "export the day's orders to the warehouse",
			"steps": [{"name": "list", "kind": "echo"}, {"name": "export", "kind": "echo", "depends_on": ["list"], "for_each": [1, 2, 3]}]}`))
		must(t, err)
		for _, day := range []string{"2026-11-24", "2026-11-25"} {
			_, err := st.client.RunWorkflow(ctx, "nightly-export", nil, jetfleet.RunID("export-"+day))
			must(t, err)
			_, err = st.client.WaitWorkflowRun(ctx, "export-"+day)
			must(t, err)
		}
		_, err = st.client.RunWorkflow(ctx, "month-end-billing", billingInput, jetfleet.RunID("billing-2026-11"))
		must(t, err)
		run, err := st.client.WaitWorkflowRun(ctx, "billing-2026-11")
		must(t, err)
		if run.Status != jetfleet.WorkflowFailed || run.FailedElements != 2 {
			t.Fatalf("the billing run: %s with %d failed elements, want failed with 2", run.Status, run.FailedElements)
		}

		st.do(chromedp.Navigate(st.url+"/workflows"), chromedp.WaitVisible(`#runs tr[data-run="billing-2026-11"][data-status="failed"]`),
			until(`!!document.querySelector('#workflows tr[data-workflow="month-end-billing"]')`),
			until(`document.querySelectorAll('#runs tr[data-status="succeeded"]').length === 2`))
		st.shot("workflows")
		// The run's link, followed by its address: the list updates live, so
		// the row may be drawn anew between finding the link and clicking it.
		link := eval[string](st, `document.querySelector('#runs tr[data-run="billing-2026-11"] th a').getAttribute('href')`)
		if link != "/workflows/runs/billing-2026-11" {
			t.Fatalf("the run's row links to %q", link)
		}
		st.do(chromedp.Navigate(st.url+link), chromedp.WaitVisible(`svg.wfgraph`))
		if n := eval[float64](st, `document.querySelectorAll('svg.wfgraph a.node').length`); n != 6 {
			t.Errorf("the graph has %v boxes, want the 6 steps", n)
		}
		if n := eval[float64](st, `document.querySelectorAll('svg.wfgraph path.edge').length`); n != 6 {
			t.Errorf("the graph has %v arrows, want 6", n)
		}
		charge := eval[string](st, `document.querySelector('svg.wfgraph a.node[data-step="charge"]').textContent`)
		if !strings.Contains(charge, "3 succeeded · 2 failed · 0 running") {
			t.Errorf("the charge box says %q, want its counts", charge)
		}
		if !eval[bool](st, `document.querySelector('svg.wfgraph a.node[data-step="charge"]').classList.contains('has-failed')`) {
			t.Error("the charge box is not marked as having failed elements")
		}
		// The failed elements: the two declined customers, each with its job.
		failed := eval[string](st, `document.getElementById('failed').innerText`)
		for _, want := range []string{"Globex Corporation", "Initech", "card declined by the issuer", "wf:billing-2026-11:charge:1"} {
			if !strings.Contains(failed, want) {
				t.Errorf("the failed elements do not show %q:\n%s", want, failed)
			}
		}
		st.shot("workflow-run")

		// The issuer lets the cards through again: retry the failed elements.
		st.declined.Store(false)
		st.doOnLivePage(chromedp.Navigate(st.url+"/workflows/runs/billing-2026-11"), chromedp.WaitVisible(`#retry-failed`),
			clickNow(`#retry-failed`), chromedp.WaitVisible(`.flash`))
		st.do(until(`document.querySelector('main h1').innerText.includes('round 1')`),
			until(`document.getElementById('main').dataset.live_connected === 'yes'`))
		run, err = st.client.WaitWorkflowRun(ctx, "billing-2026-11")
		must(t, err)
		if run.Round != 1 || run.Status != jetfleet.WorkflowSucceeded || run.FailedElements != 0 {
			t.Fatalf("after retry failed: round %d, %s, %d failed elements; want round 1, succeeded, none", run.Round, run.Status, run.FailedElements)
		}
		// The page follows the run to its end without a reload.
		st.do(until(`!!document.querySelector('main h1 .s-succeeded')`),
			until(`document.querySelector('svg.wfgraph a.node[data-step="charge"]').textContent.includes('5 succeeded · 0 failed')`),
			until(`!document.getElementById('failed')`),
			until(`document.querySelector('main').innerText.includes('retry-failed by anonymous@')`))
	})

	t.Run("screenshots of the other views", func(t *testing.T) {
		st.t = t
		for _, v := range []struct{ name, path, ready string }{
			{"overview", "/", `main .tiles`},
			{"schedules", "/schedules", `#schedules`},
			{"jobs", "/jobs?state=succeeded", `#jobs`},
			{"agents", "/agents", `main table`},
		} {
			st.do(chromedp.Navigate(st.url+v.path), chromedp.WaitVisible(v.ready))
			st.shot(v.name)
		}
		st.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile),
			chromedp.Navigate(st.url+"/"), chromedp.WaitVisible(`main .tiles`))
		st.shot("overview-phone")
		if w := eval[float64](st, `document.documentElement.scrollWidth`); w > 400 {
			t.Errorf("the overview is %.0f px wide on a 390 px phone: it should not scroll sideways", w)
		}
		st.do(chromedp.EmulateViewport(1280, 900))
	})

	t.Run("keyboard reaches the navigation and the actions", func(t *testing.T) {
		st.t = t
		st.do(chromedp.Navigate(st.url+"/schedules/nightly-report"), chromedp.WaitVisible(`#trigger`))
		// Tab through the page: the skip link, the sections, the job lookup, then the actions.
		seen := map[string]bool{}
		for range 40 {
			st.do(chromedp.KeyEvent("\t"))
			seen[eval[string](st, `(document.activeElement.id || document.activeElement.textContent || '').trim()`)] = true
		}
		for _, want := range []string{"Skip to content", "Overview", "Dead letters", "lookup-id", "trigger"} {
			if !seen[want] {
				t.Errorf("Tab never reached %q (reached %v)", want, seen)
			}
		}
	})

	t.Run("with credentials: anonymous refused, the read-only role cannot act", func(t *testing.T) {
		st.t = t
		dir := t.TempDir()
		users := filepath.Join(dir, "users")
		must(t, os.WriteFile(users, []byte("ada:ada-secret:operator\nvic:vic-secret:viewer\n"), 0o600))
		d, err := dashboard.New(dashboard.Config{Listen: "127.0.0.1:0", Auth: dashboard.AuthConfig{UsersFile: users}},
			natstest.ConnectURL(t, st.fleet.ClientURL()), dashboard.Options{})
		must(t, err)
		must(t, d.Start(ctx))
		t.Cleanup(func() {
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer scancel()
			_ = d.Stop(sctx)
		})
		secure := d.URL()
		st.do(chromedp.Navigate(secure+"/schedules/nightly-report"), chromedp.WaitVisible(`input[name=password]`))
		if text := eval[string](st, `document.querySelector('main').innerText`); strings.Contains(text, "nightly-report") {
			t.Fatalf("an anonymous visitor sees the schedule:\n%s", text)
		}
		st.shot("login")
		status := eval[float64](st, `fetch('/agents', {credentials: 'omit'}).then(r => r.status)`)
		if status != 401 {
			t.Errorf("anonymous GET /agents: %v, want 401", status)
		}
		st.do(chromedp.SendKeys(`input[name=user]`, "vic"), chromedp.SendKeys(`input[name=password]`, "vic-secret"),
			chromedp.Submit(`input[name=password]`), chromedp.WaitVisible(`#next-h`))
		if n := eval[float64](st, `document.querySelectorAll('#pause, #resume, #trigger').length`); n != 0 {
			t.Errorf("the viewer sees %v action buttons", n)
		}
		// The viewer forges the operator's form: refused.
		status = eval[float64](st, `(() => { const f = new FormData(); f.append('id', 'nightly-report');
			f.append('csrf', document.querySelector('input[name=csrf]').value);
			return fetch('/actions/schedule/pause', {method: 'POST', body: new URLSearchParams(f)}).then(r => r.status); })()`)
		if status != 403 {
			t.Errorf("viewer POST pause: %v, want 403", status)
		}
		info, err := st.client.GetSchedule(ctx, "nightly-report")
		must(t, err)
		if info.Schedule.Paused {
			t.Error("the viewer paused the schedule")
		}
	})
}
