/* kinds.c - three built-in kinds that exercise the protocol. Add yours here. */
#include "kinds.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

/* echo: succeeds at once, with the payload's size as its result. */
static job_result kind_echo(job_run *run)
{
    snprintf(run->result, sizeof(run->result), "{\"payload_bytes\":%zu}", run->payload_len);
    return JOB_OK;
}

/* fail: fails every attempt, so it is retried with backoff until its last
 * attempt and then dead-lettered with reason max_attempts. */
static job_result kind_fail(job_run *run)
{
    snprintf(run->error, sizeof(run->error), "fail: attempt %d failed on purpose (payload %.*s)", run->attempt,
             (int)(run->payload_len > 64 ? 64 : run->payload_len), run->payload);
    return JOB_RETRY;
}

/* Sleeps for ns of the want ns the job asked for, reporting its progress
 * every second; false when the job is stopped meanwhile. */
static bool sleep_reporting(job_run *run, int64_t ns, int64_t want)
{
    char message[96];
    for (int64_t slept = 0; slept < ns;) {
        int64_t step = ns - slept < NS_PER_SEC ? ns - slept : NS_PER_SEC;
        if (!job_wait(run, step))
            return false;
        slept += step;
        if (slept < ns) {
            snprintf(message, sizeof(message), "slept %.0fs of %.3fs", (double)slept / 1e9, (double)want / 1e9);
            job_progress(run, (double)slept / (double)want, message);
        }
    }
    return true;
}

/* sleep: the payload is a number of milliseconds to run for, reporting its
 * progress every second. A job that needs longer than its timeout fails with
 * error code "timeout". */
static job_result kind_sleep(job_run *run)
{
    char text[32];
    char *end;
    if (run->payload_len == 0 || run->payload_len >= sizeof(text))
        goto malformed;
    memcpy(text, run->payload, run->payload_len);
    text[run->payload_len] = '\0';
    long long ms = strtoll(text, &end, 10);
    if (*end != '\0' || ms < 0)
        goto malformed;

    int64_t want = (int64_t)ms * NS_PER_MS;
    if (want > run->timeout_ns) {
        sleep_reporting(run, run->timeout_ns, want);
        snprintf(run->error, sizeof(run->error), "attempt timed out after %.3fs", (double)run->timeout_ns / 1e9);
        run->error_code = "timeout";
        return JOB_RETRY;
    }
    sleep_reporting(run, want, want); /* when the job is stopped early, agent.c ignores what we return */
    return JOB_OK;

malformed:
    snprintf(run->error, sizeof(run->error), "sleep wants a payload of whole milliseconds, such as 1500");
    return JOB_MALFORMED;
}

static const struct {
    const char *name;
    kind_fn fn;
} kinds[] = {
    {"echo", kind_echo},
    {"fail", kind_fail},
    {"sleep", kind_sleep},
};

const char *const kind_names[] = {"echo", "fail", "sleep", NULL};

kind_fn kind_find(const char *name)
{
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (strcmp(kinds[i].name, name) == 0)
            return kinds[i].fn;
    return NULL;
}
