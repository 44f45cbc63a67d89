package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// TestNATSPermissions runs config/nats/jetfleet.conf (the compose stack's
// server configuration, its users and their permissions) in-process, runs
// the scheduler, the supervisor and an agent on it exactly as their binaries
// do, each as its own NATS user with the compose stack's configuration files,
// and shows with real connections:
//
//   - the fleet works least-privileged: the agent (topology.verify_only)
//     waits for the scheduler and supervisor users to provision the topology,
//     then runs a job published by the client user, a job the scheduler
//     fires, and dead-letters a failing one, which the supervisor then purges
//     through its API; the supervisor pauses a schedule whose run failed
//     through the scheduler's API — all without a single permission violation
//     on the services' connections;
//   - the agent user is denied what an agent must never do: deleting,
//     creating, updating or purging streams, deleting messages, writing
//     schedules, their state or the leader leases, publishing jobs, calling
//     or impersonating the APIs — and nothing of it took effect;
//   - no user but admin can delete a stream; the scheduler cannot delete a
//     queue's consumer; the supervisor and the client reach schedules only
//     through the scheduler's API, and the client cannot delete a job or fake
//     a job event.
func TestNATSPermissions(t *testing.T) {
	root := repoRoot(t)
	passwords := devPasswords(t, root)
	for user, name := range passwordVars {
		t.Setenv(name, passwords[user]) // accounts.conf reads them from the environment
	}
	srv, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir(), SyncAlways: true,
		ConfigFile: filepath.Join(root, "config", "nats", "jetfleet.conf")})
	if err != nil {
		t.Fatal(err)
	}
	violations := &violationLog{}
	srv.SetLoggerV2(violations, false, false, false)
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	url := srv.ClientURL()
	connect := func(user string) (*nats.Conn, *asyncErrors) {
		errs := &asyncErrors{}
		nc, err := nats.Connect(url, nats.Name("probe-"+user), nats.UserInfo(user, passwords[user]),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs.add(err) }))
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc, errs
	}
	ctx := t.Context()
	admin, _ := connect("admin")
	adminJS, _ := jetstream.New(admin)

	// The agent starts first: it may not create the streams, so it waits for them.
	const agentID = "perm-agent"
	stopAgent := runService(t, root, url, "agent", passwords["agent"], agentServiceMain(), "agent.id="+agentID)
	eventually(t, 10*time.Second, 50*time.Millisecond, "agent connected, waiting for the streams", func() error {
		conns, err := srv.Connz(&server.ConnzOptions{})
		if err != nil {
			return err
		}
		for _, c := range conns.Conns {
			if c.Name == "agent" {
				return nil
			}
		}
		return errors.New("no connection named agent")
	})
	if _, err := adminJS.Stream(ctx, "JOBS"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("stream JOBS before the scheduler and supervisor started: %v, want not found", err)
	}
	stopScheduler := runService(t, root, url, "scheduler", passwords["scheduler"], schedulerServiceMain())
	stopSupervisor := runService(t, root, url, "supervisor", passwords["supervisor"], supervisorServiceMain(),
		"supervisor.escalation.schedules.perm-fail.pause_schedule_after=1")
	eventually(t, 30*time.Second, 100*time.Millisecond, "agent registered in bucket agents", func() error {
		kv, err := adminJS.KeyValue(ctx, "agents")
		if err != nil {
			return err
		}
		_, err = kv.Get(ctx, agentID)
		return err
	})

	client, _ := connect("client")
	clientJS, _ := jetstream.New(client)
	succeeded := make(chan jobEvent, 100)
	sub, err := client.Subscribe("events.job.default.*.succeeded.*", func(m *nats.Msg) {
		var ev jobEvent
		if err := json.Unmarshal(m.Data, &ev); err == nil {
			succeeded <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := client.Flush(); err != nil {
		t.Fatal(err)
	}
	awaitSucceeded := func(what string, match func(jobEvent) bool) jobEvent {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev := <-succeeded:
				if match(ev) {
					return ev
				}
			case <-timeout:
				t.Fatalf("%s: no succeeded event", what)
			}
		}
	}

	t.Run("client job runs on the least-privileged agent", func(t *testing.T) {
		msg := nats.NewMsg("jobs.default.echo")
		msg.Header.Set("Jetfleet-Job-Id", "perm-1")
		msg.Data = []byte(`{"hello":"permissions"}`)
		if _, err := clientJS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		ev := awaitSucceeded("job perm-1", func(ev jobEvent) bool { return ev.JobID == "perm-1" })
		if ev.AgentID != agentID {
			t.Errorf("perm-1 ran on %q, want %q", ev.AgentID, agentID)
		}
	})

	t.Run("client enqueues a unique job; the supervisor releases its key", func(t *testing.T) {
		c := jetfleet.NewClient(client)
		opts := []jetfleet.EnqueueOption{jetfleet.WithQueue("default"), jetfleet.WithUniqueUntilFinished("perm-unique")}
		first, err := c.Enqueue(ctx, echoArgs{Hello: "unique"}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		awaitSucceeded("unique job", func(ev jobEvent) bool { return ev.JobID == first.JobID })
		eventually(t, 15*time.Second, 50*time.Millisecond, "the unique key released", func() error {
			res, err := c.Enqueue(ctx, echoArgs{Hello: "unique"}, opts...)
			if err == nil && res.Duplicate {
				err = fmt.Errorf("still held by %s", res.JobID)
			}
			return err
		})
	})

	t.Run("client runs a workflow; the supervisor advances it", func(t *testing.T) {
		c := jetfleet.NewClient(client)
		_, err := c.AddWorkflowDocument(ctx, []byte(`{"name":"perm-flow","steps":[
			{"name":"first","kind":"echo"},
			{"name":"each","kind":"echo","depends_on":["first"],"for_each":[1,2],"input":{"n":"{{item}}"}}]}`))
		if err != nil {
			t.Fatal(err)
		}
		started, err := c.RunWorkflow(ctx, "perm-flow", nil)
		if err != nil {
			t.Fatal(err)
		}
		run, err := c.WaitWorkflowRun(ctx, started.RunID)
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != jetfleet.WorkflowSucceeded {
			t.Errorf("run %s ended %s, want succeeded: %+v", run.RunID, run.Status, run.Failures)
		}
		start := nats.NewMsg("workflows.perm-flow") // one message from the client user starts a run too
		start.Header.Set("Jetfleet-Run-Id", "perm-msg")
		start.Data = []byte(`{"from":"a message"}`)
		if _, err := clientJS.PublishMsg(ctx, start); err != nil {
			t.Fatal(err)
		}
		if run, err = c.WaitWorkflowRun(ctx, "perm-msg"); err != nil || run.Status != jetfleet.WorkflowSucceeded {
			t.Errorf("run perm-msg: %+v, %v", run, err)
		}
		runs, err := c.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "perm-flow"})
		if err != nil || len(runs) != 2 {
			t.Errorf("runs of perm-flow: %v, %v", runs, err)
		}
	})

	t.Run("scheduler fires through the scheduler API", func(t *testing.T) {
		def := []byte(`{"id":"perm-tick","spec":{"interval":{"every":"1s"}},"target":{"queue":"default","kind":"echo"}}`)
		eventually(t, 30*time.Second, 200*time.Millisecond, "schedule added through the API", func() error {
			return apiCall(ctx, client, "jetfleet.api.scheduler.add", def)
		})
		ev := awaitSucceeded("a run of schedule perm-tick", func(ev jobEvent) bool { return ev.ScheduleID == "perm-tick" })
		if ev.AgentID != agentID {
			t.Errorf("%s ran on %q, want %q", ev.JobID, ev.AgentID, agentID)
		}
		if err := apiCall(ctx, client, "jetfleet.api.scheduler.rm", []byte(`{"id":"perm-tick"}`)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("agent dead-letters and the supervisor purges", func(t *testing.T) {
		dlq, err := clientJS.Stream(ctx, "DLQ") // info only; the client cannot read DLQ messages
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg("jobs.default.fail")
		msg.Header.Set("Jetfleet-Job-Id", "perm-fail")
		msg.Data = []byte(`{"non_retryable":true}`)
		if _, err := clientJS.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, 100*time.Millisecond, "dead letter stored", func() error {
			info, err := dlq.Info(ctx)
			if err != nil {
				return err
			}
			if info.State.Msgs != 1 {
				return fmt.Errorf("%d dead letters", info.State.Msgs)
			}
			return nil
		})
		eventually(t, 30*time.Second, 200*time.Millisecond, "dead letters purged through the supervisor API", func() error {
			return apiCall(ctx, client, "jetfleet.api.dlq.purge", []byte(`{"all":true}`))
		})
		info, err := dlq.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != 0 {
			t.Errorf("%d dead letters after the purge", info.State.Msgs)
		}
	})

	t.Run("supervisor pauses a failing schedule through the scheduler API", func(t *testing.T) {
		paused := make(chan struct{}, 1)
		sub, err := client.Subscribe("events.schedule.perm-fail.paused", func(*nats.Msg) {
			select {
			case paused <- struct{}{}:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := client.Flush(); err != nil {
			t.Fatal(err)
		}
		def := []byte(`{"id":"perm-fail","spec":{"interval":{"every":"1s"}},` +
			`"target":{"queue":"default","kind":"fail","payload":{"non_retryable":true}}}`)
		if err := apiCall(ctx, client, "jetfleet.api.scheduler.add", def); err != nil {
			t.Fatal(err)
		}
		select {
		case <-paused:
		case <-time.After(30 * time.Second):
			t.Fatal("schedule perm-fail was not paused after a dead run (supervisor escalation pause_schedule_after)")
		}
		if err := apiCall(ctx, client, "jetfleet.api.scheduler.rm", []byte(`{"id":"perm-fail"}`)); err != nil {
			t.Fatal(err)
		}
	})

	// The dashboard as its own user: every page reads, its operator actions
	// act, and it is denied what it must never do.
	dashPort := freeTCPPort(t)
	stopDashboard := runService(t, root, url, "dashboard", passwords["dashboard"], dashboardServiceMain(),
		fmt.Sprintf("dashboard.listen=127.0.0.1:%d", dashPort), "dashboard.auth.users=op:op-password:operator",
		"dashboard.jaeger.query_url=")
	t.Run("dashboard reads every view and acts as its user", func(t *testing.T) {
		base := fmt.Sprintf("http://127.0.0.1:%d", dashPort)
		def := []byte(`{"id":"perm-dash","spec":{"cron":"@daily"},"target":{"queue":"default","kind":"echo"}}`)
		if err := apiCall(ctx, client, "jetfleet.api.scheduler.add", def); err != nil {
			t.Fatal(err)
		}
		web := dashboardLogin(t, base, "op", "op-password")
		for _, path := range []string{"/", "/schedules", "/schedules/perm-dash", "/kinds", "/kinds/default/echo", "/jobs",
			"/jobs?state=queued", "/jobs?state=succeeded", "/jobs/perm-1", "/running", "/dlq", "/agents"} {
			eventually(t, 10*time.Second, 100*time.Millisecond, "dashboard page "+path, func() error {
				return dashboardGet(web, base+path)
			})
		}
		for _, action := range []string{"pause", "resume", "trigger"} {
			if err := dashboardAction(web, base, "/schedules/perm-dash", "/actions/schedule/"+action, "id=perm-dash"); err != nil {
				t.Fatalf("%s: %v", action, err)
			}
		}
		if err := apiCall(ctx, client, "jetfleet.api.scheduler.rm", []byte(`{"id":"perm-dash"}`)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dashboard user is denied", func(t *testing.T) {
		nc, errs := connect("dashboard")
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(ctx, "schedules")
		if err != nil {
			t.Fatal(err)
		}
		probes := []probe{
			{"delete stream JOBS", "$JS.API.STREAM.DELETE.JOBS", func(ctx context.Context) error { return js.DeleteStream(ctx, "JOBS") }},
			{"publish a job", "jobs.default.echo", func(ctx context.Context) error {
				_, err := js.Publish(ctx, "jobs.default.echo", []byte(`{}`))
				return err
			}},
			{"fake a job event", "events.job.default.echo.succeeded.x", func(ctx context.Context) error {
				_, err := js.Publish(ctx, "events.job.default.echo.succeeded.x", []byte(`{}`))
				return err
			}},
			{"write a schedule", "$KV.schedules.rogue", func(ctx context.Context) error {
				_, err := kv.Put(ctx, "rogue", []byte(`{}`))
				return err
			}},
			{"add a schedule through the API", "jetfleet.api.scheduler.add", func(ctx context.Context) error {
				return apiCall(ctx, nc, "jetfleet.api.scheduler.add", []byte(`{"id":"rogue"}`))
			}},
			{"remove a queue through the API", "jetfleet.api.queues.rm", func(ctx context.Context) error {
				return apiCall(ctx, nc, "jetfleet.api.queues.rm", []byte(`{"queue":"default","force":true}`))
			}},
			{"read every job", "jobs.>", subscribeProbe(nc, "jobs.>")},
			{"start a workflow run", "jetfleet.api.workflows.run", func(ctx context.Context) error {
				return apiCall(ctx, nc, "jetfleet.api.workflows.run", []byte(`{"workflow":"perm-flow"}`))
			}},
		}
		runProbes(t, "dashboard", probes, errs, violations)
	})

	// A job on a queue no agent serves stays in JOBS: the message the agent
	// tries to delete below.
	parked, err := clientJS.Publish(ctx, "jobs.parked.echo", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	jobsBefore, err := adminJS.Stream(ctx, "JOBS")
	if err != nil {
		t.Fatal(err)
	}

	// A foreign agent reads a job's entry in bucket cancels with a direct get
	// before it runs the job (docs/protocol.md §3.8), as the C example does.
	t.Run("agent user reads a job's cancel", func(t *testing.T) {
		kv, err := adminJS.KeyValue(ctx, "cancels")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "perm-cancel", []byte(`{"job_id":"perm-cancel","reason":"probe"}`)); err != nil {
			t.Fatal(err)
		}
		nc, errs := connect("agent")
		m, err := nc.Request("$JS.API.DIRECT.GET.KV_cancels.$KV.cancels.perm-cancel", nil, 2*time.Second)
		if err != nil {
			t.Fatalf("direct get of the job's cancel: %v (async errors: %v)", err, errs.errs)
		}
		if !strings.Contains(string(m.Data), `"perm-cancel"`) || m.Header.Get("Nats-Time-Stamp") == "" {
			t.Errorf("direct get answered %q with headers %v", m.Data, m.Header)
		}
	})

	// An agent takes a limited kind's concurrency slot and next start in
	// bucket limits (docs/protocol.md §2.4), with a TTL on the slot.
	t.Run("agent user takes a limited kind's slot and next start", func(t *testing.T) {
		nc, errs := connect("agent")
		js, _ := jetstream.New(nc)
		kv, err := js.KeyValue(ctx, "limits")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctx, "slot.default.perm.0", []byte(`{"agent_id":"probe"}`), jetstream.KeyTTL(15*time.Second)); err != nil {
			t.Errorf("take a slot: %v (async errors: %v)", err, errs.errs)
		}
		if _, err := kv.Create(ctx, "rate.default.perm", []byte("0")); err != nil {
			t.Errorf("take the next start: %v (async errors: %v)", err, errs.errs)
		}
	})

	t.Run("agent user is denied", func(t *testing.T) {
		nc, errs := connect("agent")
		js, _ := jetstream.New(nc)
		jobs, err := js.Stream(ctx, "JOBS") // stream info is allowed
		if err != nil {
			t.Fatal(err)
		}
		events, err := js.Stream(ctx, "EVENTS")
		if err != nil {
			t.Fatal(err)
		}
		buckets := map[string]jetstream.KeyValue{}
		for _, b := range []string{"schedules", "schedule_state", "leases", "limits"} {
			if buckets[b], err = js.KeyValue(ctx, b); err != nil {
				t.Fatal(err)
			}
		}
		schedule := []byte(`{"id":"rogue","spec":{"interval":{"every":"1s"}},"target":{"queue":"default","kind":"echo"}}`)
		probes := []probe{
			{"delete stream JOBS", "$JS.API.STREAM.DELETE.JOBS", func(ctx context.Context) error {
				return js.DeleteStream(ctx, "JOBS")
			}},
			{"create a stream", "$JS.API.STREAM.CREATE.ROGUE", func(ctx context.Context) error {
				_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ROGUE", Subjects: []string{"rogue.>"}})
				return err
			}},
			{"update stream JOBS", "$JS.API.STREAM.UPDATE.JOBS", func(ctx context.Context) error {
				cfg := jobs.CachedInfo().Config
				cfg.MaxAge = time.Second
				_, err := js.UpdateStream(ctx, cfg)
				return err
			}},
			{"purge stream JOBS", "$JS.API.STREAM.PURGE.JOBS", func(ctx context.Context) error {
				return jobs.Purge(ctx)
			}},
			{"delete a job message", "$JS.API.STREAM.MSG.DELETE.JOBS", func(ctx context.Context) error {
				return jobs.DeleteMsg(ctx, parked.Sequence)
			}},
			{"delete an event", "$JS.API.STREAM.MSG.DELETE.EVENTS", func(ctx context.Context) error {
				return events.DeleteMsg(ctx, 1)
			}},
			{"write a schedule", "$KV.schedules.rogue", func(ctx context.Context) error {
				_, err := buckets["schedules"].Put(ctx, "rogue", schedule)
				return err
			}},
			{"write a schedule's state", "$KV.schedule_state.perm-tick", func(ctx context.Context) error {
				_, err := buckets["schedule_state"].Put(ctx, "perm-tick", []byte(`{}`))
				return err
			}},
			{"take the scheduler's lease", "$KV.leases.scheduler", func(ctx context.Context) error {
				_, err := buckets["leases"].Put(ctx, "scheduler", []byte("rogue"))
				return err
			}},
			{"lift or change a kind's fleet-wide limit", "$KV.limits.def.default.echo", func(ctx context.Context) error {
				_, err := buckets["limits"].Put(ctx, "def.default.echo", []byte(`{"concurrency":1000}`))
				return err
			}},
			{"delete the queue's consumer", "$JS.API.CONSUMER.DELETE.JOBS.queue-default", func(ctx context.Context) error {
				return js.DeleteConsumer(ctx, "JOBS", "queue-default")
			}},
			{"publish a job", "jobs.default.echo", func(ctx context.Context) error {
				_, err := js.Publish(ctx, "jobs.default.echo", []byte(`{}`))
				return err
			}},
			{"add a schedule through the API", "jetfleet.api.scheduler.add", func(ctx context.Context) error {
				return apiCall(ctx, nc, "jetfleet.api.scheduler.add", schedule)
			}},
			{"serve the scheduler API", "jetfleet.api.scheduler.>", subscribeProbe(nc, "jetfleet.api.scheduler.>")},
			{"read every job", "jobs.>", subscribeProbe(nc, "jobs.>")},
		}
		runProbes(t, "agent", probes, errs, violations)

		// Nothing of it took effect.
		if _, err := adminJS.Stream(ctx, "ROGUE"); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream ROGUE: %v, want not found", err)
		}
		info, err := adminJS.Stream(ctx, "JOBS")
		if err != nil {
			t.Fatal(err)
		}
		if got, want := info.CachedInfo().Config.MaxAge, jobsBefore.CachedInfo().Config.MaxAge; got != want {
			t.Errorf("JOBS max_age %s, want %s", got, want)
		}
		if _, err := info.GetMsg(ctx, parked.Sequence); err != nil {
			t.Errorf("parked job (JOBS %d): %v", parked.Sequence, err)
		}
		if _, err := adminJS.Consumer(ctx, "JOBS", "queue-default"); err != nil {
			t.Errorf("consumer queue-default: %v", err)
		}
		adminEvents, err := adminJS.Stream(ctx, "EVENTS")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := adminEvents.GetMsg(ctx, 1); err != nil {
			t.Errorf("event 1: %v", err)
		}
		schedules, err := adminJS.KeyValue(ctx, "schedules")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := schedules.Get(ctx, "rogue"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("schedule rogue: %v, want not found", err)
		}
		leases, err := adminJS.KeyValue(ctx, "leases")
		if err != nil {
			t.Fatal(err)
		}
		if e, err := leases.Get(ctx, "scheduler"); err == nil && string(e.Value()) == "rogue" {
			t.Error("the agent took the scheduler's lease")
		}
	})

	t.Run("no user but admin deletes streams; schedules change only through the API", func(t *testing.T) {
		var wg sync.WaitGroup
		defer wg.Wait()
		for _, user := range []string{"scheduler", "supervisor", "client"} {
			nc, errs := connect(user)
			js, _ := jetstream.New(nc)
			probes := []probe{{"delete stream JOBS", "$JS.API.STREAM.DELETE.JOBS", func(ctx context.Context) error {
				return js.DeleteStream(ctx, "JOBS")
			}}}
			switch user {
			case "scheduler":
				probes = append(probes, probe{"delete the queue's consumer", "$JS.API.CONSUMER.DELETE.JOBS.queue-default",
					func(ctx context.Context) error { return js.DeleteConsumer(ctx, "JOBS", "queue-default") }})
			case "supervisor":
				kv, err := js.KeyValue(ctx, "schedules")
				if err != nil {
					t.Fatal(err)
				}
				probes = append(probes, probe{"write a schedule", "$KV.schedules.rogue", func(ctx context.Context) error {
					_, err := kv.Put(ctx, "rogue", []byte(`{}`))
					return err
				}})
			case "client":
				kv, err := js.KeyValue(ctx, "schedules")
				if err != nil {
					t.Fatal(err)
				}
				jobs, err := js.Stream(ctx, "JOBS")
				if err != nil {
					t.Fatal(err)
				}
				probes = append(probes,
					probe{"write a schedule", "$KV.schedules.rogue", func(ctx context.Context) error {
						_, err := kv.Put(ctx, "rogue", []byte(`{}`))
						return err
					}},
					probe{"delete a job message", "$JS.API.STREAM.MSG.DELETE.JOBS", func(ctx context.Context) error {
						return jobs.DeleteMsg(ctx, parked.Sequence)
					}},
					probe{"fake a job event", "events.job.default.echo.succeeded.x", func(ctx context.Context) error {
						_, err := js.Publish(ctx, "events.job.default.echo.succeeded.x", []byte(`{}`))
						return err
					}})
			}
			wg.Go(func() { runProbes(t, user, probes, errs, violations) })
		}
	})
	if _, err := adminJS.Stream(ctx, "JOBS"); err != nil {
		t.Errorf("stream JOBS: %v", err)
	}

	// Every violation the server logged came from the probes above: the
	// services themselves, from start to stop, never touched a subject their
	// users may not use.
	stopDashboard()
	stopAgent()
	stopScheduler()
	stopSupervisor()
	for _, v := range violations.all() {
		if !strings.Contains(v, ":probe-") {
			t.Errorf("permission violation by a service: %s", v)
		}
	}
}

// probe is one operation a user must not be able to do: the server must
// refuse subject.
type probe struct {
	name    string
	subject string
	do      func(context.Context) error
}

// subscribeProbe subscribes to subject; the server refuses asynchronously.
func subscribeProbe(nc *nats.Conn, subject string) func(context.Context) error {
	return func(context.Context) error {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			return err
		}
		return errors.New("subscribed") // the verdict is the server's: see runProbes
	}
}

// runProbes runs the probes of user at once, each bounded by a short
// timeout (a refused request is never answered), and checks that each one
// failed, that the client received the server's permissions violation
// naming its subject, and that the server logged it for user.
func runProbes(t *testing.T, user string, probes []probe, errs *asyncErrors, violations *violationLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	results := make([]error, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Go(func() { results[i] = p.do(ctx) })
	}
	wg.Wait()
	for i, p := range probes {
		if results[i] == nil {
			t.Errorf("%s could %s", user, p.name)
			continue
		}
		quoted := fmt.Sprintf("%q", p.subject)
		if !errs.has(nats.ErrPermissionViolation, quoted) {
			t.Errorf("%s, %s: no permissions violation for %s reached the client (error: %v)", user, p.name, quoted, results[i])
		}
		if !violations.has(fmt.Sprintf(`"JETFLEET/user:%s"`, user), quoted) {
			t.Errorf("%s, %s: the server logged no violation for %s", user, p.name, quoted)
		}
	}
}

// apiCall sends a request to a micro service endpoint and returns its error
// (the reply's Nats-Service-Error header), or the request's.
func apiCall(ctx context.Context, nc *nats.Conn, subject string, body []byte) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	reply, err := nc.RequestWithContext(rctx, subject, body)
	if err != nil {
		return err
	}
	if e := reply.Header.Get("Nats-Service-Error"); e != "" {
		return fmt.Errorf("%s: %s (%s)", subject, e, reply.Data)
	}
	return nil
}

// jobEvent holds the fields of a JobEvent (docs/protocol.md §5.2) the tests read.
type jobEvent struct {
	Type        string `json:"type"`
	JobID       string `json:"job_id"`
	Queue       string `json:"queue"`
	Kind        string `json:"kind"`
	AgentID     string `json:"agent_id"`
	ScheduleID  string `json:"schedule_id"`
	NominalTime string `json:"nominal_time"`
	TraceID     string `json:"trace_id"`
}

// runService runs the service name in-process exactly as its binary does
// (service.Run with the binary's build function), with the compose stack's
// configuration files, as NATS user name, until stop is called or the test
// ends.
func runService(t *testing.T, root, url, name, password string, m serviceMain, sets ...string) (stop func()) {
	t.Helper()
	dir := filepath.Join(root, "config", "compose")
	args := []string{"-config", filepath.Join(dir, "fleet.yaml"), "-config", filepath.Join(dir, name+".yaml"),
		"-set", "nats.url=" + url, "-set", "nats.user=" + name, "-set", "nats.password=" + password,
		"-set", "telemetry.http_addr=127.0.0.1:0", "-set", "telemetry.log_level=warn"}
	for _, s := range sets {
		args = append(args, "-set", s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, name, args, m.cfg, m.build) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	})
	t.Cleanup(stop)
	return stop
}

// serviceMain is what a service binary's main passes to service.Main.
type serviceMain struct {
	cfg   service.Configuration
	build service.BuildFunc
}

// The three as in services/{agent,scheduler,supervisor}/main.go.
func agentServiceMain() serviceMain {
	cfg := agentservice.DefaultServiceConfig()
	return serviceMain{cfg, agentservice.BuildFunc(cfg)}
}

func schedulerServiceMain() serviceMain {
	cfg := scheduler.DefaultServiceConfig()
	return serviceMain{cfg, func(ctx context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		return scheduler.BuildFunc(cfg.Scheduler)(ctx, env, http)
	}}
}

func dashboardServiceMain() serviceMain {
	cfg := dashboard.DefaultServiceConfig()
	return serviceMain{cfg, func(ctx context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		return dashboard.BuildFunc(cfg.Dashboard)(ctx, env, http)
	}}
}

func supervisorServiceMain() serviceMain {
	cfg := supervisor.DefaultServiceConfig()
	return serviceMain{cfg, func(ctx context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		return supervisor.BuildFunc(cfg.Supervisor)(ctx, env, http)
	}}
}

// asyncErrors collects a connection's asynchronous errors.
type asyncErrors struct {
	mu   sync.Mutex
	errs []error
}

func (a *asyncErrors) add(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.errs = append(a.errs, err)
}

func (a *asyncErrors) has(target error, substr string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.ContainsFunc(a.errs, func(err error) bool {
		return errors.Is(err, target) && strings.Contains(err.Error(), substr)
	})
}

// violationLog is the server's logger: it keeps the permission violations.
type violationLog struct {
	mu    sync.Mutex
	lines []string
}

var _ server.Logger = (*violationLog)(nil)

func (l *violationLog) Errorf(format string, v ...any) {
	line := fmt.Sprintf(format, v...)
	if strings.Contains(line, "Violation") {
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
	}
}
func (l *violationLog) Noticef(string, ...any) {}
func (l *violationLog) Warnf(string, ...any)   {}
func (l *violationLog) Fatalf(string, ...any)  {}
func (l *violationLog) Debugf(string, ...any)  {}
func (l *violationLog) Tracef(string, ...any)  {}

func (l *violationLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

func (l *violationLog) has(substrs ...string) bool {
	for _, line := range l.all() {
		if !slices.ContainsFunc(substrs, func(s string) bool { return !strings.Contains(line, s) }) {
			return true
		}
	}
	return false
}

// freeTCPPort returns a loopback port nothing listens on right now.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // only its port was wanted
	return ln.Addr().(*net.TCPAddr).Port
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// dashboardLogin logs in to the dashboard at base and returns a client
// holding the session (redirects not followed).
func dashboardLogin(t *testing.T, base, user, password string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) { // the service starting
		if err = dashboardAction(c, base, "/login", "/login", "user="+user+"&password="+password+"&next=/"); err == nil {
			return c
		}
	}
	t.Fatalf("log in to the dashboard: %v", err)
	return nil
}

func dashboardGet(c *http.Client, u string) error {
	_, err := dashboardBody(c, u)
	return err
}

// dashboardBody fetches a page as a browser does; anything but 200 is an error.
func dashboardBody(c *http.Client, u string) (string, error) {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	req.Header.Set("Accept", "text/html")
	res, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = res.Body.Close() }()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %.300s", u, res.Status, body)
	}
	return string(body), nil
}

// dashboardAction posts form (url-encoded) to action with the CSRF token
// of page, and expects the redirect that follows an action.
func dashboardAction(c *http.Client, base, page, action, form string) error {
	req, _ := http.NewRequest(http.MethodGet, base+page, nil)
	req.Header.Set("Accept", "text/html")
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	m := csrfField.FindSubmatch(body)
	if m == nil {
		return fmt.Errorf("no CSRF token on %s (%s)", page, res.Status)
	}
	res, err = c.Post(base+action, "application/x-www-form-urlencoded", strings.NewReader(form+"&csrf="+string(m[1])))
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	out, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusSeeOther {
		return fmt.Errorf("POST %s: %s: %.300s", action, res.Status, out)
	}
	if ck := res.Header.Values("Set-Cookie"); action != "/login" && !slices.ContainsFunc(ck, func(v string) bool { return strings.HasPrefix(v, "jetfleet_flash=") && !strings.Contains(v, "%21") }) {
		return fmt.Errorf("POST %s: the action failed: %v", action, ck)
	}
	return nil
}

// echoArgs are the args of the demo kind echo.
type echoArgs struct {
	Hello string `json:"hello"`
}

func (echoArgs) Kind() string { return "echo" }
