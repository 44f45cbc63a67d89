package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
)

// TestMain runs the tests and benchmarks, stops the benchmarks' fleet, and
// fails on goroutines left over.
func TestMain(m *testing.M) {
	code := m.Run()
	stopBenchFleet()
	if code == 0 {
		if err := natstest.FindLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// bundle is a whole dev fleet in this process (embedded NATS, scheduler,
// supervisor, the dev agent with kinds echo, sleep and fail) and a
// dashboard on a free loopback port.
type bundle struct {
	fleet  *devfleet.Fleet
	nc     *nats.Conn
	client *jetfleet.Client
	dash   *dashboard.Dashboard
	url    string
}

func setup(t testing.TB, cfg dashboard.Config, tune func(*devfleet.Config)) *bundle {
	t.Helper()
	fc := devfleet.DefaultConfig()
	fc.Embedded.Port, fc.Embedded.DataDir, fc.Telemetry.HTTPAddr = -1, t.TempDir(), ""
	fc.Dashboard.Listen = devfleet.DashboardOff
	fc.Agent.HeartbeatInterval = 250 * time.Millisecond
	if tune != nil {
		tune(fc)
	}
	fc.ApplyDefaults()
	fleet, err := devfleet.New(fc, devfleet.Options{Logger: fleettest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, fleet.Start(fleettest.Ctx(t, 60*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = fleet.Stop(ctx)
	})
	nc := natstest.ConnectURL(t, fleet.ClientURL())
	b := &bundle{fleet: fleet, nc: nc, client: jetfleet.NewClient(nc)}
	b.dash, b.url = startDashboard(t, fleet.ClientURL(), cfg)
	return b
}

// startDashboard starts a dashboard replica on its own connection.
func startDashboard(t testing.TB, natsURL string, cfg dashboard.Config) (*dashboard.Dashboard, string) {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.LiveInterval == 0 {
		cfg.LiveInterval = 100 * time.Millisecond
	}
	dnc := natstest.ConnectURL(t, natsURL)
	d, err := dashboard.New(cfg, dnc, dashboard.Options{Logger: fleettest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, d.Start(fleettest.Ctx(t, 30*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, d.Stop(ctx))
	})
	return d, d.URL()
}

// browser is an HTTP client with cookies that does not follow redirects.
func browser(t testing.TB) *http.Client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// get fetches a page as a browser would and returns its status and body.
func get(t testing.TB, c *http.Client, u string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, u, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/html")
	res, err := c.Do(req)
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// post submits a form with the CSRF token of page (fetched first).
func post(t testing.TB, c *http.Client, base, page, action string, form url.Values) (int, string) {
	t.Helper()
	_, body := get(t, c, base+page)
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(t, m, "no CSRF token on %s", page)
	form.Set("csrf", m[1])
	res, err := c.PostForm(base+action, form)
	require.NoError(t, err)
	defer func() { _ = res.Body.Close() }()
	out, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(out)
}

// The dev agent's demo kinds.
type failArgs struct {
	NonRetryable bool `json:"non_retryable,omitempty"`
}

func (failArgs) Kind() string { return "fail" }

func containsAll(body string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(body, p) {
			return false
		}
	}
	return true
}

func tempDir() (string, error) { return os.MkdirTemp("", "jetfleet-dashboard-bench-") }
