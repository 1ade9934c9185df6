/* hsubmit in C: the submit path of hai_cluster/cli/hsubmit.py, which stays the reference (and runs
 * --help). A submission is one process start; a Python one costs ~7 ms of interpreter start before
 * any work, sbatch (C) ~7 ms in all. Built by `python -m hai_cluster.native.build` into the venv's
 * bin, over pip's Python launcher; without a C compiler the Python hsubmit is the one installed.
 *
 * The controller does the work (options, directives, checks); the client sends its argv, cwd,
 * environment and umask, and the script when the answer asks for it (protocol/framing.py: a 4-byte
 * big-endian length, then one msgpack map). Replies are read with bounds checks throughout:
 * garbage on the socket is "bad reply from the controller", never a crash.
 * Build: cc -O2 -DHAI_PYTHON='"/venv/bin/python"' -o hsubmit hsubmit.c */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef HAI_PYTHON
#error "define HAI_PYTHON, the interpreter that runs hsubmit --help (python -m hai_cluster.native.build does)"
#endif
#ifndef HAI_TIMEOUT_SECONDS
#define HAI_TIMEOUT_SECONDS 60 /* as the Python client's; the tests build one with less */
#endif
#define MAX_FRAME 16777216u /* framing.MAX_FRAME_BYTES */
#define MAX_DEPTH 500       /* nesting a reply may have (Python's recursion limit would stop it near here) */
#define RETRY_WINDOW 20.0   /* hsubmit.py's: seconds a retry waits for a controller that restarts */

extern char **environ;
typedef unsigned char u8;
typedef struct { u8 *p; size_t len, cap; } Buf;

/* The name messages start with: hsubmit, or sbatch (the same program under Slurm's name). */
static const char *prog = "hsubmit";
/* Set while a submission is sent again after its reply was lost: the first failure. Every error
 * from then on says the job may have been submitted, as hsubmit.py's _call does. */
static char lost[512];

static void error_head(void) {
    fflush(stdout);
    fprintf(stderr, "%s: error: ", prog);
    if (lost[0]) fprintf(stderr, "%s; the job may have been submitted: check hqueue (retrying failed: ", lost);
}

static void die(const char *fmt, ...) {
    va_list ap;
    error_head();
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (lost[0]) fputc(')', stderr);
    fputc('\n', stderr);
    exit(1);
}

/* ---- growable buffer and msgpack writer (what minipack.packb writes, byte for byte) ---------- */

static void reserve(Buf *b, size_t n) {
    if (n > SIZE_MAX / 2 - b->len) die("out of memory");
    if (b->len + n <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    u8 *p = realloc(b->p, cap);
    if (!p) die("out of memory");
    b->p = p;
    b->cap = cap;
}

static void put(Buf *b, const void *data, size_t n) {
    reserve(b, n);
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_be(Buf *b, int code, uint64_t v, int nbytes) {
    u8 t[9];
    int k = 0;
    if (code >= 0) t[k++] = (u8)code;
    for (int i = nbytes - 1; i >= 0; i--) t[k++] = (u8)(v >> (8 * i));
    put(b, t, (size_t)k);
}

/* fix: the fix-size code (or -1), taken below fix_limit; c8 < 0 when there is no 8-bit form. */
static void put_head(Buf *b, size_t n, int fix, size_t fix_limit, int c8, int c16, int c32) {
    if (fix >= 0 && n < fix_limit) put_be(b, fix | (int)n, 0, 0);
    else if (c8 >= 0 && n < 256) put_be(b, c8, n, 1);
    else if (n < 65536) put_be(b, c16, n, 2);
    else if ((uint64_t)n <= 0xffffffffu) put_be(b, c32, n, 4);
    else die("a value of %zu bytes or items is too big for msgpack", n);
}

static void put_str(Buf *b, const char *s, size_t n) {
    put_head(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
    put(b, s, n);
}
static void put_cstr(Buf *b, const char *s) { put_str(b, s, strlen(s)); }
static void put_array(Buf *b, size_t n) { put_head(b, n, 0x90, 16, -1, 0xdc, 0xdd); }
static void put_map(Buf *b, size_t n) { put_head(b, n, 0x80, 16, -1, 0xde, 0xdf); }
static void put_bool(Buf *b, int v) { put_be(b, v ? 0xc3 : 0xc2, 0, 0); }

static void put_int(Buf *b, int64_t v) {
    if (v >= -32 && v < 128) put_be(b, (u8)(int8_t)v, 0, 0);
    else if (v > 0) {
        uint64_t u = (uint64_t)v;
        if (u < 256) put_be(b, 0xcc, u, 1);
        else if (u < 65536) put_be(b, 0xcd, u, 2);
        else if (u <= 0xffffffffu) put_be(b, 0xce, u, 4);
        else put_be(b, 0xcf, u, 8);
    } else if (v >= INT8_MIN) put_be(b, 0xd0, (uint64_t)v, 1);
    else if (v >= INT16_MIN) put_be(b, 0xd1, (uint64_t)v, 2);
    else if (v >= INT32_MIN) put_be(b, 0xd2, (uint64_t)v, 4);
    else put_be(b, 0xd3, (uint64_t)v, 8);
}

/* ---- UTF-8: the protocol's strings must be valid (the controller decodes them strictly) ------ */

/* Length of the valid UTF-8 sequence at s (n > 0 bytes left), 0 when none starts there. */
static size_t utf8_seq(const u8 *s, size_t n) {
    u8 c = s[0], lo = 0x80, hi = 0xbf;
    size_t len;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) { len = 3; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    else return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

/* Offset of the first byte that is not part of valid UTF-8; n when all is valid. */
static size_t utf8_bad(const u8 *s, size_t n) {
    size_t i = 0, k;
    while (i < n && (k = utf8_seq(s + i, n - i)) > 0) i += k;
    return i;
}

/* s with each invalid byte written \xNN, as Python's backslashreplace shows it (NUL-terminated). */
static const char *shown(const char *s) {
    static Buf out;
    size_t n = strlen(s), i = 0, k;
    char esc[5];
    out.len = 0;
    while (i < n) {
        if ((k = utf8_seq((const u8 *)s + i, n - i)) > 0) { put(&out, s + i, k); i += k; continue; }
        snprintf(esc, sizeof esc, "\\x%02x", (u8)s[i++]);
        put(&out, esc, 4);
    }
    put(&out, "", 1);
    return (const char *)out.p;
}

/* ---- msgpack reader: every read is bounds-checked; a reply is validated whole before use ----- */

/* The controller's error text: one "prog: error: " line per line of it (a refused submission lists
 * every refusal), control bytes shown as \xNN, as hsubmit.py's fail() prints it. */
static void die_lines(const char *s, size_t len) {
    error_head();
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '\n') fprintf(stderr, "\n%s: error: ", prog);
        else if (ch < 0x20 || ch == 0x7f) fprintf(stderr, "\\x%02x", ch);
        else fputc(ch, stderr);
    }
    if (lost[0]) fputc(')', stderr);
    fputc('\n', stderr);
    exit(1);
}

static char decode_error[128];

static int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(decode_error, sizeof decode_error, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t be(const u8 *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v = v << 8 | p[i];
    return v;
}

enum { SCALAR, STR, BIN, ARRAY, MAP };

/* The value at *pos: its kind and length (bytes of a str/bin, items of an array/map), *pos moved
 * past its head (past the whole value for a scalar). -1 on truncation or an unsupported type. */
static int head(const u8 *p, size_t n, size_t *pos, int *kind, uint64_t *len) {
    static const u8 fixed[] = {[0xca] = 4, [0xcb] = 8, [0xcc] = 1, [0xcd] = 2, [0xce] = 4, [0xcf] = 8,
                               [0xd0] = 1, [0xd1] = 2, [0xd2] = 4, [0xd3] = 8};
    int k = 0;
    if (*pos >= n) return bad("truncated data");
    u8 c = p[(*pos)++];
    *kind = SCALAR;
    *len = 0;
    if (c < 0x80 || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) return 0;
    if (c >= 0xca && c <= 0xd3) {
        if (n - *pos < fixed[c]) return bad("truncated data");
        *pos += fixed[c];
        return 0;
    }
    if ((c & 0xe0) == 0xa0) { *kind = STR; *len = c & 0x1f; }
    else if ((c & 0xf0) == 0x90) { *kind = ARRAY; *len = c & 0x0f; }
    else if ((c & 0xf0) == 0x80) { *kind = MAP; *len = c & 0x0f; }
    else switch (c) {
        case 0xd9: *kind = STR; k = 1; break;
        case 0xda: *kind = STR; k = 2; break;
        case 0xdb: *kind = STR; k = 4; break;
        case 0xc4: *kind = BIN; k = 1; break;
        case 0xc5: *kind = BIN; k = 2; break;
        case 0xc6: *kind = BIN; k = 4; break;
        case 0xdc: *kind = ARRAY; k = 2; break;
        case 0xdd: *kind = ARRAY; k = 4; break;
        case 0xde: *kind = MAP; k = 2; break;
        case 0xdf: *kind = MAP; k = 4; break;
        default: return bad("unsupported msgpack type byte 0x%02x", c);
    }
    if (k) {
        if (n - *pos < (size_t)k) return bad("truncated data");
        *len = be(p + *pos, k);
        *pos += (size_t)k;
    }
    if (*len > n - *pos) return bad("truncated data"); /* a str's bytes; an item takes a byte at least */
    return 0;
}

/* Moves *pos past one value, checking all of it as minipack.unpackb would: strings valid UTF-8,
 * no array or map as a map key. */
static int skip(const u8 *p, size_t n, size_t *pos, int depth) {
    int kind;
    uint64_t len;
    if (depth > MAX_DEPTH) return bad("nested too deep");
    if (head(p, n, pos, &kind, &len) < 0) return -1;
    if (kind == STR || kind == BIN) {
        if (kind == STR && utf8_bad(p + *pos, len) != len) return bad("invalid UTF-8 in a string");
        *pos += len;
    } else if (kind == ARRAY || kind == MAP) {
        for (uint64_t i = 0; i < len; i++) {
            if (kind == MAP) {
                if (*pos < n && ((p[*pos] & 0xe0) == 0x80 || p[*pos] == 0xdc || p[*pos] == 0xdd ||
                                 p[*pos] == 0xde || p[*pos] == 0xdf))
                    return bad("an array or map as a map key");
                if (skip(p, n, pos, depth + 1) < 0) return -1;
            }
            if (skip(p, n, pos, depth + 1) < 0) return -1;
        }
    }
    return 0;
}

/* A value in a validated payload: where it starts. Reads below rely on that validation. */
typedef struct { const u8 *p; size_t n, pos; } Val;

static const char *type_name(Val v) {
    u8 c = v.p[v.pos];
    if (c < 0x80 || c >= 0xe0 || (c >= 0xcc && c <= 0xd3)) return "int";
    if (c == 0xc0) return "NoneType";
    if (c == 0xc2 || c == 0xc3) return "bool";
    if (c == 0xca || c == 0xcb) return "float";
    if ((c & 0xe0) == 0xa0 || (c >= 0xd9 && c <= 0xdb)) return "str";
    if (c >= 0xc4 && c <= 0xc6) return "bytes";
    if ((c & 0xf0) == 0x90 || c == 0xdc || c == 0xdd) return "list";
    return "dict";
}

static int is_kind(Val v, int want, uint64_t *len) {
    int kind;
    size_t pos = v.pos;
    return head(v.p, v.n, &pos, &kind, len) == 0 && kind == want;
}

static Val next(Val v) { /* the value after v */
    skip(v.p, v.n, &v.pos, 0);
    return v;
}

/* The value under key in map m (the last one, as a dict keeps it); 0 when m is no map or lacks it. */
static int lookup(Val m, const char *key, Val *out) {
    uint64_t count;
    int kind, found = 0;
    size_t klen = strlen(key);
    if (!is_kind(m, MAP, &count)) return 0;
    head(m.p, m.n, &m.pos, &kind, &count);
    for (uint64_t i = 0; i < count; i++) {
        Val k = m, v = next(m);
        uint64_t len;
        size_t at = k.pos;
        if (head(k.p, k.n, &at, &kind, &len) == 0 && kind == STR && len == klen && !memcmp(k.p + at, key, klen)) {
            *out = v;
            found = 1;
        }
        m = next(v);
    }
    return found;
}

static int get_str(Val v, const char **s, size_t *len) {
    uint64_t n;
    int kind;
    if (!is_kind(v, STR, &n)) return 0;
    head(v.p, v.n, &v.pos, &kind, &n);
    *s = (const char *)v.p + v.pos;
    *len = n;
    return 1;
}

static int str_is(Val v, const char *want) {
    const char *s;
    size_t n;
    return get_str(v, &s, &n) && n == strlen(want) && !memcmp(s, want, n);
}

static int get_int(Val v, int64_t *out) {
    u8 c = v.p[v.pos];
    const u8 *d = v.p + v.pos + 1;
    if (c < 0x80) *out = c;
    else if (c >= 0xe0) *out = (int8_t)c;
    else if (c >= 0xcc && c <= 0xcf) {
        uint64_t u = be(d, 1 << (c - 0xcc));
        if (u > INT64_MAX) return 0;
        *out = (int64_t)u;
    } else if (c == 0xd0) *out = (int8_t)d[0];
    else if (c == 0xd1) *out = (int16_t)be(d, 2);
    else if (c == 0xd2) *out = (int32_t)be(d, 4);
    else if (c == 0xd3) *out = (int64_t)be(d, 8);
    else return 0;
    return 1;
}

static int get_bool(Val v, int *out) {
    if (v.p[v.pos] != 0xc2 && v.p[v.pos] != 0xc3) return 0;
    *out = v.p[v.pos] == 0xc3;
    return 1;
}

static int truthy(Val v) { /* Python's truth of the value (a float is garbage here anyway) */
    uint64_t len;
    int64_t i;
    int kind;
    size_t pos = v.pos;
    if (get_int(v, &i)) return i != 0;
    if (v.p[v.pos] == 0xc0 || v.p[v.pos] == 0xc2) return 0;
    head(v.p, v.n, &pos, &kind, &len);
    return kind == SCALAR || len > 0;
}

/* ---- the connection: frames out, the response to our request back ---------------------------- */

typedef struct { int fd; Buf in; int64_t next_id; const char *path; } Conn;
typedef struct { u8 *payload; Val body; } Reply;


/* What try_call got: the response, a lost reply (sent, or maybe sent, and no answer), or a
 * refusal that says "try again" (while retrying only); `failure` says why it was not the response. */
enum { GOT, LOST, BUSY };
static char failure[512];

static int io_lost(void) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        snprintf(failure, sizeof failure, "no answer from the controller within %d s", HAI_TIMEOUT_SECONDS);
    else
        snprintf(failure, sizeof failure, "connection to the controller failed: [Errno %d] %s", errno, strerror(errno));
    return LOST;
}

/* Connects; 0, or -1 with the reason in `failure`. */
static int conn_try_open(Conn *c) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = HAI_TIMEOUT_SECONDS};
    const char *env = getenv("HAI_CONTROLLER");
    c->path = env && *env ? env : "/run/hai/controller.sock"; /* paths.client_socket() */
    c->in.len = 0;
    c->next_id = 1;
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        io_lost();
        return -1;
    }
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const char *why = "AF_UNIX path too long";
    if (strlen(c->path) < sizeof addr.sun_path) {
        strcpy(addr.sun_path, c->path);
        while (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0)
            if (errno != EINTR) { why = strerror(errno); goto failed; }
        return 0;
    }
failed:
    close(c->fd);
    c->fd = -1;
    snprintf(failure, sizeof failure,
             "cannot reach the controller at %s: %s (is hai-controller running? HAI_CONTROLLER names its socket)",
             c->path, why);
    return -1;
}

static void conn_open(Conn *c) {
    if (conn_try_open(c) < 0) die("%s", failure);
}

static void conn_close(Conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Checks a message as messages.parse_message does; 1 when it is the response to request id, 2
 * when that is a refusal saying "try again" while a submission is retried (the text in `failure`). */
static int our_response(const u8 *p, size_t n, int64_t id, Reply *out) {
    Val msg = {p, n, 0}, v, k, f;
    size_t end = 0;
    int64_t i;
    int ok;
    const char *s;
    size_t len;
    if (skip(p, n, &end, 0) < 0) die("bad reply from the controller: undecodable frame: %s", decode_error);
    if (end != n) die("bad reply from the controller: undecodable frame: %zu bytes after the object", n - end);
    if (!is_kind(msg, MAP, &(uint64_t){0}))
        die("bad reply from the controller: frame is a %s, expected a map", type_name(msg));
    if (!lookup(msg, "v", &v) || !get_int(v, &i) || i != 1)
        die("bad reply from the controller: protocol version is not supported (this side speaks [1])");
    if (!lookup(msg, "k", &k) || !(str_is(k, "res") || str_is(k, "req") || str_is(k, "evt")))
        die("bad reply from the controller: unknown message kind");
    if (!str_is(k, "evt") && !(lookup(msg, "id", &f) && get_int(f, &i)))
        die("bad reply from the controller: message field 'id' is missing or has the wrong type");
    if (!str_is(k, "res")) {
        if (!(lookup(msg, "m", &f) && get_str(f, &s, &len)))
            die("bad reply from the controller: message field 'm' is missing or has the wrong type");
        return 0; /* a request or an event: not for hsubmit */
    }
    if (!(lookup(msg, "ok", &f) && get_bool(f, &ok)))
        die("bad reply from the controller: message field 'ok' is missing or has the wrong type");
    int has_error = lookup(msg, "e", &f) && get_str(f, &s, &len);
    if (!ok && !has_error) die("bad reply from the controller: error response without an error text");
    if (i != id) return 0;
    if (!ok && lost[0] && memmem(s, len, "try again", 9)) {
        snprintf(failure, sizeof failure, "%.*s", (int)(len < 500 ? len : 500), s);
        return 2;
    }
    if (!ok) die_lines(s, len); /* the controller's own error */
    out->payload = malloc(n ? n : 1);
    if (!out->payload) die("out of memory");
    memcpy(out->payload, p, n);
    Val m = {out->payload, n, 0};
    static const u8 nil = 0xc0;
    if (!lookup(m, "b", &out->body)) out->body = (Val){&nil, 1, 0};
    return 1;
}

/* Sends {"v":1,"k":"req","id":N,"m":method,"b":<body, already packed>}; GOT with the response's
 * body in *reply, or why not. Garbage in the answer ends the program. */
static int try_call(Conn *c, const char *method, const Buf *body, Reply *reply) {
    Buf out = {0};
    int64_t id = c->next_id++;
    put(&out, "\0\0\0\0", 4);
    put_map(&out, 5);
    put_cstr(&out, "v"); put_int(&out, 1);
    put_cstr(&out, "k"); put_cstr(&out, "req");
    put_cstr(&out, "id"); put_int(&out, id);
    put_cstr(&out, "m"); put_cstr(&out, method);
    put_cstr(&out, "b"); put(&out, body->p, body->len);
    size_t payload = out.len - 4;
    if (payload > MAX_FRAME)
        die("bad reply from the controller: frame of %zu bytes exceeds the %u-byte limit", payload, MAX_FRAME);
    for (int i = 0; i < 4; i++) out.p[i] = (u8)(payload >> (24 - 8 * i));
    for (size_t sent = 0; sent < out.len;) {
        ssize_t r = send(c->fd, out.p + sent, out.len - sent, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            free(out.p);
            return io_lost();
        }
        sent += (size_t)r;
    }
    free(out.p);
    for (;;) {
        while (c->in.len >= 4) {
            uint64_t len = be(c->in.p, 4);
            if (len > MAX_FRAME)
                die("bad reply from the controller: frame length %llu exceeds the %u-byte limit",
                    (unsigned long long)len, MAX_FRAME);
            if (c->in.len - 4 < len) break;
            int mine = our_response(c->in.p + 4, (size_t)len, id, reply);
            c->in.len -= 4 + (size_t)len; /* what follows stays for a later call on this connection */
            memmove(c->in.p, c->in.p + 4 + len, c->in.len);
            if (mine) return mine == 1 ? GOT : BUSY;
        }
        reserve(&c->in, 65536);
        ssize_t r = recv(c->fd, c->in.p + c->in.len, 65536, 0);
        if (r == 0) {
            snprintf(failure, sizeof failure, "the controller closed the connection");
            return LOST;
        }
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return io_lost();
        c->in.len += (size_t)r;
    }
}

static Reply call(Conn *c, const char *method, const Buf *body) {
    Reply reply;
    if (try_call(c, method, body, &reply) != GOT) die("%s", failure);
    return reply;
}

static double monotonic(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* The submit request; sent once more, on a new connection and with the same key, when its reply
 * was lost (the controller died after its commit, say): the controller then answers with the job
 * the first one created. hsubmit.py's _call, step for step. */
static Reply submit_call(Conn *c, const Buf *body) {
    Reply reply;
    if (try_call(c, "submit", body, &reply) == GOT) return reply;
    snprintf(lost, sizeof lost, "%s", failure);
    conn_close(c);
    double deadline = monotonic() + RETRY_WINDOW;
    for (;;) {
        int got = conn_try_open(c) < 0 ? BUSY : try_call(c, "submit", body, &reply);
        if (got == GOT) {
            lost[0] = 0;
            return reply;
        }
        if (got == LOST || monotonic() >= deadline) die_lines(failure, strlen(failure));
        conn_close(c);
        nanosleep(&(struct timespec){0, 500000000}, NULL);
    }
}

/* ---- hsubmit ------------------------------------------------------------------------------------ */

static void read_all(int fd, Buf *b, const char *path) {
    for (;;) {
        reserve(b, 65536);
        ssize_t r = read(fd, b->p + b->len, 65536);
        if (r == 0) return;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && path) die("Unable to open file %s: %s", path, strerror(errno));
        if (r < 0) die("cannot read standard input: %s", strerror(errno));
        b->len += (size_t)r;
    }
}

/* The script, as hsubmit.py's decoded() makes it: strict UTF-8, \r\n and \r read as \n. */
static void script_text(Buf *b, const char *what) {
    size_t at = utf8_bad(b->p, b->len), j = 0;
    if (at != b->len) die("%s is not valid UTF-8 (byte 0x%02x at offset %zu)", what, b->p[at], at);
    for (size_t i = 0; i < b->len; i++) {
        if (b->p[i] == '\r') {
            b->p[j++] = '\n';
            if (i + 1 < b->len && b->p[i + 1] == '\n') i++;
        } else b->p[j++] = b->p[i];
    }
    b->len = j;
}

/* cwd, env and umask, packed as map entries; the same checks and order as hsubmit.py's not_utf8. */
static size_t common_fields(Buf *b, char **argv) {
    size_t cap = 256, count = 0, i, j;
    char *cwd = NULL;
    for (;;) {
        if (!(cwd = realloc(cwd, cap))) die("out of memory");
        if (getcwd(cwd, cap)) break;
        if (errno != ERANGE) die("cannot read the working directory: %s", strerror(errno));
        cap *= 2;
    }
    if (utf8_bad((u8 *)cwd, strlen(cwd)) != strlen(cwd))
        die("the working directory %s is not valid UTF-8", shown(cwd));
    put_cstr(b, "cwd");
    put_cstr(b, cwd);
    free(cwd);
    /* os.environ: entries with '=', the first of a repeated name */
    size_t n = 0;
    while (environ[n]) n++;
    char *keep = calloc(n + 1, 1);
    if (!keep) die("out of memory");
    for (i = 0; i < n; i++) {
        const char *eq = strchr(environ[i], '=');
        if (!eq) continue;
        size_t klen = (size_t)(eq - environ[i]);
        for (j = 0; j < i; j++)
            if (keep[j] && !strncmp(environ[j], environ[i], klen) && environ[j][klen] == '=') break;
        if (j < i) continue;
        size_t len = strlen(environ[i]);
        if (utf8_bad((u8 *)environ[i], len) != len) {
            char *name = strndup(environ[i], klen);
            die("environment variable %s is not valid UTF-8", shown(name ? name : ""));
        }
        keep[i] = 1;
        count++;
    }
    put_cstr(b, "env");
    put_map(b, count);
    for (i = 0; i < n; i++) {
        if (!keep[i]) continue;
        const char *eq = strchr(environ[i], '=');
        put_str(b, environ[i], (size_t)(eq - environ[i]));
        put_cstr(b, eq + 1);
    }
    free(keep);
    for (i = 0; argv[i]; i++)
        if (utf8_bad((u8 *)argv[i], strlen(argv[i])) != strlen(argv[i]))
            die("argument %s is not valid UTF-8", shown(argv[i]));
    mode_t mask = umask(022); /* reading it means setting it: put it back at once */
    umask(mask);
    put_cstr(b, "umask");
    put_int(b, mask);
    /* the idempotency key (hsubmit.py's os.urandom(16).hex()): a retry finds the job it made */
    u8 raw[16];
    char key[33];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) die("cannot read random bytes: %s", strerror(errno));
    for (i = 0; i < sizeof raw; i++) sprintf(key + 2 * i, "%02x", raw[i]);
    put_cstr(b, "key");
    put_cstr(b, key);
    return 4;
}

static int is_final(Val state) {
    static const char *const final[] = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"};
    for (size_t i = 0; i < sizeof final / sizeof *final; i++)
        if (str_is(state, final[i])) return 1;
    return 0;
}

/* sbatch -W: poll until every task of the job ended; the highest exit code (1 for one without). */
static int wait_for_end(int64_t job_id) {
    Buf body = {0};
    put_map(&body, 2);
    put_cstr(&body, "ids"); put_array(&body, 1); put_int(&body, job_id);
    put_cstr(&body, "all"); put_bool(&body, 1);
    for (;;) {
        Conn c = {0};
        conn_open(&c);
        Reply r = call(&c, "jobs", &body);
        conn_close(&c);
        Val jobs, job, f;
        uint64_t count;
        if (!lookup(r.body, "jobs", &jobs) || !is_kind(jobs, ARRAY, &count))
            die("bad reply from the controller: no job list");
        int64_t worst = 0, code;
        int all_final = count > 0, kind;
        head(jobs.p, jobs.n, &jobs.pos, &kind, &count);
        for (job = jobs; count--; job = next(job)) {
            if (!lookup(job, "state", &f) || !get_str(f, &(const char *){0}, &(size_t){0}))
                die("bad reply from the controller: a job without a state");
            if (!is_final(f)) { all_final = 0; continue; }
            if (str_is(f, "COMPLETED")) code = 0;
            else if (!lookup(job, "exit_code", &f) || !get_int(f, &code) || code == 0) code = 1;
            if (code > worst) worst = code;
        }
        free(r.payload);
        if (all_final) return (int)worst;
        nanosleep(&(struct timespec){0, 500000000}, NULL);
    }
}

static void print_test_only(Val t) {
    Val start, nodes, part, reason;
    const char *p, *s;
    size_t plen, slen;
    uint64_t count;
    int kind;
    if (!lookup(t, "start", &start) || !lookup(t, "partition", &part) || !get_str(part, &p, &plen))
        die("bad reply from the controller: test_only without start or partition");
    if (str_is(start, "now")) {
        if (!lookup(t, "nodes", &nodes) || !is_kind(nodes, ARRAY, &count))
            die("bad reply from the controller: test_only without nodes");
        head(nodes.p, nodes.n, &nodes.pos, &kind, &count);
        Buf line = {0};
        for (Val v = nodes; count--; v = next(v)) {
            if (!get_str(v, &s, &slen)) die("bad reply from the controller: a node name that is not a str");
            if (line.len) put(&line, ",", 1);
            put(&line, s, slen);
        }
        fprintf(stderr, "%s: Job would start now on nodes %.*s in partition %.*s\n", prog, (int)line.len,
                line.p ? (char *)line.p : "", (int)plen, p);
    } else {
        if (!lookup(t, "reason", &reason) || !get_str(reason, &s, &slen))
            die("bad reply from the controller: test_only without a reason");
        fprintf(stderr, "%s: Job would wait in partition %.*s: %.*s\n", prog, (int)plen, p, (int)slen, s);
    }
}

static void usage_from_python(int argc, char **argv) {
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) die("out of memory");
    args[0] = HAI_PYTHON;
    args[1] = "-c";
    args[2] = "from hai_cluster.cli.hsubmit import main; raise SystemExit(main())";
    for (int i = 1; i < argc; i++) args[i + 2] = argv[i];
    execv(HAI_PYTHON, args);
    die("cannot run %s: %s", HAI_PYTHON, strerror(errno));
}

int main(int argc, char **argv) {
    const char *base = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
    if (argc > 0 && argv[0] && !strcmp(base ? base + 1 : argv[0], "sbatch")) prog = "sbatch";
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
                     (argc == 2 && !strcmp(argv[1], "--usage"))))
        usage_from_python(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    Buf common = {0}, body = {0};
    size_t fields = common_fields(&common, argv + 1);
    put_map(&body, fields + 1);
    put(&body, common.p, common.len);
    put_cstr(&body, "argv");
    put_array(&body, (size_t)argc - 1);
    for (int i = 1; i < argc; i++) put_cstr(&body, argv[i]);

    Conn c = {0};
    conn_open(&c);
    Reply r = submit_call(&c, &body);
    Val f, g;
    if (lookup(r.body, "need_script", &f) && truthy(f)) {
        Val opts, args;
        const char *path = NULL;
        size_t plen;
        if (!lookup(r.body, "script_path", &f) || !lookup(r.body, "options", &opts) ||
            !lookup(r.body, "script_args", &args))
            die("bad reply from the controller: need_script without script_path, options or script_args");
        Buf script = {0};
        const char *name = "sbatch", *what = "the script on standard input";
        char *owned = NULL;
        if (get_str(f, &path, &plen)) {
            if (!(owned = strndup(path, plen))) die("out of memory");
            int fd = open(owned, O_RDONLY | O_CLOEXEC);
            if (fd < 0) die("Unable to open file %s: %s", owned, strerror(errno));
            read_all(fd, &script, owned);
            close(fd);
            const char *slash = strrchr(owned, '/');
            name = slash ? slash + 1 : owned;
            char *label = malloc(plen + 8);
            if (!label) die("out of memory");
            sprintf(label, "script %s", owned);
            what = label;
        } else if (f.p[f.pos] != 0xc0) {
            die("bad reply from the controller: script_path is a %s", type_name(f));
        } else {
            if (isatty(0)) die("no script given (a file, --wrap, or a script on standard input)");
            read_all(0, &script, NULL);
        }
        script_text(&script, what);
        body.len = 0;
        put_map(&body, fields + 4);
        put(&body, common.p, common.len);
        put_cstr(&body, "script"); put_str(&body, script.p ? (char *)script.p : "", script.len);
        put_cstr(&body, "script_name"); put_cstr(&body, name);
        put_cstr(&body, "option_args"); put(&body, opts.p + opts.pos, next(opts).pos - opts.pos);
        put_cstr(&body, "script_args"); put(&body, args.p + args.pos, next(args).pos - args.pos);
        free(script.p);
        Reply second = submit_call(&c, &body);
        free(r.payload); /* opts and args pointed into it */
        r = second;
    }
    conn_close(&c); /* not held open through --wait */
    if (lookup(r.body, "test_only", &f)) {
        print_test_only(f);
        return 0;
    }
    int64_t job_id;
    int parsable, wait;
    if (!lookup(r.body, "job_id", &f) || !get_int(f, &job_id) || !lookup(r.body, "parsable", &f) ||
        !lookup(r.body, "wait", &g))
        die("bad reply from the controller: no job_id, parsable or wait");
    parsable = truthy(f);
    wait = truthy(g);
    if (parsable) printf("%lld\n", (long long)job_id);
    else printf("Submitted batch job %lld\n", (long long)job_id);
    fflush(stdout);
    return wait ? wait_for_end(job_id) : 0;
}
