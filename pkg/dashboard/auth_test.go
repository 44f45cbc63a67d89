package dashboard_test

import (
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// TestNonLoopbackNeedsCredentials: the dashboard refuses to start on an
// address other machines reach unless credentials are configured, and
// names the key.
func TestNonLoopbackNeedsCredentials(t *testing.T) {
	t.Parallel()
	for _, listen := range []string{":8080", "0.0.0.0:8080", "192.0.2.10:8080", "[::]:8080"} {
		err := dashboard.Config{Listen: listen}.Validate("dashboard")
		require.Error(t, err, listen)
		assert.Contains(t, err.Error(), "dashboard.listen")
		assert.Contains(t, err.Error(), "without credentials")
	}
	for _, listen := range []string{"127.0.0.1:8080", "localhost:8080", "[::1]:8080", ""} {
		assert.NoError(t, dashboard.Config{Listen: listen}.Validate("dashboard"), listen)
	}
	assert.NoError(t, dashboard.Config{Listen: ":8080", Auth: dashboard.AuthConfig{Tokens: "0123456789abcdef0123:viewer"}}.Validate("dashboard"))
	err := dashboard.Config{Auth: dashboard.AuthConfig{Users: "ada:secret:admin"}}.Validate("dashboard")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dashboard.auth.users")
	err = dashboard.Config{Auth: dashboard.AuthConfig{UsersFile: "/nonexistent/users"}}.Validate("dashboard")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "dashboard.auth.users_file")
}

// TestCredentialsAndRoles: with credentials configured an anonymous
// request is refused; the viewer reads but cannot act; the operator acts,
// and the action is recorded (who, what, when) in the schedule's timeline;
// an action without the CSRF token is refused.
func TestCredentialsAndRoles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users := filepath.Join(dir, "users")
	require.NoError(t, os.WriteFile(users, []byte("# name:password:role\nada:ada-password:operator\nvic:vic-password:read-only\n"), 0o600))
	b := setup(t, dashboard.Config{Listen: "127.0.0.1:0", Auth: dashboard.AuthConfig{UsersFile: users,
		Tokens: "viewer-token-0123456789:viewer:grafana"}}, nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	_, err := b.client.AddSchedule(ctx, &jetfleet.Schedule{ID: "guarded", Spec: jetfleet.Spec{Cron: "@daily"},
		Target: jetfleet.Target{Queue: "default", Kind: "echo"}})
	require.NoError(t, err)

	anon := browser(t)
	for _, path := range []string{"/", "/schedules", "/jobs", "/dlq", "/agents", "/live?topics=overview"} {
		status, body := get(t, anon, b.url+path)
		assert.Equal(t, http.StatusUnauthorized, status, path)
		assert.NotContains(t, body, "dev-agent", path)
	}
	status, _ := get(t, anon, b.url+"/healthz")
	assert.Equal(t, http.StatusOK, status)
	res, err := anon.PostForm(b.url+"/actions/schedule/pause", url.Values{"id": {"guarded"}})
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode)

	// A bearer token reads.
	req, _ := http.NewRequest(http.MethodGet, b.url+"/agents", nil)
	req.Header.Set("Authorization", "Bearer viewer-token-0123456789")
	res, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)

	login := func(user, password string) *http.Client {
		c := browser(t)
		status, body := post(t, c, b.url, "/login", "/login", url.Values{"user": {user}, "password": {password}, "next": {"/"}})
		require.Equal(t, http.StatusSeeOther, status, body)
		return c
	}
	bad := browser(t)
	status, body := post(t, bad, b.url, "/login", "/login", url.Values{"user": {"ada"}, "password": {"wrong"}})
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Contains(t, body, "Wrong name, password or token")

	viewer := login("vic", "vic-password")
	status, body = get(t, viewer, b.url+"/schedules/guarded")
	require.Equal(t, http.StatusOK, status)
	assert.NotContains(t, body, `action="/actions/schedule/pause"`, "no action forms for the viewer")
	status, body = post(t, viewer, b.url, "/schedules/guarded", "/actions/schedule/pause", url.Values{"id": {"guarded"}, "note": {"viewer"}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Contains(t, body, "operator role")
	info, err := b.client.GetSchedule(ctx, "guarded")
	require.NoError(t, err)
	assert.False(t, info.Schedule.Paused, "the viewer did not pause it")

	operator := login("ada", "ada-password")
	// Without the CSRF token.
	res, err = operator.PostForm(b.url+"/actions/schedule/pause", url.Values{"id": {"guarded"}})
	require.NoError(t, err)
	_ = res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	status, _ = post(t, operator, b.url, "/schedules/guarded", "/actions/schedule/pause", url.Values{"id": {"guarded"}, "note": {"maintenance window"}})
	require.Equal(t, http.StatusSeeOther, status)
	info, err = b.client.GetSchedule(ctx, "guarded")
	require.NoError(t, err)
	assert.True(t, info.Schedule.Paused)
	assert.Contains(t, info.Schedule.Note, "maintenance window")
	timeline, err := b.client.ScheduleTimeline(ctx, "guarded", 10)
	require.NoError(t, err)
	var recorded bool
	for _, e := range timeline {
		if e.Audit != nil && e.Audit.Action == "pause" {
			recorded = true
			assert.Equal(t, "ada", e.Audit.Actor)
			assert.Equal(t, dashboard.RoleOperator, e.Audit.Role)
			assert.Equal(t, "ok", e.Audit.Outcome)
			assert.WithinDuration(t, time.Now(), e.Audit.Time, time.Minute)
		}
	}
	assert.True(t, recorded, "the pause is recorded in the schedule's timeline")
	status, body = get(t, operator, b.url+"/schedules/guarded")
	require.Equal(t, http.StatusOK, status)
	assert.Contains(t, body, "by ada")

	// A second replica with the same credentials accepts the session.
	_, url2 := startDashboard(t, b.fleet.ClientURL(), dashboard.Config{Auth: dashboard.AuthConfig{UsersFile: users,
		Tokens: "viewer-token-0123456789:viewer:grafana"}})
	u1, _ := url.Parse(b.url)
	u2, _ := url.Parse(url2)
	operator.Jar.SetCookies(u2, operator.Jar.Cookies(u1))
	status, _ = get(t, operator, url2+"/schedules")
	assert.Equal(t, http.StatusOK, status)
}
