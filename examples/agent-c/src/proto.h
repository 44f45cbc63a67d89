/*
 * proto.h - the pieces of docs/protocol.md that are plain data handling:
 * names, ack subjects, job tokens, durations, times and JSON documents.
 * Nothing here talks to NATS.
 */
#ifndef JETFLEET_PROTO_H
#define JETFLEET_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NS_PER_MS INT64_C(1000000)
#define NS_PER_SEC INT64_C(1000000000)

/* Wall-clock time (for documents) and monotonic time (for intervals), in ns. */
int64_t wall_ns(void);
int64_t mono_ns(void);

/* §1 Names: a queue, kind or agent id is 1-128 of A-Z a-z 0-9 - _. */
bool valid_token(const char *s);
/* §1 Names: a job id is valid UTF-8 of 1-256 characters (code points), each a
 * letter, mark, number, punctuation or symbol: up to 1024 bytes. */
#define JOB_ID_MAX_CHARS 256
#define JOB_ID_MAX_BYTES (4 * JOB_ID_MAX_CHARS)
bool valid_job_id(const char *s);

/* §3.1 The ack subject of a delivery, v1 (9 tokens) or v2 (11 or more). */
typedef struct {
    char stream[129];
    char consumer[129];
    uint64_t delivered;      /* deliveries of this message, this one included */
    uint64_t stream_seq;     /* identifies the job message in JOBS */
    uint64_t consumer_seq;
    uint64_t timestamp_ns;
    uint64_t pending;
} ack_subject;
bool parse_ack_subject(const char *subject, ack_subject *out);

/* §3.3 The job token: the id itself, or "b64_" + unpadded base64url of it.
 * out must hold 4 + 4*ceil(JOB_ID_MAX_BYTES/3) + 1 bytes; JOB_TOKEN_MAX is enough. */
#define JOB_TOKEN_MAX 1376
void job_token(const char *job_id, char out[JOB_TOKEN_MAX]);

/* §2.1 Durations as Go writes them: "250ms", "1.5s", "1m30s" (ns us ms s m h). */
bool parse_duration(const char *s, int64_t *ns);
/* RFC 3339 time to ns since the epoch. */
bool parse_rfc3339(const char *s, int64_t *ns);

/* Base64 (standard alphabet, padded) for proto3 bytes, and base64url without
 * padding for job tokens. out needs 4*ceil(n/3)+1 bytes. */
void base64_encode(const unsigned char *in, size_t n, char *out, bool url_unpadded);

/*
 * JSON writer for the documents of §5: canonical proto3 JSON, snake_case
 * names, zero values omitted, 64-bit integers as strings, timestamps as
 * RFC 3339 strings, durations as "1.5s".
 */
typedef struct {
    char *buf;
    size_t len, cap;
    int depth;
    bool comma[16]; /* per nesting level: a value was already written */
    bool failed;    /* out of memory */
} jbuf;

void jb_init(jbuf *b);
void jb_free(jbuf *b);
void jb_object(jbuf *b, const char *key); /* key NULL: top level or array element */
void jb_end_object(jbuf *b);
void jb_array(jbuf *b, const char *key);
void jb_end_array(jbuf *b);
void jb_str(jbuf *b, const char *key, const char *v);      /* omitted when empty */
void jb_elem_str(jbuf *b, const char *v);                  /* array element */
void jb_u64(jbuf *b, const char *key, uint64_t v);         /* "42", omitted when 0 */
void jb_int(jbuf *b, const char *key, int64_t v);          /* 42, omitted when 0 */
void jb_bool(jbuf *b, const char *key, bool v);            /* omitted when false */
void jb_time(jbuf *b, const char *key, int64_t ns);        /* omitted when 0 */
void jb_duration(jbuf *b, const char *key, int64_t ns);    /* always written */
void jb_bytes(jbuf *b, const char *key, const void *p, size_t n); /* base64, omitted when empty */
void jb_double(jbuf *b, const char *key, double v);        /* shortest form that reads back, omitted when 0; finite only */

/* §3.9 A progress message: at most 256 bytes of valid UTF-8, cut on a
 * character boundary, invalid bytes and control characters (C0, DEL, C1)
 * replaced by spaces. */
#define PROGRESS_MESSAGE_MAX 256
void progress_message(const char *in, char out[PROGRESS_MESSAGE_MAX + 1]);

/*
 * JSON reader, just enough for the documents an agent reads (a JobEvent, a
 * Heartbeat, an AgentCommand). json_member finds a member of the top-level
 * object by its snake_case name or its lowerCamelCase form (§5: readers accept
 * both) and returns its raw value, or NULL.
 */
typedef struct {
    const char *p;
    size_t n;
} json_value;

bool json_member(const char *doc, size_t len, const char *snake_name, json_value *out);
bool json_string(json_value v, char *out, size_t outsz); /* unescaped, truncated to outsz-1 */
bool json_uint64(json_value v, uint64_t *out);          /* number or string */
bool json_bool(json_value v, bool *out);
/* Calls fn for each string of an array; stops early when fn returns true,
 * and then returns true. */
bool json_each_string(json_value v, bool (*fn)(const char *s, void *arg), void *arg);

#endif
