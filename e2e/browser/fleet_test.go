package browser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// stack is the fleet under test: the dev fleet (embedded NATS, scheduler,
// supervisor, the dev agent and the dashboard, as `jetfleet dev` runs
// them), an agent of this test on queue reports, a Jaeger query API
// serving the fleet's own spans, and a Chromium.
type stack struct {
	t      *testing.T
	fleet  *devfleet.Fleet
	nc     *nats.Conn
	client *jetfleet.Client
	url    string
	// slow makes kind report take 400ms instead of 10ms; broken makes kind
	// flaky fail for good; declined makes kind charge-invoice fail for good
	// for the customers whose cards the issuer declines.
	slow, broken, declined atomic.Bool
	browser                context.Context
	shots                  string
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// chromium finds Debian's chromium; its absence fails the test.
func chromium(t testing.TB) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no Chromium: the browser tests need Debian's chromium (apt-get install -y chromium; .ci/run installs it)")
	return ""
}

func newStack(t *testing.T) *stack {
	st := &stack{t: t}
	spans := tracetest.NewInMemoryExporter()
	jaeger := httptest.NewServer(jaegerAPI(spans))
	t.Cleanup(jaeger.Close)

	cfg := devfleet.DefaultConfig()
	cfg.Embedded.Port, cfg.Embedded.DataDir, cfg.Telemetry.HTTPAddr = -1, t.TempDir(), ""
	cfg.Telemetry.LogLevel = "warn"
	cfg.Dashboard.Listen = "127.0.0.1:0"
	cfg.Dashboard.LiveInterval = 200 * time.Millisecond
	cfg.Dashboard.Jaeger.QueryURL = jaeger.URL
	cfg.Agent.HeartbeatInterval = 250 * time.Millisecond
	// Trends judged on every batch, with few runs: the test's baseline is
	// 30 runs two hours ago, its recent window the runs of the last 5 minutes.
	cfg.Supervisor.Trends.RecentWindow = 5 * time.Minute
	cfg.Supervisor.Trends.BaselineWindow = 6 * time.Hour
	cfg.Supervisor.Trends.MinRecentRuns = 3
	cfg.Supervisor.Trends.MinBaselineRuns = 10
	cfg.Supervisor.Trends.EvaluateInterval = time.Millisecond
	cfg.Supervisor.UnroutableAfter = 500 * time.Millisecond
	cfg.ApplyDefaults()
	fleet, err := devfleet.New(cfg, devfleet.Options{SpanExporter: spans})
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must(t, fleet.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = fleet.Stop(ctx)
	})
	st.fleet, st.url = fleet, fleet.DashboardURL()
	st.nc = natstest.ConnectURL(t, fleet.ClientURL())
	// This test's client and agent trace into the same exporter as the fleet.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	st.client = jetfleet.NewClient(st.nc, jetfleet.WithTracerProvider(tp))

	// The reports agent: kinds report (fast or slow) and flaky (broken or not).
	a, err := agent.New(st.nc, agent.Config{ID: "reports-agent", Queues: []string{"reports"}, HeartbeatInterval: 250 * time.Millisecond},
		agent.WithTracerProvider(tp))
	must(t, err)
	must(t, a.Register("report", func(ctx context.Context, job *agent.Job) error {
		d := 10 * time.Millisecond
		if st.slow.Load() {
			d = 400 * time.Millisecond
		}
		select {
		case <-time.After(d): // the work itself takes this long
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, agent.KindOptions{}))
	must(t, a.Register("flaky", func(ctx context.Context, job *agent.Job) error {
		if st.broken.Load() {
			return agent.NonRetryable(errors.New("the upstream API answered 500 Internal Server Error"))
		}
		return nil
	}, agent.KindOptions{}))
	// charge-invoice: a workflow's fan-out element (TestDashboardInABrowser's
	// month-end billing); it fails at once for two customers while declined.
	must(t, a.Register("charge-invoice", func(ctx context.Context, job *agent.Job) error {
		var inv struct {
			Invoice  string  `json:"invoice"`
			Customer string  `json:"customer"`
			Amount   float64 `json:"amount"`
		}
		if err := json.Unmarshal(job.Payload, &inv); err != nil {
			return agent.Malformed(err)
		}
		if st.declined.Load() && (inv.Customer == "Globex Corporation" || inv.Customer == "Initech") {
			return agent.NonRetryable(fmt.Errorf("card declined by the issuer (do_not_honor) for %s, invoice %s", inv.Customer, inv.Invoice))
		}
		return agent.RecordResult(ctx, map[string]any{"receipt": "rcpt-" + inv.Invoice, "charged": inv.Amount})
	}, agent.KindOptions{}))
	must(t, a.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Stop(ctx)
	})

	// Chromium.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-dev-shm-usage", true))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	st.browser = bctx
	st.shots = os.Getenv("JETFLEET_SCREENSHOTS")
	if st.shots == "" {
		st.shots = t.TempDir()
	}
	must(t, os.MkdirAll(st.shots, 0o755))
	return st
}

// do runs browser steps, bounded.
func (st *stack) do(steps ...chromedp.Action[chromedp.Void]) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(st.browser, 45*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		html, _ := chromedp.Run(st.browser, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ""`))
		st.t.Fatalf("browser: %v\npage text:\n%s", err, html)
	}
}

// doOnLivePage runs steps that act on a page whose main part live updates
// replace: a node found by one step can be gone when the next acts on it
// ("Could not find node with given id"), as a real page changes under a
// user's pointer. Such a run starts again from its first step, which must
// be the navigation; any other error fails the test.
func (st *stack) doOnLivePage(steps ...chromedp.Action[chromedp.Void]) {
	st.t.Helper()
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(st.browser, 45*time.Second)
		err := chromedp.Do(ctx, steps...)
		cancel()
		if err == nil {
			return
		}
		if try < 5 && strings.Contains(err.Error(), "Could not find node with given id") {
			st.t.Logf("the page changed under a step (try %d): %v; again from the navigation", try, err)
			continue
		}
		html, _ := chromedp.Run(st.browser, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ""`))
		st.t.Fatalf("browser: %v\npage text:\n%s", err, html)
	}
}

// eval returns the value of a JavaScript expression on the page.
func eval[T any](st *stack, expr string) T {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(st.browser, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	must(st.t, err)
	return v
}

// until waits for a JavaScript expression to be true on the page as it is
// (no reload).
// clickNow clicks the node sel finds at this instant, from the page's own
// script, once sel finds one. chromedp.Click presses and releases the
// pointer in two steps; a live update that replaces the node between them
// (the refresh every page makes once its live connection opens) swallows
// the click without an error — seen as a retry-failed that never left the
// page. A script's click cannot be split by the page's own update.
func clickNow(sel string) chromedp.Action[chromedp.Void] {
	return until(`(function () { var n = document.querySelector(` + strconv.Quote(sel) + `); if (!n) return false; n.click(); return true; })()`)
}

func until(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(40*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))(ctx, t)
		if err != nil {
			return chromedp.Void{}, fmt.Errorf("waiting for %s: %w", expr, err)
		}
		return chromedp.Void{}, nil
	}
}

// shot saves a full-page screenshot as <name>.png.
func (st *stack) shot(name string) {
	st.t.Helper()
	ctx, cancel := context.WithTimeout(st.browser, 30*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	must(st.t, err)
	must(st.t, os.WriteFile(filepath.Join(st.shots, name+".png"), buf, 0o644))
}

// publishPastRun stores a finished run's event as an agent does, with a
// time in the past: the baseline of a trend.
func (st *stack) publishPastRun(n int, queue, kind string, at time.Time, d time.Duration) {
	ev := &jetfleetpb.JobEvent{Type: protocol.EventSucceeded, JobId: fmt.Sprintf("past-%s-%d", kind, n), Queue: queue, Kind: kind,
		Attempt: 1, AgentId: "reports-agent", Time: timestamppb.New(at), Duration: durationpb.New(d), StreamSequence: uint64(1_000_000 + n),
		Delivered: 1, StartedAt: timestamppb.New(at.Add(-d))}
	data, err := protocol.Marshal(ev)
	must(st.t, err)
	js, err := st.nc.JetStream()
	must(st.t, err)
	_, err = js.PublishMsg(&nats.Msg{Subject: protocol.JobEventSubject(queue, kind, ev.GetType(), ev.GetJobId()), Data: data})
	must(st.t, err)
}

// jaegerAPI serves GET /api/traces/<id> as Jaeger's query API does, from
// the spans the fleet exported.
func jaegerAPI(spans *tracetest.InMemoryExporter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutPrefix(r.URL.Path, "/api/traces/")
		if !ok {
			http.NotFound(w, r)
			return
		}
		type ref struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		}
		type tag struct {
			Key   string `json:"key"`
			Type  string `json:"type"`
			Value any    `json:"value"`
		}
		type span struct {
			TraceID       string `json:"traceID"`
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []ref  `json:"references"`
			StartTime     int64  `json:"startTime"`
			Duration      int64  `json:"duration"`
			ProcessID     string `json:"processID"`
			Tags          []tag  `json:"tags"`
		}
		var out []span
		for _, s := range spans.GetSpans() {
			if s.SpanContext.TraceID().String() != id {
				continue
			}
			sp := span{TraceID: id, SpanID: s.SpanContext.SpanID().String(), OperationName: s.Name,
				StartTime: s.StartTime.UnixMicro(), Duration: s.EndTime.Sub(s.StartTime).Microseconds(), ProcessID: "p1"}
			if s.Parent.IsValid() {
				sp.References = []ref{{"CHILD_OF", id, s.Parent.SpanID().String()}}
			}
			for _, a := range s.Attributes {
				sp.Tags = append(sp.Tags, tag{string(a.Key), "string", a.Value.String()})
			}
			out = append(out, sp)
		}
		if len(out) == 0 {
			http.Error(w, `{"errors":[{"code":404,"msg":"trace not found"}]}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"data": []any{map[string]any{"traceID": id, "spans": out,
			"processes": map[string]any{"p1": map[string]string{"serviceName": "jetfleet-dev"}}}}})
	})
}

// js runs a JavaScript statement on the page.
func js(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[any](expr)(ctx, t)
		return chromedp.Void{}, err
	}
}
