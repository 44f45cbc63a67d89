/*
 * agent-c - a jetfleet agent in C with the official NATS C client (nats.c),
 * written from docs/protocol.md alone. "§" numbers refer to that document.
 *
 * Threads:
 *   main        flags, connection, then the housekeeping loop: heartbeats
 *               (§3.4), +WPI for running jobs (§3.2), started events (§3.3),
 *               progress reports held back (§3.9), lost pull requests
 *               (§3.1), and stopping on SIGTERM (§3.7).
 *   nats.c's    call on_pull_reply() for every message delivered to our pull
 *               inbox (§3.1) and on_control() for commands (§3.6).
 *   one per job process() takes a delivered job from its headers to its
 *               answer. There are never more than --concurrency, because we
 *               never ask JetStream for more jobs than we have free slots.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

#include "kinds.h"
#include "proto.h"

#define VERSION "jetfleet-c/0.1.0"
#define PULL_EXPIRES (1 * NS_PER_SEC)         /* how long one pull request waits for jobs */
#define DEFAULT_MAX_ATTEMPTS 5                /* §3.2 */
#define STARTED_EVENT_AFTER (1 * NS_PER_SEC)  /* §3.3: shorter attempts get no started event */
#define PASS_ON_DELAY (500 * NS_PER_MS)       /* §3.4: hand-back to an agent that runs the kind */
#define DLQ_RETRY_DELAY (5 * NS_PER_SEC)      /* when the dead letter could not be stored */
#define API_TIMEOUT_MS 5000                   /* JetStream API calls, confirmed acks, sync publishes */
#define MAX_BACKOFF 32
/* How long a job whose outcome event could not be stored waits before its
 * redelivery (§3.3). */
#define UNSTORED_OUTCOME_DELAY (5 * NS_PER_SEC)

/* ------------------------------------------------------------------ */
/* Logging                                                             */
/* ------------------------------------------------------------------ */

static void logmsg(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logmsg(const char *level, const char *fmt, ...)
{
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    va_list ap;
    gmtime_r(&now, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    flockfile(stderr);
    fprintf(stderr, "%s %-5s ", when, level);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    funlockfile(stderr);
}
#define log_info(...) logmsg("INFO", __VA_ARGS__)
#define log_warn(...) logmsg("WARN", __VA_ARGS__)
#define log_error(...) logmsg("ERROR", __VA_ARGS__)

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

enum stop { RUN = 0, STOP_RELEASE, STOP_CANCEL, STOP_TIMEOUT };

/* One delivery of a job to this agent. */
struct job {
    struct job *next; /* in A.jobs */
    natsMsg *msg;     /* the delivered message, ours to destroy */
    char *reply;      /* its ack subject (§3.1) */
    ack_subject ack;

    /* What the subject and headers say (§2.1). */
    char id[JOB_ID_MAX_BYTES + 1], queue[129], kind[129], token[JOB_TOKEN_MAX];
    char schedule_id[129], trace_id[33];
    int64_t nominal_time;
    int max_attempts;
    int64_t timeout_ns;
    int64_t backoff[MAX_BACKOFF];
    int nbackoff;
    char header_error[512]; /* non-empty: dead-letter with invalid_headers */

    /* Attempt accounting (§3.2, §3.3). */
    uint32_t snoozes;
    int attempt;

    /* Guarded by A.mu. */
    bool ready;   /* parsed: listed in heartbeats */
    bool running; /* the kind's function is running */
    bool settled; /* answered: no more +WPI, not held any more */
    bool started_event;
    bool no_slot; /* delivered when no slot was free (§3.1): handed back, never run */
    int64_t started, deadline; /* wall clock */
    int64_t last_progress;     /* monotonic: last +WPI or delivery */
    enum stop stop;
    char stop_text[256];
    bool stop_dead_letter; /* a cancel that asks for a dead letter (§3.6) */

    /* Progress (§3.9): the kind's latest report, and the progress events
     * sent about this delivery. */
    bool has_report, report_due; /* report_due: not sent yet (less than a second since the last) */
    double report_fraction;
    char report_message[PROGRESS_MESSAGE_MAX + 1];
    int64_t report_at;      /* wall clock: when the kind reported it */
    int64_t progress_sent;  /* monotonic: the last progress event; 0 before the first */
    uint64_t progress_events;
};

static struct {
    /* Settings (flags or environment). */
    const char *url, *queue, *id;
    int concurrency;
    int64_t heartbeat_ns, grace_ns, default_timeout_ns;

    natsConnection *nc;
    jsCtx *js;
    kvStore *agents;
    natsSubscription *pull_sub, *control_sub;
    char pull_inbox[128], pull_subject[256], hb_subject[256], kv_subject[256], control_subject[256];
    char hostname[256];
    int64_t ack_wait_ns, started_at;

    pthread_mutex_t mu;
    pthread_cond_t cond; /* CLOCK_MONOTONIC; broadcast when a job ends or is told to stop */
    struct job *jobs;    /* every job we hold */
    int threads;         /* job threads alive */
    uint64_t hb_seq;
    /* Pull accounting: gathered slots are free and not asked for yet;
     * outstanding ones are asked for in open pull requests. */
    int gathered, outstanding;
    int64_t last_request, last_activity;
    bool draining;  /* stopping: no more pull requests */
    bool releasing; /* stopping after the grace period: hand every job back */
} A;

static void lock(void) { pthread_mutex_lock(&A.mu); }
static void unlock(void) { pthread_mutex_unlock(&A.mu); }

static const char *nats_err(natsStatus s)
{
    const char *last = nats_GetLastError(NULL);
    return last && *last ? last : natsStatus_GetText(s);
}

/* ------------------------------------------------------------------ */
/* Pulling (§3.1)                                                      */
/* ------------------------------------------------------------------ */

/* Asks for one job per free slot, never more: AckWait starts when
 * JetStream delivers. Call with A.mu held. */
static void request_jobs_locked(void)
{
    char body[96];
    if (A.draining || A.gathered == 0)
        return;
    snprintf(body, sizeof(body), "{\"batch\":%d,\"expires\":%" PRId64 "}", A.gathered, PULL_EXPIRES);
    natsStatus s = natsConnection_PublishRequestString(A.nc, A.pull_subject, A.pull_inbox, body);
    if (s != NATS_OK) {
        log_warn("pull request not sent: %s (asking again shortly)", nats_err(s));
        return; /* the slots stay gathered; housekeeping asks again */
    }
    A.outstanding += A.gathered;
    A.gathered = 0;
    A.last_request = mono_ns();
}

static void *job_thread(void *arg);

/* A job was delivered: track it and run it on a thread of its own. */
static void start_job(natsMsg *msg, bool no_slot)
{
    struct job *j = calloc(1, sizeof(*j));
    const char *reply = natsMsg_GetReply(msg);
    if (!j || !(j->reply = strdup(reply ? reply : ""))) {
        log_error("out of memory; the job is redelivered after AckWait");
        free(j);
        natsMsg_Destroy(msg);
        return;
    }
    j->msg = msg;
    j->no_slot = no_slot;
    j->started = wall_ns();
    j->last_progress = mono_ns();

    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    lock();
    j->next = A.jobs;
    A.jobs = j;
    A.threads++;
    int rc = pthread_create(&t, &attr, job_thread, j);
    if (rc != 0) {
        A.jobs = j->next;
        A.threads--;
        if (!no_slot)
            A.gathered++;
    }
    unlock();
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        log_error("cannot start a job thread (%s); handing the job back", strerror(rc));
        natsConnection_PublishString(A.nc, j->reply, "-NAK");
        natsMsg_Destroy(j->msg);
        free(j->reply);
        free(j);
    }
}

/* A pull request ended (408, 409, 503: no consumer took it) or the server sent
 * an idle heartbeat (100). */
static void pull_status(natsMsg *msg, const char *status)
{
    const char *pending = NULL, *desc = NULL;
    if (strcmp(status, "100") == 0)
        return;
    natsMsgHeader_Get(msg, "Description", &desc);
    if (strcmp(status, "408") != 0 && strcmp(status, "409") != 0 && strcmp(status, "404") != 0 &&
        strcmp(status, "503") != 0) {
        log_warn("unexpected pull status %s %s", status, desc ? desc : "");
        return;
    }
    /* Nats-Pending-Messages: how many of the request's jobs never came. */
    natsMsgHeader_Get(msg, "Nats-Pending-Messages", &pending);
    int left = pending ? atoi(pending) : 0;
    if (strcmp(status, "409") == 0 && desc &&
        (strcmp(desc, "Consumer Deleted") == 0 || strcmp(desc, "Leadership Change") == 0)) {
        /* Every open request has ended: all outstanding slots are free. */
        log_warn("pull requests ended: %s", desc);
        lock();
        A.gathered += A.outstanding;
        A.outstanding = 0;
        A.last_activity = mono_ns();
        request_jobs_locked();
        unlock();
        return;
    }
    if (left <= 0) {
        if (strcmp(status, "409") == 0 || strcmp(status, "503") == 0)
            log_warn("pull request refused: %s", desc && *desc ? desc : status);
        return; /* a refused request's slots come back through the lost-request check */
    }
    lock();
    if (left > A.outstanding)
        left = A.outstanding;
    A.outstanding -= left;
    A.gathered += left;
    A.last_activity = mono_ns();
    request_jobs_locked(); /* ask again for the same slots */
    unlock();
}

/* Every message on the pull inbox: a job, or a status about a request. */
static void on_pull_reply(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    const char *status = NULL;
    (void)nc;
    (void)sub;
    (void)closure;
    if (natsMsg_GetDataLength(msg) == 0 && natsMsgHeader_Get(msg, "Status", &status) == NATS_OK && status && *status) {
        pull_status(msg, status);
        natsMsg_Destroy(msg);
        return;
    }
    lock();
    /* §3.1: a request counted lost may deliver after all; with no slot
     * reserved for the job, running it would exceed the concurrency. */
    bool no_slot = A.outstanding == 0;
    if (!no_slot)
        A.outstanding--;
    A.last_activity = mono_ns();
    unlock();
    start_job(msg, no_slot);
}

/* ------------------------------------------------------------------ */
/* Reading a job (§2.1, §3.3)                                          */
/* ------------------------------------------------------------------ */

static const char *header(struct job *j, const char *name)
{
    const char *v = NULL;
    if (natsMsgHeader_Get(j->msg, name, &v) != NATS_OK || !v || !*v)
        return NULL; /* absent or empty: the default */
    return v;
}

static void header_error(struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void header_error(struct job *j, const char *fmt, ...)
{
    size_t n = strlen(j->header_error);
    va_list ap;
    if (n > 0 && n + 2 < sizeof(j->header_error)) {
        strcpy(j->header_error + n, "; ");
        n += 2;
    }
    va_start(ap, fmt);
    vsnprintf(j->header_error + n, sizeof(j->header_error) - n, fmt, ap);
    va_end(ap);
}

/* Fills the job's identity and settings from its subject and headers. */
static void read_job(struct job *j)
{
    const char *subject = natsMsg_GetSubject(j->msg), *v;

    /* jobs.<queue>.<kind> */
    const char *q = strncmp(subject, "jobs.", 5) == 0 ? subject + 5 : NULL;
    const char *dot = q ? strchr(q, '.') : NULL;
    if (dot && (size_t)(dot - q) < sizeof(j->queue) && strlen(dot + 1) < sizeof(j->kind)) {
        memcpy(j->queue, q, (size_t)(dot - q));
        strcpy(j->kind, dot + 1);
    }
    if (!valid_token(j->queue) || !valid_token(j->kind)) {
        snprintf(j->queue, sizeof(j->queue), "%s", A.queue);
        strcpy(j->kind, "_invalid");
        header_error(j, "subject %.100s is not of the form jobs.<queue>.<kind>", subject);
    }

    /* Identity: Jetfleet-Job-Id, else Nats-Msg-Id, else JOBS-<stream seq>. */
    if ((v = header(j, "Jetfleet-Job-Id"))) {
        if (valid_job_id(v))
            snprintf(j->id, sizeof(j->id), "%s", v);
        else
            header_error(j, "header Jetfleet-Job-Id: \"%.100s\" is not 1 to 256 printable characters without spaces", v);
    } else if ((v = header(j, "Nats-Msg-Id")) && valid_job_id(v)) {
        snprintf(j->id, sizeof(j->id), "%s", v);
    }
    if (!j->id[0])
        snprintf(j->id, sizeof(j->id), "JOBS-%" PRIu64, j->ack.stream_seq);
    job_token(j->id, j->token);

    j->timeout_ns = A.default_timeout_ns;
    if ((v = header(j, "Jetfleet-Timeout")) && (!parse_duration(v, &j->timeout_ns) || j->timeout_ns <= 0))
        header_error(j, "header Jetfleet-Timeout: \"%.64s\" is not a positive duration such as 30s", v);

    j->max_attempts = DEFAULT_MAX_ATTEMPTS;
    if ((v = header(j, "Jetfleet-Max-Attempts"))) {
        char *end;
        long n = strtol(v, &end, 10);
        if (*end != '\0' || n < 1 || n > 1000000)
            header_error(j, "header Jetfleet-Max-Attempts: \"%.64s\" is not a whole number of at least 1", v);
        else
            j->max_attempts = (int)n;
    }

    if ((v = header(j, "Jetfleet-Backoff"))) {
        char list[512], *save = NULL;
        snprintf(list, sizeof(list), "%s", v);
        for (char *part = strtok_r(list, ",", &save); part; part = strtok_r(NULL, ",", &save)) {
            while (*part == ' ')
                part++;
            for (char *e = part + strlen(part); e > part && e[-1] == ' ';)
                *--e = '\0';
            int64_t d;
            if (!parse_duration(part, &d) || d < 0) {
                header_error(j, "header Jetfleet-Backoff: \"%.64s\" is not a comma-separated list of durations such as 1s,10s,1m", v);
                j->nbackoff = 0;
                break;
            }
            if (j->nbackoff < MAX_BACKOFF)
                j->backoff[j->nbackoff++] = d;
        }
    }

    if ((v = header(j, "Jetfleet-Schedule-Id")))
        snprintf(j->schedule_id, sizeof(j->schedule_id), "%s", v);
    if ((v = header(j, "Jetfleet-Nominal-Time")) && !parse_rfc3339(v, &j->nominal_time))
        header_error(j, "header Jetfleet-Nominal-Time: \"%.64s\" is not an RFC 3339 time", v);

    /* traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags> */
    if ((v = header(j, "traceparent")) && strlen(v) >= 55 && v[2] == '-' && v[35] == '-' &&
        strspn(v + 3, "0123456789abcdef") >= 32 && strncmp(v + 3, "00000000000000000000000000000000", 32) != 0)
        memcpy(j->trace_id, v + 3, 32);
}

/* What earlier deliveries of this message left in its events (§3.3). */
struct history {
    bool succeeded; /* succeeded or skipped_duplicate: only the ack was lost */
    bool dead;      /* the dead letter is stored: only the TERM was lost */
    bool cancelled; /* the cancelled event is stored: only the TERM was lost */
    /* A failed event without a dead one: the verdict whose dead letter could
     * not be stored. */
    bool verdict;
    char verdict_type[16], verdict_reason[64], verdict_code[64], verdict_error[4200]; /* errors are cut to 4 KiB (§3.5) */
    int verdict_attempt, verdict_max_attempts;
    char last_error[512]; /* of the latest event that has one */
};

/* The event types a redelivery reads (§3.3), one read each. */
static const char *const history_types[] = {"succeeded", "skipped_duplicate", "failed", "cancelled",
                                            "dead",      "snoozed",           "released", "retrying"};

/* On a redelivery, reads the latest event of each type in history_types with
 * a read of the last message on events.job.<queue>.<kind>.<type>.<job
 * token> from the leader of EVENTS (§1.2, §3.3), keeping those about this message, and takes the
 * largest snooze count among them (§3.3: only snoozed and released raise it,
 * every other event carries it). A type that cannot be read counts as none. */
static void read_history(struct job *j, struct history *h)
{
    int64_t last_error_at = 0;
    bool failed = false;
    memset(h, 0, sizeof(*h));
    for (size_t i = 0; i < sizeof(history_types) / sizeof(history_types[0]); i++) {
        const char *type = history_types[i];
        char subject[2048], text[64];
        natsMsg *m = NULL;
        json_value v;
        uint64_t seq = 0, snoozes = 0, n64 = 0;
        int64_t at = 0;

        snprintf(subject, sizeof(subject), "events.job.%s.%s.%s.%s", j->queue, j->kind, type, j->token);
        /* From the stream's leader ($JS.API.STREAM.MSG.GET), not a direct get:
         * a replica behind, such as a node back from a partition, answers a
         * direct get without the events it missed (§3.3). */
        natsStatus s = js_GetLastMsg(&m, A.js, "EVENTS", subject, NULL, NULL);
        if (s == NATS_NOT_FOUND)
            continue; /* no event of this type */
        if (s != NATS_OK) {
            log_warn("job %s: %s events unreadable (%s); counted as none", j->id, type, nats_err(s));
            continue;
        }
        const char *doc = natsMsg_GetData(m);
        size_t n = (size_t)natsMsg_GetDataLength(m);
        if (!json_member(doc, n, "stream_sequence", &v) || !json_uint64(v, &seq) || seq != j->ack.stream_seq) {
            natsMsg_Destroy(m); /* about another message with the same job id */
            continue;
        }
        if (json_member(doc, n, "snoozes", &v) && json_uint64(v, &snoozes) && snoozes > j->snoozes)
            j->snoozes = (uint32_t)snoozes;
        char error[4200] = "";
        if (json_member(doc, n, "error", &v))
            json_string(v, error, sizeof(error));
        if (json_member(doc, n, "time", &v) && json_string(v, text, sizeof(text)))
            parse_rfc3339(text, &at);
        if (error[0] && at >= last_error_at) {
            last_error_at = at;
            snprintf(h->last_error, sizeof(h->last_error), "%s", error);
        }
        if (strcmp(type, "succeeded") == 0 || strcmp(type, "skipped_duplicate") == 0) {
            h->succeeded = true;
        } else if (strcmp(type, "dead") == 0) {
            h->dead = true;
        } else if (strcmp(type, "cancelled") == 0) {
            h->cancelled = true;
        } else if (strcmp(type, "failed") == 0) {
            failed = true;
            snprintf(h->verdict_type, sizeof(h->verdict_type), "%s", type);
            snprintf(h->verdict_error, sizeof(h->verdict_error), "%s", error);
            if (json_member(doc, n, "reason", &v))
                json_string(v, h->verdict_reason, sizeof(h->verdict_reason));
            if (json_member(doc, n, "error_code", &v))
                json_string(v, h->verdict_code, sizeof(h->verdict_code));
            if (json_member(doc, n, "attempt", &v) && json_uint64(v, &n64))
                h->verdict_attempt = (int)n64;
            if (json_member(doc, n, "max_attempts", &v) && json_uint64(v, &n64))
                h->verdict_max_attempts = (int)n64;
        }
        natsMsg_Destroy(m);
    }
    h->verdict = failed && !h->dead;
}

/* ------------------------------------------------------------------ */
/* Events (§4, §5.2)                                                   */
/* ------------------------------------------------------------------ */

typedef struct {
    const char *type, *error, *error_code, *reason;
    int64_t duration; /* < 0: none */
    int64_t retry_in; /* < 0: none */
    uint32_t snoozes;
    int64_t at; /* the event's time (wall clock); 0: now */
    /* progress events (§3.9): the report, and which of the delivery's
     * progress events this is (its message id) */
    double progress;
    const char *progress_message;
    uint64_t progress_n;
    /* succeeded events: the kind's result (§3.10), a JSON document; NULL or empty: none */
    const char *result;
} event;

static void event_json(jbuf *b, const struct job *j, const event *e)
{
    jb_object(b, NULL);
    jb_str(b, "type", e->type);
    jb_str(b, "job_id", j->id);
    jb_str(b, "queue", j->queue);
    jb_str(b, "kind", j->kind);
    jb_int(b, "attempt", j->attempt);
    jb_int(b, "max_attempts", j->max_attempts);
    jb_str(b, "agent_id", A.id);
    jb_time(b, "time", e->at ? e->at : wall_ns());
    if (e->duration >= 0)
        jb_duration(b, "duration", e->duration);
    jb_str(b, "error", e->error);
    jb_str(b, "error_code", e->error_code);
    if (e->retry_in >= 0)
        jb_duration(b, "retry_in", e->retry_in);
    jb_str(b, "schedule_id", j->schedule_id);
    jb_time(b, "nominal_time", j->nominal_time);
    jb_str(b, "trace_id", j->trace_id);
    jb_u64(b, "stream_sequence", j->ack.stream_seq);
    jb_str(b, "reason", e->reason);
    jb_time(b, "started_at", j->started);
    jb_int(b, "snoozes", e->snoozes);
    jb_u64(b, "delivered", j->ack.delivered);
    jb_double(b, "progress", e->progress);
    jb_str(b, "progress_message", e->progress_message);
    if (e->result)
        jb_bytes(b, "result", e->result, strlen(e->result));
    jb_end_object(b);
}

static jsPubOptions pub_options(void)
{
    jsPubOptions o;
    jsPubOptions_Init(&o);
    o.MaxWait = API_TIMEOUT_MS;
    return o;
}

/* Publishes a job event on events.job.<queue>.<kind>.<type>.<job token>.
 * Asynchronously (§3.3: failures are resent by on_publish_error), or, with
 * wait, confirmed by its publish ack. */
static bool publish_event(const struct job *j, const event *e, bool wait)
{
    char subject[2048];
    jbuf b;
    natsMsg *m = NULL;
    jsPubOptions o = pub_options();
    jsErrCode jerr = 0;
    natsStatus s;

    char msg_id[96];

    jb_init(&b);
    event_json(&b, j, e);
    snprintf(subject, sizeof(subject), "events.job.%s.%s.%s.%s", j->queue, j->kind, e->type, j->token);
    /* §3.3: one id per event type and delivery (dead: one per job message;
     * progress, §3.9: one per report), so a resend is stored once. */
    if (strcmp(e->type, "dead") == 0)
        snprintf(msg_id, sizeof(msg_id), "dead:dlq:JOBS:%" PRIu64, j->ack.stream_seq);
    else if (strcmp(e->type, "progress") == 0)
        snprintf(msg_id, sizeof(msg_id), "progress:JOBS:%" PRIu64 ":%" PRIu64 ":%" PRIu64, j->ack.stream_seq,
                 j->ack.delivered, e->progress_n);
    else
        snprintf(msg_id, sizeof(msg_id), "%s:JOBS:%" PRIu64 ":%" PRIu64, e->type, j->ack.stream_seq, j->ack.delivered);
    s = b.failed ? NATS_NO_MEMORY : natsMsg_Create(&m, subject, NULL, b.buf, (int)b.len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", msg_id);
    if (s == NATS_OK)
        s = wait ? js_PublishMsg(NULL, A.js, m, &o, &jerr) : js_PublishMsgAsync(A.js, &m, &o);
    natsMsg_Destroy(m); /* no-op when the library took it */
    jb_free(&b);
    if (s != NATS_OK)
        log_warn("job %s: %s event not published: %s", j->id, e->type, nats_err(s));
    return s == NATS_OK;
}

/* Whether subject is events.job.<queue>.<kind>.<type>.<job token> with that type. */
static bool is_job_event_of_type(const char *subject, const char *type)
{
    const char *p = strncmp(subject, "events.job.", 11) == 0 ? subject + 11 : NULL;
    for (int skip = 0; p && skip < 2; skip++) /* the queue and the kind */
        if ((p = strchr(p, '.')))
            p++;
    size_t n = strlen(type);
    return p && strncmp(p, type, n) == 0 && p[n] == '.';
}

/* Asynchronous publishes that failed: events are resent a few times (§3.3);
 * a lost heartbeat is simply replaced by the next one. */
static void on_publish_error(jsCtx *js, jsPubAckErr *pae, void *closure)
{
    const char *subject = natsMsg_GetSubject(pae->Msg), *tries = NULL;
    char next[16];
    (void)closure;
    if (strncmp(subject, "events.", 7) != 0)
        return;
    if (is_job_event_of_type(subject, "progress")) {
        /* §3.9: a resend could land after the job's outcome and become its
         * status; the next report (or the outcome) says more anyway. */
        log_warn("progress event %s not stored (%s); not sent again", subject, natsStatus_GetText(pae->Err));
        return;
    }
    natsMsgHeader_Get(pae->Msg, "Jetfleet-Publish-Try", &tries);
    int n = tries && atoi(tries) > 1 ? atoi(tries) : 1;
    if (n >= 5 || pae->ErrCode != 0) { /* a JetStream error will not go away by itself */
        log_error("event %s lost: %s", subject, pae->ErrText ? pae->ErrText : natsStatus_GetText(pae->Err));
        return;
    }
    snprintf(next, sizeof(next), "%d", n + 1);
    natsMsgHeader_Set(pae->Msg, "Jetfleet-Publish-Try", next);
    log_warn("event %s not stored (%s); sending it again", subject, natsStatus_GetText(pae->Err));
    js_PublishMsgAsync(js, &pae->Msg, NULL);
}

/* ------------------------------------------------------------------ */
/* Answering (§3.2, §3.5)                                              */
/* ------------------------------------------------------------------ */

/* Marks the job answered: no more +WPI on its ack subject (a +WPI after a
 * delayed -NAK would reset the delay to AckWait), and no longer listed. */
static void settle(struct job *j)
{
    lock();
    j->settled = true;
    j->running = false;
    unlock();
}

static void nak(struct job *j, int64_t delay)
{
    char body[64] = "-NAK";
    if (delay > 0)
        snprintf(body, sizeof(body), "-NAK {\"delay\": %" PRId64 "}", delay);
    natsStatus s = natsConnection_PublishString(A.nc, j->reply, body);
    if (s != NATS_OK)
        log_warn("job %s: NAK not sent (%s); JetStream redelivers after AckWait", j->id, nats_err(s));
}

/* +ACK as a request: the empty reply confirms the server stored it. */
static void ack_confirmed(struct job *j)
{
    natsMsg *reply = NULL;
    natsStatus s = natsConnection_RequestString(&reply, A.nc, j->reply, "+ACK", API_TIMEOUT_MS);
    if (s != NATS_OK)
        log_warn("job %s: ack not confirmed (%s); a redelivery will be skipped as a duplicate", j->id, nats_err(s));
    natsMsg_Destroy(reply);
}

/* §3.3: the ack only once the outcome event is stored. If it cannot be, the
 * job is not acked: it comes back, and its next delivery finds what was
 * stored. (This example waits for the event on the job's thread; the Go
 * agent pipelines it.) */
static void ack_once_stored(struct job *j, const event *e)
{
    if (publish_event(j, e, true)) {
        ack_confirmed(j);
        return;
    }
    log_warn("job %s: %s event not stored; not acked, JetStream delivers it again", j->id, e->type);
    nak(j, UNSTORED_OUTCOME_DELAY);
}

static void succeed(struct job *j, int64_t took, const char *result)
{
    event e = {.type = "succeeded", .duration = took, .retry_in = -1, .snoozes = j->snoozes, .result = result};
    settle(j);
    ack_once_stored(j, &e);
}

static void skip_duplicate(struct job *j)
{
    event e = {.type = "skipped_duplicate", .reason = "an earlier delivery already succeeded",
               .duration = -1, .retry_in = -1, .snoozes = j->snoozes};
    settle(j);
    log_info("job %s: already succeeded; acking the redelivery without running it", j->id);
    ack_once_stored(j, &e);
}

static void retry(struct job *j, int64_t delay, const char *code, const char *error, int64_t took)
{
    event e = {.type = "retrying", .error = error, .error_code = code, .duration = took,
               .retry_in = delay, .snoozes = j->snoozes};
    settle(j);
    log_info("job %s: attempt %d of %d failed; retrying in %.3fs", j->id, j->attempt, j->max_attempts, (double)delay / 1e9);
    publish_event(j, &e, false);
    nak(j, delay);
}

/* Gives the job back without spending an attempt: the event, with one more
 * snooze, must be stored before the NAK so the next delivery counts right. */
static void hand_back(struct job *j, int64_t delay, const char *reason)
{
    event e = {.type = "released", .reason = reason, .duration = -1, .retry_in = -1, .snoozes = j->snoozes + 1};
    settle(j);
    log_info("job %s: handed back (%s)", j->id, reason);
    if (!publish_event(j, &e, true))
        log_warn("job %s: released event not stored; the next delivery counts an attempt", j->id);
    nak(j, delay);
}

/* §3.2: a cancel without a dead letter ends the run with the cancelled event
 * (reason and error code cancelled), then +TERM cancelled once the event is
 * stored; a redelivery that finds the event only TERMs (§3.3). */
static void cancel_run(struct job *j, const char *error, int64_t took)
{
    event e = {.type = "cancelled", .reason = "cancelled", .error = error, .error_code = "cancelled",
               .duration = took, .retry_in = -1, .snoozes = j->snoozes};
    settle(j);
    log_info("job %s: %s", j->id, error);
    if (!publish_event(j, &e, true)) {
        log_warn("job %s: cancelled event not stored; not terminated, JetStream delivers it again", j->id);
        nak(j, UNSTORED_OUTCOME_DELAY);
        return;
    }
    if (natsConnection_PublishString(A.nc, j->reply, "+TERM cancelled") != NATS_OK)
        log_warn("job %s: TERM not sent; its redelivery finds the cancelled event and TERMs", j->id);
}

/* The DeadLetter document (§5.4). */
static void dead_letter_json(jbuf *b, struct job *j, const char *reason, const char *code, const char *error)
{
    const char **keys = NULL;
    int nkeys = 0;
    /* Attempts spent: deliveries less hand-backs, or the attempt that ran. */
    int64_t attempts = (int64_t)j->ack.delivered - j->snoozes;
    if (attempts < j->attempt)
        attempts = j->attempt;
    if (attempts < 0)
        attempts = 0;

    jb_object(b, NULL);
    jb_str(b, "job_id", j->id);
    jb_str(b, "queue", j->queue);
    jb_str(b, "kind", j->kind);
    jb_str(b, "reason", reason);
    jb_int(b, "attempts", attempts);
    jb_str(b, "last_error", error);
    jb_str(b, "error_code", code);
    jb_str(b, "original_subject", natsMsg_GetSubject(j->msg));
    jb_str(b, "original_stream", "JOBS");
    jb_u64(b, "original_sequence", j->ack.stream_seq);
    if (natsMsgHeader_Keys(j->msg, &keys, &nkeys) == NATS_OK && nkeys > 0) {
        jb_object(b, "headers");
        for (int i = 0; i < nkeys; i++) {
            const char **values = NULL;
            int nvalues = 0;
            jb_object(b, keys[i]);
            jb_array(b, "values");
            if (natsMsgHeader_Values(j->msg, keys[i], &values, &nvalues) == NATS_OK) {
                for (int k = 0; k < nvalues; k++)
                    jb_elem_str(b, values[k]);
                free((void *)values);
            }
            jb_end_array(b);
            jb_end_object(b);
        }
        jb_end_object(b);
    }
    free((void *)keys);
    jb_bytes(b, "payload", natsMsg_GetData(j->msg), (size_t)natsMsg_GetDataLength(j->msg));
    jb_time(b, "failed_at", wall_ns());
    jb_str(b, "agent_id", A.id);
    jb_str(b, "trace_id", j->trace_id);
    jb_end_object(b);
}

/* §3.5: store the dead letter, then the events, then +TERM once the dead
 * event is stored. */
static void dead_letter(struct job *j, const char *reason, const char *code, const char *event_type,
                        const char *error, int64_t took)
{
    char subject[300], msg_id[64];
    jbuf b;
    natsMsg *m = NULL;
    jsPubOptions o = pub_options();
    jsErrCode jerr = 0;
    natsStatus s;

    settle(j);
    log_info("job %s: dead-lettered (%s): %s", j->id, reason, error);
    jb_init(&b);
    dead_letter_json(&b, j, reason, code, error);
    snprintf(subject, sizeof(subject), "dlq.%s.%s", j->queue, valid_token(j->kind) ? j->kind : "_invalid");
    snprintf(msg_id, sizeof(msg_id), "dlq:JOBS:%" PRIu64, j->ack.stream_seq);
    s = b.failed ? NATS_NO_MEMORY : natsMsg_Create(&m, subject, NULL, b.buf, (int)b.len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", msg_id);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Jetfleet-Dead-Reason", reason);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Jetfleet-Job-Id", j->id);
    if (s == NATS_OK)
        s = js_PublishMsg(NULL, A.js, m, &o, &jerr); /* wait for the publish ack */
    natsMsg_Destroy(m);
    jb_free(&b);
    event e = {.type = event_type, .error = error, .error_code = code, .reason = reason,
               .duration = took, .retry_in = -1, .snoozes = j->snoozes};
    if (s != NATS_OK) {
        /* Without the copy the job must not be terminated. Store the verdict
         * (§3.5), so the next delivery dead-letters without running the job
         * again, and try again then. */
        log_error("job %s: dead letter not stored (%s); the job will be delivered again", j->id, nats_err(s));
        if (!publish_event(j, &e, true))
            log_warn("job %s: %s event not stored either; the next delivery runs the job again", j->id, event_type);
        nak(j, DLQ_RETRY_DELAY);
        return;
    }

    publish_event(j, &e, false);
    e.type = "dead";
    if (!publish_event(j, &e, true)) {
        log_warn("job %s: dead event not stored; not terminated, JetStream delivers it again", j->id);
        nak(j, UNSTORED_OUTCOME_DELAY);
        return;
    }

    char term[160];
    snprintf(term, sizeof(term), "+TERM %s", reason);
    s = natsConnection_PublishString(A.nc, j->reply, term);
    if (s != NATS_OK)
        log_warn("job %s: TERM not sent (%s); the supervisor dead-letters it again with the same id", j->id, nats_err(s));
}

/* §3.2: the message's Jetfleet-Backoff (the last one repeats), else
 * exponential from 1 s, doubling, capped at 5 min, with ±20 % jitter. */
static int64_t backoff_for(const struct job *j)
{
    if (j->nbackoff > 0)
        return j->backoff[j->attempt - 1 < j->nbackoff ? j->attempt - 1 : j->nbackoff - 1];
    int64_t d = NS_PER_SEC;
    for (int i = 1; i < j->attempt && d < 300 * NS_PER_SEC; i++)
        d *= 2;
    if (d > 300 * NS_PER_SEC)
        d = 300 * NS_PER_SEC;
    double jitter = 1.0 + 0.2 * (2.0 * ((double)random() / RAND_MAX) - 1.0);
    return (int64_t)((double)d * jitter);
}

/* ------------------------------------------------------------------ */
/* Kinds this agent does not run (§3.4)                                */
/* ------------------------------------------------------------------ */

static bool str_equal(const char *s, void *arg) { return strcmp(s, (const char *)arg) == 0; }
static bool count_one(const char *s, void *arg)
{
    (void)s;
    ++*(int *)arg;
    return false;
}

/* Finds a live agent, other than us, whose registration in bucket agents
 * says it pulls queue and runs kind (§3.4). Live: a heartbeat (deleted keys
 * are not listed), not draining, and stored at most 3 x max(interval, 1 s)
 * before the newest heartbeat in the bucket — ours included, which we rewrite
 * every interval. Storage times are the server's: no host clock is read. */
static bool fleet_runner_of(const char *queue, const char *kind, char *who, size_t whosz)
{
    kvKeysList keys = {0};
    bool found = false;
    natsStatus s = kvStore_Keys(&keys, A.agents, NULL);
    if (s != NATS_OK) {
        if (s != NATS_NOT_FOUND)
            log_warn("agents bucket unreadable: %s", nats_err(s));
        return false;
    }
    kvEntry **entries = calloc((size_t)keys.Count + 1, sizeof(*entries));
    int64_t newest = 0;
    for (int i = 0; entries && i < keys.Count; i++) {
        if (kvStore_Get(&entries[i], A.agents, keys.Keys[i]) != NATS_OK) {
            entries[i] = NULL; /* deleted or expired meanwhile */
            continue;
        }
        if (kvEntry_Created(entries[i]) > newest)
            newest = kvEntry_Created(entries[i]);
    }
    for (int i = 0; entries && i < keys.Count && !found; i++) {
        kvEntry *e = entries[i];
        json_value v, kinds;
        bool draining = false;
        int64_t interval = NS_PER_SEC;
        int nkinds = 0;
        char text[64];
        if (!e || strcmp(keys.Keys[i], A.id) == 0)
            continue;
        const char *doc = kvEntry_ValueString(e);
        size_t n = (size_t)kvEntry_ValueLen(e);
        if (json_member(doc, n, "draining", &v))
            json_bool(v, &draining);
        if (json_member(doc, n, "interval", &v) && json_string(v, text, sizeof(text)))
            parse_duration(text, &interval);
        if (interval < NS_PER_SEC)
            interval = NS_PER_SEC;
        bool live = !draining && newest - kvEntry_Created(e) <= 3 * interval;
        bool pulls = json_member(doc, n, "queues", &v) && json_each_string(v, str_equal, (void *)queue);
        if (json_member(doc, n, "kinds", &kinds))
            json_each_string(kinds, count_one, &nkinds);
        /* No kinds listed: the agent runs every kind of its queues. */
        bool runs = nkinds == 0 || json_each_string(kinds, str_equal, (void *)kind);
        if (live && pulls && runs) {
            snprintf(who, whosz, "%s", keys.Keys[i]);
            found = true;
        }
    }
    for (int i = 0; entries && i < keys.Count; i++)
        kvEntry_Destroy(entries[i]);
    free(entries);
    kvKeysList_Destroy(&keys);
    return found;
}

/* ------------------------------------------------------------------ */
/* Running a job                                                       */
/* ------------------------------------------------------------------ */

bool job_wait(job_run *run, int64_t ns)
{
    struct job *j = run->job;
    struct timespec until;
    int64_t t = mono_ns() + ns;
    until.tv_sec = t / NS_PER_SEC;
    until.tv_nsec = t % NS_PER_SEC;
    lock();
    while (j->stop == RUN && pthread_cond_timedwait(&A.cond, &A.mu, &until) != ETIMEDOUT) {
    }
    bool running = j->stop == RUN;
    unlock();
    return running;
}

/* Answers a job told to stop: handed back; cancelled — the cancelled event,
 * or with dead_letter a dead letter (§3.2); or timed out by the supervisor —
 * a failed attempt with code timeout, retried while attempts remain (§3.6,
 * §7.1). */
static void stopped(struct job *j, enum stop why, bool dead_letter_it, const char *text, int64_t took)
{
    if (why == STOP_RELEASE)
        hand_back(j, 0, "agent stopping");
    else if (why == STOP_TIMEOUT && j->attempt >= j->max_attempts)
        dead_letter(j, "max_attempts", "timeout", "failed", text, took);
    else if (why == STOP_TIMEOUT)
        retry(j, backoff_for(j), "timeout", text, took);
    else if (dead_letter_it)
        dead_letter(j, "cancelled", "cancelled", "failed", text, took);
    else
        cancel_run(j, text, took);
}

/* §3.8: whether bucket cancels holds a cancel of this job — a JobCancel whose
 * job_id is the job's, stored (Nats-Time-Stamp, the server's clock) at or
 * after the job message (the timestamp of its ack subject): a job id enqueued
 * again after its cancel is another job. One direct get of the last message
 * on $KV.cancels.<job token> (§1.2); a 404, or a deleted key, is none. */
static bool cancel_requested(struct job *j, char *reason, size_t reasonsz, bool *dead_letter_it)
{
    char subject[JOB_TOKEN_MAX + 16], job_id[JOB_ID_MAX_BYTES + 1] = "";
    jsDirectGetMsgOptions o;
    natsMsg *m = NULL;
    json_value v;
    const char *op = NULL, *stamp = NULL;
    int64_t stored = 0;

    snprintf(subject, sizeof(subject), "$KV.cancels.%s", j->token);
    jsDirectGetMsgOptions_Init(&o);
    o.LastBySubject = subject;
    natsStatus s = js_DirectGetMsg(&m, A.js, "KV_cancels", NULL, &o);
    if (s == NATS_NOT_FOUND)
        return false;
    if (s != NATS_OK) {
        log_warn("job %s: bucket cancels unreadable (%s); taken as no cancel", j->id, nats_err(s));
        return false;
    }
    const char *doc = natsMsg_GetData(m);
    size_t n = (size_t)natsMsg_GetDataLength(m);
    bool found = (natsMsgHeader_Get(m, "KV-Operation", &op) != NATS_OK || !op || !*op) && /* not deleted or purged */
                 natsMsgHeader_Get(m, "Nats-Time-Stamp", &stamp) == NATS_OK && stamp && parse_rfc3339(stamp, &stored) &&
                 json_member(doc, n, "job_id", &v) && json_string(v, job_id, sizeof(job_id)) &&
                 strcmp(job_id, j->id) == 0 && stored >= (int64_t)j->ack.timestamp_ns;
    if (found) {
        reason[0] = '\0';
        if (json_member(doc, n, "reason", &v))
            json_string(v, reason, reasonsz);
        *dead_letter_it = false;
        if (json_member(doc, n, "dead_letter", &v))
            json_bool(v, dead_letter_it);
    }
    natsMsg_Destroy(m);
    return found;
}

static void process(struct job *j)
{
    char text[600];
    struct history past = {0};

    if (!parse_ack_subject(j->reply, &j->ack)) {
        log_error("message on %s has no ack subject (%s); ignored", natsMsg_GetSubject(j->msg), j->reply);
        settle(j);
        return;
    }
    read_job(j);
    lock();
    j->ready = true; /* listed in heartbeats; commands may find it */
    unlock();
    if (j->header_error[0]) {
        dead_letter(j, "invalid_headers", "invalid_headers", "failed", j->header_error, 0);
        return;
    }

    /* §3.3: a redelivery may follow an attempt whose ack was lost, a dead
     * letter whose TERM was lost, a verdict whose dead letter could not be
     * stored, or hand-backs that spent no attempt: the job's events about
     * this message tell. Read before any hand-back, so that its released
     * event counts one more than the snoozes so far. */
    if (j->ack.delivered > 1)
        read_history(j, &past);
    if (past.succeeded) {
        skip_duplicate(j);
        return;
    }
    if (past.dead || past.cancelled) {
        /* The run is over (dead-lettered, or cancelled); only the TERM after it was lost. */
        settle(j);
        log_info("job %s: %s already stored; terminating the redelivery", j->id, past.dead ? "dead letter" : "cancelled event");
        if (natsConnection_PublishString(A.nc, j->reply, past.dead ? "+TERM dead letter already stored" : "+TERM cancelled") != NATS_OK)
            log_warn("job %s: TERM not sent; JetStream delivers it again", j->id);
        return;
    }
    if (past.verdict) {
        /* An earlier delivery decided the job is dead; only its dead letter
         * is missing. Store it without running the job again. */
        j->attempt = past.verdict_attempt;
        if (past.verdict_max_attempts > 0)
            j->max_attempts = past.verdict_max_attempts;
        dead_letter(j, past.verdict_reason, past.verdict_code, past.verdict_type, past.verdict_error, 0);
        return;
    }

    /* §3.8: cancelled while it waited (queued, delayed, between attempts):
     * end it without running it. */
    char cancel_reason[256];
    bool cancel_dead_letter = false;
    if (cancel_requested(j, cancel_reason, sizeof(cancel_reason), &cancel_dead_letter)) {
        snprintf(text, sizeof(text), "cancelled by command%s%s", cancel_reason[0] ? ": " : "", cancel_reason);
        if (cancel_dead_letter)
            dead_letter(j, "cancelled", "cancelled", "failed", text, 0);
        else
            cancel_run(j, text, 0);
        return;
    }

    lock();
    if (A.releasing && j->stop == RUN)
        j->stop = STOP_RELEASE; /* delivered while a stopping agent hands jobs back */
    bool release = j->stop == STOP_RELEASE;
    unlock();
    if (release) {
        hand_back(j, 0, "agent stopping");
        return;
    }
    if (j->no_slot) {
        snprintf(text, sizeof(text), "no free slot on agent %s", A.id);
        hand_back(j, 0, text);
        return;
    }

    kind_fn fn = kind_find(j->kind);
    if (!fn) {
        char other[256];
        if (fleet_runner_of(j->queue, j->kind, other, sizeof(other))) {
            snprintf(text, sizeof(text), "kind %s is run by agent %s", j->kind, other);
            hand_back(j, PASS_ON_DELAY, text);
        } else {
            snprintf(text, sizeof(text), "no live agent on queue %s runs kind %s", j->queue, j->kind);
            dead_letter(j, "unknown_kind", "unknown_kind", "failed", text, 0);
        }
        return;
    }

    /* §3.2: attempt = delivered - snoozes. */
    int64_t attempt = (int64_t)j->ack.delivered - j->snoozes;
    j->attempt = attempt < 1 ? 1 : (int)attempt;
    if (j->attempt > j->max_attempts) {
        snprintf(text, sizeof(text),
                 "no attempt left after %" PRIu64 " deliveries: earlier attempts ended without an answer (agent lost or crashed)%s%.300s",
                 j->ack.delivered, past.last_error[0] ? "; last error: " : "", past.last_error);
        dead_letter(j, "max_attempts", "agent_lost", "failed", text, 0);
        return;
    }

    job_run run = {.payload = natsMsg_GetData(j->msg), .payload_len = (size_t)natsMsg_GetDataLength(j->msg),
                   .timeout_ns = j->timeout_ns, .attempt = j->attempt, .job = j};
    lock();
    /* A command that came before the attempt started (§3.6) ends it now. */
    enum stop why = j->stop;
    bool stop_dead_letter = j->stop_dead_letter;
    snprintf(text, sizeof(text), "%s", j->stop_text);
    if (why == RUN) {
        j->started = wall_ns();
        j->deadline = j->started + j->timeout_ns;
        j->running = true;
    }
    unlock();
    if (why != RUN) {
        stopped(j, why, stop_dead_letter, text, 0);
        return;
    }

    int64_t t0 = mono_ns();
    job_result r = fn(&run);
    int64_t took = mono_ns() - t0;

    lock();
    why = j->stop;
    stop_dead_letter = j->stop_dead_letter;
    snprintf(text, sizeof(text), "%s", j->stop_text);
    unlock();
    if (why != RUN) {
        stopped(j, why, stop_dead_letter, text, took);
        return;
    }
    const char *code = run.error_code ? run.error_code : "handler_error";
    switch (r) {
    case JOB_OK:
        succeed(j, took, run.result);
        break;
    case JOB_MALFORMED:
        dead_letter(j, "malformed_payload", "malformed_payload", "failed", run.error, took);
        break;
    case JOB_NON_RETRYABLE:
        dead_letter(j, "non_retryable", "non_retryable", "failed", run.error, took);
        break;
    case JOB_RETRY:
        if (j->attempt >= j->max_attempts)
            dead_letter(j, "max_attempts", code, "failed", run.error, took);
        else
            retry(j, backoff_for(j), code, run.error, took);
        break;
    }
}

static void *job_thread(void *arg)
{
    struct job *j = arg;
    process(j);

    lock();
    for (struct job **p = &A.jobs; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            break;
        }
    A.threads--;
    if (!j->no_slot) {
        A.gathered++; /* the slot is free: ask for the next job */
        request_jobs_locked();
    }
    pthread_cond_broadcast(&A.cond);
    unlock();

    natsMsg_Destroy(j->msg);
    free(j->reply);
    free(j);
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Control (§3.6)                                                      */
/* ------------------------------------------------------------------ */

static void on_control(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    char action[64] = "", job_id[JOB_ID_MAX_BYTES + 1] = "", reason[200] = "", message[1400] = "";
    const char *doc = natsMsg_GetData(msg), *code = "";
    size_t n = (size_t)natsMsg_GetDataLength(msg);
    json_value v;
    (void)sub;
    (void)closure;

    if (json_member(doc, n, "action", &v))
        json_string(v, action, sizeof(action));
    if (json_member(doc, n, "job_id", &v))
        json_string(v, job_id, sizeof(job_id));
    if (json_member(doc, n, "reason", &v))
        json_string(v, reason, sizeof(reason));
    bool dead_letter_it = false;
    if (json_member(doc, n, "dead_letter", &v))
        json_bool(v, &dead_letter_it);

    bool timeout = strcmp(action, "timeout") == 0;
    const char *field = "";
    if (strcmp(action, "ping") == 0) {
        /* §3.6: the supervisor asks whether we are alive; the reply says so. */
    } else if (strcmp(action, "cancel") != 0 && !timeout) {
        code = "invalid_argument";
        field = "action";
        snprintf(message, sizeof(message), "unknown action \"%s\"; want cancel, timeout or ping", action);
    } else {
        bool found = false;
        lock();
        for (struct job *j = A.jobs; j; j = j->next)
            if (j->ready && !j->settled && j->stop == RUN && strcmp(j->id, job_id) == 0) {
                j->stop = timeout ? STOP_TIMEOUT : STOP_CANCEL;
                j->stop_dead_letter = !timeout && dead_letter_it;
                snprintf(j->stop_text, sizeof(j->stop_text), "%s%s%s",
                         timeout ? "timed out by the supervisor" : "cancelled by command", reason[0] ? ": " : "", reason);
                found = true;
            }
        pthread_cond_broadcast(&A.cond);
        unlock();
        if (!found) {
            code = "not_found";
            snprintf(message, sizeof(message), "agent %s is not running job %s", A.id, job_id);
        } else {
            log_info("job %s: %s requested", job_id, action);
        }
    }

    const char *reply = natsMsg_GetReply(msg);
    if (reply && *reply) {
        jbuf b; /* an Error document (§5.5), code empty on success */
        jb_init(&b);
        jb_object(&b, NULL);
        jb_str(&b, "code", code);
        jb_str(&b, "message", message);
        jb_str(&b, "field", field);
        jb_end_object(&b);
        if (!b.failed)
            natsConnection_Publish(nc, reply, b.buf, (int)b.len);
        jb_free(&b);
    }
    natsMsg_Destroy(msg);
}

/* ------------------------------------------------------------------ */
/* Heartbeats (§3.4, §5.1) and progress (§3.2, §3.9)                  */
/* ------------------------------------------------------------------ */

static void publish_heartbeat(void)
{
    jbuf b;
    jb_init(&b);
    lock();
    jb_object(&b, NULL);
    jb_str(&b, "agent_id", A.id);
    jb_str(&b, "hostname", A.hostname);
    jb_u64(&b, "pid", (uint64_t)getpid());
    jb_str(&b, "version", VERSION);
    jb_time(&b, "started_at", A.started_at);
    jb_time(&b, "sent_at", wall_ns());
    jb_duration(&b, "interval", A.heartbeat_ns);
    jb_array(&b, "queues");
    jb_elem_str(&b, A.queue);
    jb_end_array(&b);
    jb_array(&b, "kinds");
    for (int i = 0; kind_names[i]; i++)
        jb_elem_str(&b, kind_names[i]);
    jb_end_array(&b);
    jb_int(&b, "capacity", A.concurrency);
    jb_bool(&b, "draining", A.draining);
    jb_u64(&b, "sequence", ++A.hb_seq);
    jb_array(&b, "jobs");
    for (struct job *j = A.jobs; j; j = j->next) {
        if (!j->ready || j->settled)
            continue;
        jb_object(&b, NULL);
        jb_str(&b, "job_id", j->id);
        jb_str(&b, "queue", j->queue);
        jb_str(&b, "kind", j->kind);
        jb_str(&b, "reply_subject", j->reply);
        jb_u64(&b, "stream_sequence", j->ack.stream_seq);
        jb_u64(&b, "delivered", j->ack.delivered);
        jb_int(&b, "attempt", j->running ? j->attempt : 0);
        jb_time(&b, "started_at", j->started);
        jb_time(&b, "deadline", j->running ? j->deadline : 0);
        if (j->running && j->has_report) { /* §3.9: the latest report */
            jb_double(&b, "progress", j->report_fraction);
            jb_str(&b, "progress_message", j->report_message);
            jb_time(&b, "progress_at", j->report_at);
        }
        jb_end_object(&b);
    }
    jb_end_array(&b);
    jb_end_object(&b);
    unlock();

    if (!b.failed) {
        jsPubOptions o = pub_options();
        natsStatus s = natsConnection_Publish(A.nc, A.hb_subject, b.buf, (int)b.len);
        if (s == NATS_OK) /* the registration in bucket agents: a plain JetStream publish */
            s = js_PublishAsync(A.js, A.kv_subject, b.buf, (int)b.len, &o);
        if (s != NATS_OK)
            log_warn("heartbeat not sent: %s", nats_err(s));
    }
    jb_free(&b);
}

/* §3.9: publishes the job's latest progress report — after the attempt's
 * started event, so that its latest event is progress from now on — and
 * sends +WPI. Call with A.mu held, for a running job not answered yet (the
 * lock that settle() takes keeps it from following the job's outcome). */
static void send_progress_locked(struct job *j)
{
    if (!j->started_event) {
        event started = {.type = "started", .duration = -1, .retry_in = -1, .snoozes = j->snoozes};
        j->started_event = true;
        publish_event(j, &started, false);
    }
    event e = {.type = "progress", .duration = -1, .retry_in = -1, .snoozes = j->snoozes, .at = j->report_at,
               .progress = j->report_fraction, .progress_message = j->report_message,
               .progress_n = ++j->progress_events};
    publish_event(j, &e, false);
    natsConnection_PublishString(A.nc, j->reply, "+WPI");
    j->progress_sent = j->last_progress = mono_ns();
    j->report_due = false;
}

bool job_progress(job_run *run, double fraction, const char *message)
{
    struct job *j = run->job;
    char clean[PROGRESS_MESSAGE_MAX + 1];
    if (!(fraction >= 0 && fraction <= 1)) { /* NaN too: refused, never clamped */
        log_warn("job %s: progress %g is not a number from 0 to 1; not reported", j->id, fraction);
        return false;
    }
    progress_message(message ? message : "", clean);
    lock();
    if (j->running && !j->settled) {
        j->has_report = true;
        j->report_fraction = fraction;
        memcpy(j->report_message, clean, sizeof(clean));
        j->report_at = wall_ns();
        /* At most one progress event a second: a report that comes sooner
         * waits for housekeeping, and the latest one then is sent. */
        if (j->progress_sent == 0 || mono_ns() - j->progress_sent >= NS_PER_SEC)
            send_progress_locked(j);
        else
            j->report_due = true;
    }
    unlock();
    return true;
}

/* Runs every tick on the main thread. */
static void housekeeping(void)
{
    int64_t now = mono_ns();
    lock();
    for (struct job *j = A.jobs; j; j = j->next) {
        if (!j->ready || j->settled)
            continue;
        /* A progress report held back for its second (§3.9); one still due
         * when the job is answered is dropped: the outcome is its status. */
        if (j->report_due && j->running && now - j->progress_sent >= NS_PER_SEC)
            send_progress_locked(j);
        /* +WPI at least every AckWait/3 while a job is held (§3.2). */
        if (now - j->last_progress >= A.ack_wait_ns / 3) {
            natsConnection_PublishString(A.nc, j->reply, "+WPI");
            j->last_progress = now;
        }
        /* started, for attempts still running after a while (§3.3). */
        if (j->running && !j->started_event && wall_ns() - j->started >= STARTED_EVENT_AFTER) {
            event e = {.type = "started", .duration = -1, .retry_in = -1, .snoozes = j->snoozes};
            j->started_event = true;
            publish_event(j, &e, false);
        }
    }
    /* Requests lost to a server restart or leader change are never
     * answered: take their slots back and ask again. */
    if (A.outstanding > 0 && now - A.last_request > PULL_EXPIRES + 2 * NS_PER_SEC &&
        now - A.last_activity > PULL_EXPIRES + 2 * NS_PER_SEC) {
        log_warn("%d pull request slots went unanswered; asking again", A.outstanding);
        A.gathered += A.outstanding;
        A.outstanding = 0;
    }
    if (A.outstanding == 0)
        request_jobs_locked(); /* slots whose request failed to go out */
    unlock();
}

/* ------------------------------------------------------------------ */
/* Settings and startup                                                */
/* ------------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: agent-c [options]\n"
            "  -s, --server URL        NATS URL (env NATS_URL; default nats://127.0.0.1:4222)\n"
            "  -q, --queue NAME        queue to pull from (env JETFLEET_QUEUE; default default)\n"
            "  -i, --id ID             agent id, unique in the fleet (env JETFLEET_AGENT_ID; default c-<host>-<pid>)\n"
            "  -c, --concurrency N     jobs run at once (env JETFLEET_CONCURRENCY; default 4)\n"
            "  -b, --heartbeat D       heartbeat interval (env JETFLEET_HEARTBEAT_INTERVAL; default 1s)\n"
            "  -g, --grace D           on SIGTERM, how long running jobs may finish (env JETFLEET_GRACE; default 10s)\n"
            "  -t, --timeout D         attempt timeout without Jetfleet-Timeout (env JETFLEET_TIMEOUT; default 30m)\n"
            "Durations are written like 1s, 250ms or 1m30s. Kinds: echo, fail, sleep.\n");
}

static const char *setting(const char *flag, const char *env, const char *def)
{
    const char *v = getenv(env);
    return flag ? flag : (v && *v ? v : def);
}

static bool duration_setting(const char *name, const char *text, int64_t *out)
{
    if (!parse_duration(text, out) || *out <= 0) {
        fprintf(stderr, "agent-c: %s: \"%s\" is not a positive duration such as 1s\n", name, text);
        return false;
    }
    return true;
}

static bool configure(int argc, char **argv)
{
    static char default_id[160];
    const char *url = NULL, *queue = NULL, *id = NULL, *conc = NULL, *hb = NULL, *grace = NULL, *timeout = NULL;
    static const struct option opts[] = {
        {"server", required_argument, NULL, 's'},      {"queue", required_argument, NULL, 'q'},
        {"id", required_argument, NULL, 'i'},          {"concurrency", required_argument, NULL, 'c'},
        {"heartbeat", required_argument, NULL, 'b'},   {"grace", required_argument, NULL, 'g'},
        {"timeout", required_argument, NULL, 't'},     {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "s:q:i:c:b:g:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 's': url = optarg; break;
        case 'q': queue = optarg; break;
        case 'i': id = optarg; break;
        case 'c': conc = optarg; break;
        case 'b': hb = optarg; break;
        case 'g': grace = optarg; break;
        case 't': timeout = optarg; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return false;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return false;
    }

    gethostname(A.hostname, sizeof(A.hostname) - 1);
    snprintf(default_id, sizeof(default_id), "c-%.100s-%d", A.hostname, (int)getpid());
    for (char *p = default_id; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", *p))
            *p = '-';

    A.url = setting(url, "NATS_URL", "nats://127.0.0.1:4222");
    A.queue = setting(queue, "JETFLEET_QUEUE", "default");
    A.id = setting(id, "JETFLEET_AGENT_ID", default_id);
    conc = setting(conc, "JETFLEET_CONCURRENCY", "4");
    char *end;
    long n = strtol(conc, &end, 10);
    if (*end != '\0' || n < 1 || n > 10000) {
        fprintf(stderr, "agent-c: concurrency: \"%s\" is not a whole number from 1 to 10000\n", conc);
        return false;
    }
    A.concurrency = (int)n;
    if (!valid_token(A.queue) || !valid_token(A.id)) {
        fprintf(stderr, "agent-c: a queue and an agent id are 1 to 128 letters, digits, '-' or '_'\n");
        return false;
    }
    return duration_setting("heartbeat", setting(hb, "JETFLEET_HEARTBEAT_INTERVAL", "1s"), &A.heartbeat_ns) &&
           duration_setting("grace", setting(grace, "JETFLEET_GRACE", "10s"), &A.grace_ns) &&
           duration_setting("timeout", setting(timeout, "JETFLEET_TIMEOUT", "30m"), &A.default_timeout_ns);
}

static atomic_bool closing; /* set before we close the connection ourselves */

static void on_disconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    (void)closure;
    if (!atomic_load(&closing))
        log_warn("disconnected from NATS; reconnecting");
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    (void)nc;
    (void)closure;
    log_info("reconnected to NATS");
}

static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure)
{
    (void)nc;
    (void)sub;
    (void)closure;
    log_warn("NATS error: %s", natsStatus_GetText(err));
}

/* Connects and binds to what the fleet provisioned (§1): the consumer
 * queue-<queue> of stream JOBS, created when missing (§1.1), and the bucket
 * agents. */
static bool start(void)
{
    natsOptions *opts = NULL;
    jsOptions jo;
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    natsInbox *inbox = NULL;
    char name[200], consumer[140];
    natsStatus s;

    snprintf(name, sizeof(name), "jetfleet-c agent %s", A.id);
    s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetURL(opts, A.url);
    if (s == NATS_OK) s = natsOptions_SetName(opts, name);
    if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);
    if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts, 500);
    if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(opts, on_disconnected, NULL);
    if (s == NATS_OK) s = natsOptions_SetReconnectedCB(opts, on_reconnected, NULL);
    if (s == NATS_OK) s = natsOptions_SetErrorHandler(opts, on_async_error, NULL);
    if (s == NATS_OK) s = natsConnection_Connect(&A.nc, opts);
    natsOptions_Destroy(opts);
    if (s != NATS_OK) {
        log_error("connect to %s: %s", A.url, nats_err(s));
        return false;
    }

    jsOptions_Init(&jo);
    jo.Wait = API_TIMEOUT_MS;
    jo.PublishAsync.ErrHandler = on_publish_error;
    jo.PublishAsync.MaxPending = 4096;
    s = natsConnection_JetStream(&A.js, A.nc, &jo);
    if (s != NATS_OK) {
        log_error("JetStream: %s", nats_err(s));
        return false;
    }

    snprintf(consumer, sizeof(consumer), "queue-%s", A.queue);
    s = js_GetConsumerInfo(&ci, A.js, "JOBS", consumer, NULL, &jerr);
    if (s != NATS_OK && jerr == JSConsumerNotFoundErr) {
        /* §1.1: the queue does not exist yet; create its consumer with the
         * default settings (another process creating it meanwhile is fine). */
        char filter[160];
        jsConsumerConfig cc;
        snprintf(filter, sizeof(filter), "jobs.%s.>", A.queue);
        jsConsumerConfig_Init(&cc);
        cc.Name = consumer;
        cc.Durable = consumer;
        cc.FilterSubject = filter;
        cc.DeliverPolicy = js_DeliverAll;
        cc.AckPolicy = js_AckExplicit;
        cc.AckWait = 30 * NS_PER_SEC;
        cc.MaxDeliver = 20;
        cc.MaxAckPending = 10000;
        cc.ReplayPolicy = js_ReplayInstant;
        jerr = 0;
        s = js_AddConsumer(&ci, A.js, "JOBS", &cc, NULL, &jerr);
        if (s != NATS_OK) /* created by another process meanwhile, maybe with other settings */
            s = js_GetConsumerInfo(&ci, A.js, "JOBS", consumer, NULL, &jerr);
        if (s == NATS_OK)
            log_info("created consumer %s of stream JOBS (queue %s)", consumer, A.queue);
    }
    if (s != NATS_OK) {
        log_error("consumer %s of stream JOBS: %s (the fleet's services provision stream JOBS; start them first)", consumer,
                  nats_err(s));
        return false;
    }
    A.ack_wait_ns = ci->Config->AckWait > 0 ? ci->Config->AckWait : 30 * NS_PER_SEC;
    jsConsumerInfo_Destroy(ci);

    s = js_KeyValue(&A.agents, A.js, "agents");
    if (s != NATS_OK) {
        log_error("bucket agents: %s (the fleet's services provision it; start them first)", nats_err(s));
        return false;
    }

    snprintf(A.pull_subject, sizeof(A.pull_subject), "$JS.API.CONSUMER.MSG.NEXT.JOBS.%s", consumer);
    snprintf(A.hb_subject, sizeof(A.hb_subject), "jetfleet.agents.%s.heartbeat", A.id);
    snprintf(A.kv_subject, sizeof(A.kv_subject), "$KV.agents.%s", A.id);
    snprintf(A.control_subject, sizeof(A.control_subject), "jetfleet.agents.%s.control", A.id);

    s = natsInbox_Create(&inbox);
    if (s == NATS_OK) {
        snprintf(A.pull_inbox, sizeof(A.pull_inbox), "%s", (const char *)inbox);
        natsInbox_Destroy(inbox);
        s = natsConnection_Subscribe(&A.pull_sub, A.nc, A.pull_inbox, on_pull_reply, NULL);
    }
    if (s == NATS_OK) /* we asked for every delivery: never drop one */
        s = natsSubscription_SetPendingLimits(A.pull_sub, -1, -1);
    if (s == NATS_OK)
        s = natsConnection_Subscribe(&A.control_sub, A.nc, A.control_subject, on_control, NULL);
    if (s != NATS_OK) {
        log_error("subscribe: %s", nats_err(s));
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ */
/* main: housekeeping and stopping (§3.7)                              */
/* ------------------------------------------------------------------ */

static bool idle(void)
{
    lock();
    bool done = A.threads == 0 && A.outstanding == 0;
    unlock();
    return done;
}

static bool pulls_open(void)
{
    lock();
    bool open = A.outstanding > 0;
    unlock();
    return open;
}

int main(int argc, char **argv)
{
    sigset_t sigs;
    pthread_condattr_t ca;
    int rc = 1;

    /* Block SIGTERM and SIGINT in every thread (nats.c's included, so this
     * comes first); the main loop takes them with sigtimedwait. */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (!configure(argc, argv))
        return 2;
    srandom((unsigned)(wall_ns() ^ getpid()));
    pthread_mutex_init(&A.mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&A.cond, &ca);
    pthread_condattr_destroy(&ca);
    A.started_at = wall_ns();

    if (nats_Open(-1) != NATS_OK) {
        log_error("cannot initialise the NATS library");
        return 1;
    }
    if (!start())
        goto out;

    log_info("agent %s started: queue %s, concurrency %d, heartbeat every %.3fs, AckWait %.3fs", A.id, A.queue,
             A.concurrency, (double)A.heartbeat_ns / 1e9, (double)A.ack_wait_ns / 1e9);
    lock();
    A.gathered = A.concurrency; /* every slot is free: ask for jobs */
    request_jobs_locked();
    unlock();

    /* The loop wakes every tick: often enough for +WPI at AckWait/3 and
     * for heartbeats on time. */
    int64_t tick = A.ack_wait_ns / 6 < 100 * NS_PER_MS ? A.ack_wait_ns / 6 : 100 * NS_PER_MS;
    if (tick < 10 * NS_PER_MS)
        tick = 10 * NS_PER_MS;
    int64_t next_heartbeat = mono_ns(), deadline = 0;
    enum { RUNNING, DRAINING, RELEASING } phase = RUNNING;
    for (;;) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = tick};
        int sig = sigtimedwait(&sigs, NULL, &ts);
        int64_t now = mono_ns();
        if (sig > 0 && phase == RUNNING) {
            /* §3.7: stop pulling, let running jobs finish within the grace
             * period, then hand the rest back. */
            log_info("%s: stopping; running jobs have %.3fs to finish", strsignal(sig), (double)A.grace_ns / 1e9);
            lock();
            A.draining = true;
            unlock();
            phase = DRAINING;
            deadline = now + A.grace_ns;
            next_heartbeat = now; /* tell the fleet at once */
        }
        housekeeping();
        if (now >= next_heartbeat) {
            publish_heartbeat();
            next_heartbeat += A.heartbeat_ns;
            if (next_heartbeat < now)
                next_heartbeat = now + A.heartbeat_ns;
        }
        if (phase == RUNNING)
            continue;
        /* Open pull requests end within PULL_EXPIRES; only then can nothing
         * more arrive. */
        if (idle())
            break;
        /* Hand back only once no pull request is open: a job NAKed while
         * one is would come straight back to us. */
        if (phase == DRAINING && now >= deadline && !pulls_open()) {
            lock();
            A.releasing = true;
            for (struct job *j = A.jobs; j; j = j->next)
                if (j->stop == RUN)
                    j->stop = STOP_RELEASE;
            pthread_cond_broadcast(&A.cond);
            unlock();
            phase = RELEASING;
            deadline = now + PULL_EXPIRES + 2 * API_TIMEOUT_MS * NS_PER_MS;
        } else if (phase == RELEASING && now >= deadline) {
            log_error("jobs or pull requests still open after handing everything back; exiting anyway");
            _exit(1); /* job threads still use the connection: no orderly cleanup */
        }
    }

    /* Last words: a draining heartbeat, the events still in flight, and
     * the registration removed (the bucket's TTL would drop it anyway). */
    natsSubscription_Unsubscribe(A.pull_sub);
    natsSubscription_Unsubscribe(A.control_sub);
    publish_heartbeat();
    jsPubOptions o = pub_options();
    natsStatus s = js_PublishAsyncComplete(A.js, &o);
    if (s != NATS_OK)
        log_warn("some events were not confirmed before exit: %s", nats_err(s));
    kvStore_Delete(A.agents, A.id);
    natsConnection_FlushTimeout(A.nc, API_TIMEOUT_MS);
    log_info("agent %s stopped", A.id);
    rc = 0;

out:
    atomic_store(&closing, true);
    natsSubscription_Destroy(A.pull_sub);
    natsSubscription_Destroy(A.control_sub);
    kvStore_Destroy(A.agents);
    jsCtx_Destroy(A.js);
    natsConnection_Destroy(A.nc);
    nats_CloseAndWait(API_TIMEOUT_MS);
    return rc;
}
