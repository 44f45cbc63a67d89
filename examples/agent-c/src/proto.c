/* proto.c - see proto.h. */
#define _GNU_SOURCE /* timegm */
#include "proto.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * NS_PER_SEC + ts.tv_nsec;
}

int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_SEC + ts.tv_nsec;
}

/* ---- names (§1) ---- */

bool valid_token(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 128)
        return false;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '-' && *s != '_')
            return false;
    return true;
}

/* The code points that are no letter, mark, number, punctuation or symbol
 * (Unicode categories Z, Cc, Cf, Cs, Co and the noncharacters). Unassigned
 * code points are not listed: the Go agent rejects them too, this agent does
 * not (README.md). */
static const struct {
    uint32_t lo, hi;
} not_printable[] = {
    {0x0000, 0x0020},   {0x007F, 0x00A0},   {0x00AD, 0x00AD},   {0x0600, 0x0605},   {0x061C, 0x061C},
    {0x06DD, 0x06DD},   {0x070F, 0x070F},   {0x0890, 0x0891},   {0x08E2, 0x08E2},   {0x1680, 0x1680},
    {0x180E, 0x180E},   {0x2000, 0x200F},   {0x2028, 0x202F},   {0x205F, 0x2064},   {0x2066, 0x206F},
    {0x3000, 0x3000},   {0xD800, 0xDFFF},   {0xE000, 0xF8FF},   {0xFDD0, 0xFDEF},   {0xFEFF, 0xFEFF},
    {0xFFF0, 0xFFFB},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
    {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0x10FFFF},
};

static bool printable(uint32_t c)
{
    if ((c & 0xFFFE) == 0xFFFE) /* U+xFFFE, U+xFFFF: noncharacters */
        return false;
    for (size_t i = 0; i < sizeof(not_printable) / sizeof(not_printable[0]); i++)
        if (c >= not_printable[i].lo && c <= not_printable[i].hi)
            return false;
    return true;
}

bool valid_job_id(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t chars = 0;
    while (*p) {
        uint32_t c;
        int n;
        if (*p < 0x80)
            c = *p, n = 1;
        else if ((*p & 0xE0) == 0xC0)
            c = *p & 0x1F, n = 2;
        else if ((*p & 0xF0) == 0xE0)
            c = *p & 0x0F, n = 3;
        else if ((*p & 0xF8) == 0xF0)
            c = *p & 0x07, n = 4;
        else
            return false;
        for (int i = 1; i < n; i++) {
            if ((p[i] & 0xC0) != 0x80)
                return false; /* also stops at the terminating NUL */
            c = (c << 6) | (p[i] & 0x3F);
        }
        if ((n == 2 && c < 0x80) || (n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10FFFF)))
            return false; /* overlong, or past Unicode */
        if (!printable(c) || ++chars > JOB_ID_MAX_CHARS)
            return false;
        p += n;
    }
    return chars >= 1;
}

/* ---- ack subjects (§3.1) ---- */

static bool parse_u64(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        if (v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

bool parse_ack_subject(const char *subject, ack_subject *out)
{
    const char *tok[64];
    size_t len[64];
    int n = 0;
    const char *p = subject;

    memset(out, 0, sizeof(*out));
    for (;;) {
        const char *dot = strchr(p, '.');
        if (n == 64)
            return false;
        tok[n] = p;
        len[n] = dot ? (size_t)(dot - p) : strlen(p);
        n++;
        if (!dot)
            break;
        p = dot + 1;
    }
    if (n < 2 || len[0] != 3 || strncmp(tok[0], "$JS", 3) != 0 || len[1] != 3 || strncmp(tok[1], "ACK", 3) != 0)
        return false;

    int first; /* index of the <stream> token */
    if (n == 9)
        first = 2; /* v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending> */
    else if (n >= 11)
        first = 4; /* v2: $JS.ACK.<domain>.<account hash>.<stream>... then maybe more tokens */
    else
        return false;

    if (len[first] == 0 || len[first] > 128 || len[first + 1] == 0 || len[first + 1] > 128)
        return false;
    memcpy(out->stream, tok[first], len[first]);
    memcpy(out->consumer, tok[first + 1], len[first + 1]);
    uint64_t *nums[5] = {&out->delivered, &out->stream_seq, &out->consumer_seq, &out->timestamp_ns, &out->pending};
    for (int i = 0; i < 5; i++)
        if (!parse_u64(tok[first + 2 + i], len[first + 2 + i], nums[i]))
            return false;
    return true;
}

/* ---- job tokens (§3.3) ---- */

void base64_encode(const unsigned char *in, size_t n, char *out, bool url_unpadded)
{
    const char *abc = url_unpadded ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
                                   : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        size_t left = n - i;
        if (left > 1)
            v |= (uint32_t)in[i + 1] << 8;
        if (left > 2)
            v |= in[i + 2];
        out[o++] = abc[(v >> 18) & 63];
        out[o++] = abc[(v >> 12) & 63];
        if (left > 1)
            out[o++] = abc[(v >> 6) & 63];
        else if (!url_unpadded)
            out[o++] = '=';
        if (left > 2)
            out[o++] = abc[v & 63];
        else if (!url_unpadded)
            out[o++] = '=';
    }
    out[o] = '\0';
}

void job_token(const char *job_id, char out[JOB_TOKEN_MAX])
{
    bool plain = *job_id != '\0' && strncmp(job_id, "b64_", 4) != 0 && strlen(job_id) <= JOB_ID_MAX_CHARS;
    for (const char *p = job_id; plain && *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '=')
            plain = false;
    if (plain) {
        strcpy(out, job_id);
        return;
    }
    size_t n = strnlen(job_id, JOB_ID_MAX_BYTES); /* a valid job id is at most 1024 bytes */
    memcpy(out, "b64_", 4);
    base64_encode((const unsigned char *)job_id, n, out + 4, true);
}

/* ---- durations and times ---- */

bool parse_duration(const char *s, int64_t *ns)
{
    static const struct {
        const char *name;
        int64_t ns;
    } units[] = {
        {"ns", 1}, {"us", 1000}, {"\xc2\xb5s", 1000}, {"\xce\xbcs", 1000}, {"ms", NS_PER_MS},
        {"s", NS_PER_SEC}, {"m", 60 * NS_PER_SEC}, {"h", 3600 * NS_PER_SEC},
    };
    bool neg = false;
    int64_t total = 0;

    if (*s == '-' || *s == '+')
        neg = *s++ == '-';
    if (strcmp(s, "0") == 0) {
        *ns = 0;
        return true;
    }
    if (*s == '\0')
        return false;
    while (*s) {
        uint64_t whole = 0, frac = 0, scale = 1;
        bool digits = false;
        for (; isdigit((unsigned char)*s); s++, digits = true) {
            if (whole > (UINT64_MAX - 9) / 10)
                return false;
            whole = whole * 10 + (uint64_t)(*s - '0');
        }
        if (*s == '.') {
            for (s++; isdigit((unsigned char)*s); s++, digits = true)
                if (scale < UINT64_C(1000000000000000000)) { /* keep 18 digits, ignore the rest */
                    frac = frac * 10 + (uint64_t)(*s - '0');
                    scale *= 10;
                }
        }
        if (!digits)
            return false;
        size_t best = 0, ulen = 0;
        for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
            size_t l = strlen(units[i].name);
            if (strncmp(s, units[i].name, l) == 0 && l > ulen) {
                best = i;
                ulen = l;
            }
        }
        if (ulen == 0)
            return false; /* a unit is required */
        int64_t unit = units[best].ns;
        if (whole > (uint64_t)(INT64_MAX / unit))
            return false;
        int64_t v = (int64_t)whole * unit + (int64_t)((long double)frac * unit / scale);
        if (v < 0 || total > INT64_MAX - v)
            return false;
        total += v;
        s += ulen;
    }
    *ns = neg ? -total : total;
    return true;
}

static bool fixed_digits(const char *s, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

bool parse_rfc3339(const char *s, int64_t *ns)
{
    struct tm tm = {0};
    int year, mon, day, hour, min, sec, oh = 0, om = 0;
    if (strlen(s) < 20 || !fixed_digits(s, 4, &year) || s[4] != '-' || !fixed_digits(s + 5, 2, &mon) ||
        s[7] != '-' || !fixed_digits(s + 8, 2, &day) || s[10] != 'T' || !fixed_digits(s + 11, 2, &hour) ||
        s[13] != ':' || !fixed_digits(s + 14, 2, &min) || s[16] != ':' || !fixed_digits(s + 17, 2, &sec))
        return false;
    if (mon < 1 || mon > 12 || day < 1 || day > 31 || hour > 23 || min > 59 || sec > 60)
        return false;
    const char *p = s + 19;
    int64_t frac = 0;
    if (*p == '.') {
        int digits = 0;
        for (p++; isdigit((unsigned char)*p); p++, digits++)
            if (digits < 9)
                frac = frac * 10 + (*p - '0');
        if (digits == 0)
            return false;
        for (; digits < 9; digits++)
            frac *= 10;
    }
    int sign = 0;
    if (*p == 'Z' && p[1] == '\0') {
        sign = 0;
    } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && fixed_digits(p + 1, 2, &oh) && p[3] == ':' &&
               fixed_digits(p + 4, 2, &om)) {
        sign = *p == '+' ? 1 : -1;
    } else {
        return false;
    }
    tm.tm_year = year - 1900;
    tm.tm_mon = mon - 1;
    tm.tm_mday = day;
    tm.tm_hour = hour;
    tm.tm_min = min;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    t -= sign * (oh * 3600 + om * 60);
    *ns = (int64_t)t * NS_PER_SEC + frac;
    return true;
}

/* ---- JSON writer ---- */

void jb_init(jbuf *b) { memset(b, 0, sizeof(*b)); }

void jb_free(jbuf *b)
{
    free(b->buf);
    memset(b, 0, sizeof(*b));
}

static void jb_raw(jbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb) {
            b->failed = true;
            return;
        }
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

static void jb_cstr(jbuf *b, const char *s) { jb_raw(b, s, strlen(s)); }

/* Length of the valid UTF-8 sequence at p (at most n bytes), or 0. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len;
    uint32_t cp;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        len = 2;
        cp = p[0] & 0x1f;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        len = 3;
        cp = p[0] & 0x0f;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        len = 4;
        cp = p[0] & 0x07;
    } else {
        return 0;
    }
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return len;
}

void progress_message(const char *in, char out[PROGRESS_MESSAGE_MAX + 1])
{
    const unsigned char *p = (const unsigned char *)in;
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n && o < PROGRESS_MESSAGE_MAX;) {
        size_t l = p[i] < 0x80 ? 1 : utf8_len(p + i, n - i);
        bool c1 = l == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0; /* U+0080-U+009F */
        if (l == 0 || (l == 1 && (p[i] < 0x20 || p[i] == 0x7f)) || c1) {
            out[o++] = ' ';
            i += l == 0 ? 1 : l;
            continue;
        }
        if (o + l > PROGRESS_MESSAGE_MAX)
            break; /* a character never straddles the limit */
        memcpy(out + o, in + i, l);
        o += l;
        i += l;
    }
    out[o] = '\0';
}

/* Writes s as a JSON string; invalid UTF-8 becomes U+FFFD (documents hold
 * valid UTF-8, and headers or error messages may not). */
static void jb_quote(jbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    jb_raw(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c >= 0x80) {
            size_t l = utf8_len(p + i, n - i);
            if (l == 0) {
                jb_cstr(b, "\\ufffd");
                i++;
            } else {
                jb_raw(b, s + i, l);
                i += l;
            }
            continue;
        }
        char esc[7] = {'\\', 0, 0, 0, 0, 0, 0};
        switch (c) {
        case '"': esc[1] = '"'; jb_raw(b, esc, 2); break;
        case '\\': esc[1] = '\\'; jb_raw(b, esc, 2); break;
        case '\n': esc[1] = 'n'; jb_raw(b, esc, 2); break;
        case '\r': esc[1] = 'r'; jb_raw(b, esc, 2); break;
        case '\t': esc[1] = 't'; jb_raw(b, esc, 2); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                esc[1] = 'u';
                esc[2] = '0';
                esc[3] = '0';
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                jb_raw(b, esc, 6);
            } else {
                jb_raw(b, s + i, 1);
            }
        }
        i++;
    }
    jb_raw(b, "\"", 1);
}

/* Starts a value: a comma when one came before at this level, then "key":. */
static void jb_key(jbuf *b, const char *key)
{
    if (b->comma[b->depth])
        jb_raw(b, ",", 1);
    b->comma[b->depth] = true;
    if (key) {
        jb_quote(b, key, strlen(key));
        jb_raw(b, ":", 1);
    }
}

static void jb_open(jbuf *b, const char *key, const char *bracket)
{
    jb_key(b, key);
    jb_cstr(b, bracket);
    if (b->depth + 1 < (int)(sizeof(b->comma) / sizeof(b->comma[0])))
        b->depth++;
    else
        b->failed = true;
    b->comma[b->depth] = false;
}

static void jb_close(jbuf *b, const char *bracket)
{
    jb_cstr(b, bracket);
    if (b->depth > 0)
        b->depth--;
}

void jb_object(jbuf *b, const char *key) { jb_open(b, key, "{"); }
void jb_end_object(jbuf *b) { jb_close(b, "}"); }
void jb_array(jbuf *b, const char *key) { jb_open(b, key, "["); }
void jb_end_array(jbuf *b) { jb_close(b, "]"); }

void jb_str(jbuf *b, const char *key, const char *v)
{
    if (!v || !*v)
        return;
    jb_key(b, key);
    jb_quote(b, v, strlen(v));
}

void jb_elem_str(jbuf *b, const char *v)
{
    jb_key(b, NULL);
    jb_quote(b, v, strlen(v));
}

void jb_u64(jbuf *b, const char *key, uint64_t v)
{
    char num[32];
    if (v == 0)
        return;
    jb_key(b, key);
    snprintf(num, sizeof(num), "\"%" PRIu64 "\"", v);
    jb_cstr(b, num);
}

void jb_int(jbuf *b, const char *key, int64_t v)
{
    char num[32];
    if (v == 0)
        return;
    jb_key(b, key);
    snprintf(num, sizeof(num), "%" PRId64, v);
    jb_cstr(b, num);
}

void jb_double(jbuf *b, const char *key, double v)
{
    char num[40];
    if (v == 0)
        return;
    jb_key(b, key);
    /* The shortest of %.15g..%.17g that reads back as v: 0.4, not 0.40000000000000002. */
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(num, sizeof(num), "%.*g", digits, v);
        if (strtod(num, NULL) == v)
            break;
    }
    jb_cstr(b, num);
}

void jb_bool(jbuf *b, const char *key, bool v)
{
    if (!v)
        return;
    jb_key(b, key);
    jb_cstr(b, "true");
}

/* Fraction of a second as 0, 3, 6 or 9 digits, as proto3 JSON writes it. */
static void fraction(char out[32], int64_t nanos)
{
    if (nanos == 0)
        out[0] = '\0';
    else if (nanos % NS_PER_MS == 0)
        snprintf(out, 32, ".%03" PRId64, nanos / NS_PER_MS);
    else if (nanos % 1000 == 0)
        snprintf(out, 32, ".%06" PRId64, nanos / 1000);
    else
        snprintf(out, 32, ".%09" PRId64, nanos);
}

void jb_time(jbuf *b, const char *key, int64_t ns)
{
    char date[32], frac[32], out[96];
    struct tm tm;
    if (ns == 0)
        return;
    time_t secs = (time_t)(ns / NS_PER_SEC);
    gmtime_r(&secs, &tm);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%S", &tm);
    fraction(frac, ns % NS_PER_SEC);
    snprintf(out, sizeof(out), "\"%s%sZ\"", date, frac);
    jb_key(b, key);
    jb_cstr(b, out);
}

void jb_duration(jbuf *b, const char *key, int64_t ns)
{
    char frac[32], out[80];
    const char *sign = ns < 0 ? "-" : "";
    if (ns < 0)
        ns = -ns;
    fraction(frac, ns % NS_PER_SEC);
    snprintf(out, sizeof(out), "\"%s%" PRId64 "%ss\"", sign, ns / NS_PER_SEC, frac);
    jb_key(b, key);
    jb_cstr(b, out);
}

void jb_bytes(jbuf *b, const char *key, const void *p, size_t n)
{
    if (n == 0)
        return;
    char *enc = malloc(4 * ((n + 2) / 3) + 1);
    if (!enc) {
        b->failed = true;
        return;
    }
    base64_encode(p, n, enc, false);
    jb_key(b, key);
    jb_raw(b, "\"", 1);
    jb_cstr(b, enc);
    jb_raw(b, "\"", 1);
    free(enc);
}

/* ---- JSON reader ---- */

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* Returns the end of the string starting at p (on its opening quote), or NULL. */
static const char *skip_string(const char *p, const char *end)
{
    for (p++; p < end; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

/* Returns the end of the value starting at p, or NULL when it is malformed. */
static const char *skip_value(const char *p, const char *end, int depth)
{
    p = skip_ws(p, end);
    if (p >= end || depth > 64)
        return NULL;
    if (*p == '"')
        return skip_string(p, end);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = skip_ws(p + 1, end);
        if (p < end && *p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                p = skip_ws(p, end);
                if (p >= end || *p != '"' || !(p = skip_string(p, end)))
                    return NULL;
                p = skip_ws(p, end);
                if (p >= end || *p++ != ':')
                    return NULL;
            }
            if (!(p = skip_value(p, end, depth + 1)))
                return NULL;
            p = skip_ws(p, end);
            if (p >= end)
                return NULL;
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    /* number, true, false or null */
    const char *start = p;
    while (p < end && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.'))
        p++;
    return p > start ? p : NULL;
}

/* "stream_sequence" -> "streamSequence" */
static void lower_camel(const char *snake, char *out, size_t outsz)
{
    size_t o = 0;
    for (bool up = false; *snake && o + 1 < outsz; snake++) {
        if (*snake == '_') {
            up = true;
            continue;
        }
        out[o++] = up ? (char)toupper((unsigned char)*snake) : *snake;
        up = false;
    }
    out[o] = '\0';
}

bool json_member(const char *doc, size_t len, const char *snake_name, json_value *out)
{
    const char *p = doc, *end = doc + len;
    char camel[64];
    lower_camel(snake_name, camel, sizeof(camel));

    p = skip_ws(p, end);
    if (p >= end || *p++ != '{')
        return false;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"')
            return false; /* the end of the object, or malformed */
        const char *key = p + 1, *key_end = skip_string(p, end);
        if (!key_end)
            return false;
        size_t klen = (size_t)(key_end - 1 - key);
        p = skip_ws(key_end, end);
        if (p >= end || *p++ != ':')
            return false;
        p = skip_ws(p, end);
        const char *vend = skip_value(p, end, 0);
        if (!vend)
            return false;
        if ((klen == strlen(snake_name) && memcmp(key, snake_name, klen) == 0) ||
            (klen == strlen(camel) && memcmp(key, camel, klen) == 0)) {
            out->p = p;
            out->n = (size_t)(vend - p);
            return true;
        }
        p = skip_ws(vend, end);
        if (p >= end || *p++ != ',')
            return false;
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Appends code point cp as UTF-8 when it fits. */
static size_t put_utf8(char *out, size_t o, size_t outsz, uint32_t cp)
{
    char tmp[4];
    size_t n;
    if (cp < 0x80) {
        tmp[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        tmp[0] = (char)(0xc0 | (cp >> 6));
        tmp[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        tmp[0] = (char)(0xe0 | (cp >> 12));
        tmp[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        tmp[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        tmp[0] = (char)(0xf0 | (cp >> 18));
        tmp[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        tmp[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        tmp[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    if (o + n >= outsz)
        return o;
    memcpy(out + o, tmp, n);
    return o + n;
}

bool json_string(json_value v, char *out, size_t outsz)
{
    size_t o = 0;
    if (v.n < 2 || v.p[0] != '"' || outsz == 0)
        return false;
    for (size_t i = 1; i < v.n - 1; i++) {
        char c = v.p[i];
        if (c != '\\') {
            if (o + 1 < outsz)
                out[o++] = c;
            continue;
        }
        if (++i >= v.n - 1)
            return false;
        switch (v.p[i]) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'u': {
            uint32_t cp = 0;
            if (i + 4 >= v.n - 1)
                return false;
            for (int k = 1; k <= 4; k++) {
                int h = hexval(v.p[i + k]);
                if (h < 0)
                    return false;
                cp = cp << 4 | (uint32_t)h;
            }
            i += 4;
            /* a surrogate pair */
            if (cp >= 0xd800 && cp <= 0xdbff && i + 6 < v.n - 1 && v.p[i + 1] == '\\' && v.p[i + 2] == 'u') {
                uint32_t lo = 0;
                bool ok = true;
                for (int k = 3; k <= 6; k++) {
                    int h = hexval(v.p[i + k]);
                    ok = ok && h >= 0;
                    lo = lo << 4 | (uint32_t)(h < 0 ? 0 : h);
                }
                if (ok && lo >= 0xdc00 && lo <= 0xdfff) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    i += 6;
                }
            }
            if (cp >= 0xd800 && cp <= 0xdfff)
                cp = 0xfffd;
            o = put_utf8(out, o, outsz, cp);
            continue;
        }
        default: c = v.p[i]; /* \" \\ \/ */
        }
        if (o + 1 < outsz)
            out[o++] = c;
    }
    out[o] = '\0';
    return true;
}

bool json_uint64(json_value v, uint64_t *out)
{
    const char *p = v.p;
    size_t n = v.n;
    if (n >= 2 && p[0] == '"') { /* 64-bit integers may be strings (§5) */
        p++;
        n -= 2;
    }
    return parse_u64(p, n, out);
}

bool json_bool(json_value v, bool *out)
{
    if (v.n == 4 && memcmp(v.p, "true", 4) == 0)
        *out = true;
    else if (v.n == 5 && memcmp(v.p, "false", 5) == 0)
        *out = false;
    else
        return false;
    return true;
}

bool json_each_string(json_value v, bool (*fn)(const char *s, void *arg), void *arg)
{
    const char *p = v.p, *end = v.p + v.n;
    char s[256];
    if (p >= end || *p++ != '[')
        return false;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p == ']')
            return false;
        const char *e = skip_value(p, end, 0);
        if (!e)
            return false;
        json_value item = {p, (size_t)(e - p)};
        if (json_string(item, s, sizeof(s)) && fn(s, arg))
            return true;
        p = skip_ws(e, end);
        if (p < end && *p == ',')
            p++;
    }
}
