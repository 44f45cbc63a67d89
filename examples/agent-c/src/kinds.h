/*
 * kinds.h - the job kinds this agent runs. A kind is a function that gets the
 * job's payload and returns how the attempt went; agent.c turns that into
 * acks, retries, dead letters and events (docs/protocol.md §3.2, §3.5).
 */
#ifndef JETFLEET_KINDS_H
#define JETFLEET_KINDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    JOB_OK,            /* succeeded: +ACK */
    JOB_RETRY,         /* failed: retried while attempts remain, then dead-lettered (max_attempts) */
    JOB_NON_RETRYABLE, /* failed for good: dead-lettered (non_retryable) */
    JOB_MALFORMED,     /* the payload cannot be read: dead-lettered (malformed_payload) */
} job_result;

typedef struct {
    const char *payload; /* the message body, not NUL-terminated */
    size_t payload_len;
    int64_t timeout_ns; /* bound on this attempt (Jetfleet-Timeout or the agent's default) */
    int attempt;        /* 1 for the first attempt */
    /* Set by a kind that succeeds with a result (docs/protocol.md §3.10): a
     * JSON document, NUL-terminated; empty: none. */
    char result[1024];
    /* Set by a kind that fails: */
    char error[512];
    const char *error_code; /* "handler_error" when left NULL; "timeout" for timeouts */
    void *job;              /* the agent's own record of the job */
} job_run;

typedef job_result (*kind_fn)(job_run *run);

/* The kind called name, or NULL when this agent does not run it. */
kind_fn kind_find(const char *name);
/* The names of every kind, NULL-terminated (the heartbeat's "kinds"). */
extern const char *const kind_names[];

/* Provided by agent.c: waits up to ns while the job runs; returns false at
 * once when the job is being stopped (cancelled, or handed back by a
 * stopping agent). Long jobs call it instead of sleeping. */
bool job_wait(job_run *run, int64_t ns);

/* Provided by agent.c: reports how far the job got (docs/protocol.md §3.9):
 * fraction from 0 to 1 and a short message (cut to 256 bytes). Returns
 * false, reporting nothing, for a fraction that is NaN or outside [0, 1].
 * Report as often as you like: the agent publishes at most one progress
 * event a second, the latest report, and extends the job's ack deadline. */
bool job_progress(job_run *run, double fraction, const char *message);

#endif
