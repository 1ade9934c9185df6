/* The client side of the controller's socket, shared by the C programs that talk to it (hsubmit.c,
 * squeue.c, sacct.c; each includes this file: one translation unit each, nothing to link): a
 * growable buffer, the msgpack writer (what minipack.packb writes, byte for byte), a bounds-
 * checked msgpack reader, UTF-8 checks, the connection and one request/response exchange
 * (protocol/framing.py: a 4-byte big-endian length, then one msgpack map).
 *
 * The including program defines client_fail(): what happens on garbage from the controller or
 * out of memory. hsubmit prints the message and exits; squeue and sacct define HAI_FALLBACK_MODULE
 * and get the one at the end of this file, which runs the Python program. */
#ifndef HAI_CLIENT_H
#define HAI_CLIENT_H
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef HAI_TIMEOUT_SECONDS
#define HAI_TIMEOUT_SECONDS 60 /* as the Python client's; the tests build one with less */
#endif
#define MAX_FRAME 16777216u /* framing.MAX_FRAME_BYTES */
#define MAX_DEPTH 500       /* nesting a reply may have (Python's recursion limit would stop it near here) */

typedef unsigned char u8;
typedef struct { u8 *p; size_t len, cap; } Buf;

/* Defined by the including program; never returns. */
static void client_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

/* ---- growable buffer and msgpack writer -------------------------------------------------------- */

static inline void reserve(Buf *b, size_t n) {
    if (n > SIZE_MAX / 2 - b->len) client_fail("out of memory");
    if (b->len + n <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    u8 *p = realloc(b->p, cap);
    if (!p) client_fail("out of memory");
    b->p = p;
    b->cap = cap;
}

static inline void put(Buf *b, const void *data, size_t n) {
    reserve(b, n);
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
}

static inline void put_be(Buf *b, int code, uint64_t v, int nbytes) {
    u8 t[9];
    int k = 0;
    if (code >= 0) t[k++] = (u8)code;
    for (int i = nbytes - 1; i >= 0; i--) t[k++] = (u8)(v >> (8 * i));
    put(b, t, (size_t)k);
}

/* fix: the fix-size code (or -1), taken below fix_limit; c8 < 0 when there is no 8-bit form. */
static inline void put_head(Buf *b, size_t n, int fix, size_t fix_limit, int c8, int c16, int c32) {
    if (fix >= 0 && n < fix_limit) put_be(b, fix | (int)n, 0, 0);
    else if (c8 >= 0 && n < 256) put_be(b, c8, n, 1);
    else if (n < 65536) put_be(b, c16, n, 2);
    else if ((uint64_t)n <= 0xffffffffu) put_be(b, c32, n, 4);
    else client_fail("a value of %zu bytes or items is too big for msgpack", n);
}

static inline void put_str(Buf *b, const char *s, size_t n) {
    put_head(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
    put(b, s, n);
}
static inline void put_cstr(Buf *b, const char *s) { put_str(b, s, strlen(s)); }
static inline void put_array(Buf *b, size_t n) { put_head(b, n, 0x90, 16, -1, 0xdc, 0xdd); }
static inline void put_map(Buf *b, size_t n) { put_head(b, n, 0x80, 16, -1, 0xde, 0xdf); }
static inline void put_bool(Buf *b, int v) { put_be(b, v ? 0xc3 : 0xc2, 0, 0); }

static inline void put_int(Buf *b, int64_t v) {
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

static inline void put_double(Buf *b, double v) {
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    put_be(b, 0xcb, u, 8);
}

/* ---- UTF-8: the protocol's strings must be valid (the controller decodes them strictly) ------ */

/* Length of the valid UTF-8 sequence at s (n > 0 bytes left), 0 when none starts there. */
static inline size_t utf8_seq(const u8 *s, size_t n) {
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
static inline size_t utf8_bad(const u8 *s, size_t n) {
    size_t i = 0, k;
    while (i < n && (k = utf8_seq(s + i, n - i)) > 0) i += k;
    return i;
}

static inline int cstr_ok(const char *s) { return utf8_bad((const u8 *)s, strlen(s)) == strlen(s); }

/* ---- msgpack reader: every read is bounds-checked; a reply is validated whole before use ----- */

static char decode_error[128];

static inline int bad(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(decode_error, sizeof decode_error, fmt, ap);
    va_end(ap);
    return -1;
}

static inline uint64_t be(const u8 *p, int k) {
    uint64_t v = 0;
    for (int i = 0; i < k; i++) v = v << 8 | p[i];
    return v;
}

enum { SCALAR, STR, BIN, ARRAY, MAP };

/* The value at *pos: its kind and length (bytes of a str/bin, items of an array/map), *pos moved
 * past its head (past the whole value for a scalar). -1 on truncation or an unsupported type. */
static inline int head(const u8 *p, size_t n, size_t *pos, int *kind, uint64_t *len) {
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
static inline int skip(const u8 *p, size_t n, size_t *pos, int depth) {
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

static inline const char *type_name(Val v) {
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

static inline int is_kind(Val v, int want, uint64_t *len) {
    int kind = -1;
    size_t pos = v.pos;
    return head(v.p, v.n, &pos, &kind, len) == 0 && kind == want;
}

static inline Val next(Val v) { /* the value after v */
    skip(v.p, v.n, &v.pos, 0);
    return v;
}

/* The value under key in map m (the last one, as a dict keeps it); 0 when m is no map or lacks it. */
static inline int lookup(Val m, const char *key, Val *out) {
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

static inline int get_str(Val v, const char **s, size_t *len) {
    uint64_t n;
    int kind;
    if (!is_kind(v, STR, &n)) return 0;
    head(v.p, v.n, &v.pos, &kind, &n);
    *s = (const char *)v.p + v.pos;
    *len = n;
    return 1;
}

static inline int str_is(Val v, const char *want) {
    const char *s;
    size_t n;
    return get_str(v, &s, &n) && n == strlen(want) && !memcmp(s, want, n);
}

static inline int get_int(Val v, int64_t *out) {
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

static inline int get_bool(Val v, int *out) {
    if (v.p[v.pos] != 0xc2 && v.p[v.pos] != 0xc3) return 0;
    *out = v.p[v.pos] == 0xc3;
    return 1;
}

static inline int truthy(Val v) { /* Python's truth of the value (a float is garbage here anyway) */
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

/* one_request: a response to any other request id is garbage (squeue and sacct send one request). */
typedef struct { int fd; Buf in; int64_t next_id; const char *path; int one_request; } Conn;
/* A response: its payload (a copy), its body, and for an error response its text. */
typedef struct { u8 *payload; Val body; const char *error; size_t error_len; } Reply;

/* What try_call got: the response, an error response (its text in the Reply), or a lost reply
 * (sent, or maybe sent, and no answer: `failure` says why). BUSY is hsubmit's: a refusal that
 * says "try again" while it retries. */
enum { GOT = 1, LOST, BUSY, REFUSED }; /* not 0: our_response()'s "not ours" */
static char failure[512];

static inline int io_lost(void) {
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        snprintf(failure, sizeof failure, "no answer from the controller within %d s", HAI_TIMEOUT_SECONDS);
    else
        snprintf(failure, sizeof failure, "connection to the controller failed: [Errno %d] %s", errno, strerror(errno));
    return LOST;
}

/* Connects; 0, or -1 with the reason in `failure`. */
static inline int conn_try_open(Conn *c) {
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

static inline void conn_close(Conn *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

/* Checks a message as messages.parse_message does: 0 when it is not the response to request id
 * (a request, an event, another request's response unless c->one_request), else GOT or REFUSED
 * with the response copied into *out. Garbage is client_fail(). */
static inline int our_response(const Conn *c, const u8 *p, size_t n, int64_t id, Reply *out) {
    Val msg = {p, n, 0}, v, k, f;
    size_t end = 0;
    int64_t i;
    int ok;
    const char *s = NULL;
    size_t len = 0;
    if (skip(p, n, &end, 0) < 0) client_fail("bad reply from the controller: undecodable frame: %s", decode_error);
    if (end != n) client_fail("bad reply from the controller: undecodable frame: %zu bytes after the object", n - end);
    if (!is_kind(msg, MAP, &(uint64_t){0}))
        client_fail("bad reply from the controller: frame is a %s, expected a map", type_name(msg));
    if (!lookup(msg, "v", &v) || !get_int(v, &i) || i != 1)
        client_fail("bad reply from the controller: protocol version is not supported (this side speaks [1])");
    if (!lookup(msg, "k", &k) || !(str_is(k, "res") || str_is(k, "req") || str_is(k, "evt")))
        client_fail("bad reply from the controller: unknown message kind");
    if (!str_is(k, "evt") && !(lookup(msg, "id", &f) && get_int(f, &i)))
        client_fail("bad reply from the controller: message field 'id' is missing or has the wrong type");
    if (!str_is(k, "res")) {
        if (!(lookup(msg, "m", &f) && get_str(f, &s, &len)))
            client_fail("bad reply from the controller: message field 'm' is missing or has the wrong type");
        return 0; /* a request or an event: not ours */
    }
    if (!(lookup(msg, "ok", &f) && get_bool(f, &ok)))
        client_fail("bad reply from the controller: message field 'ok' is missing or has the wrong type");
    int has_error = lookup(msg, "e", &f) && get_str(f, &s, &len);
    if (!ok && !has_error) client_fail("bad reply from the controller: error response without an error text");
    if (i != id && c->one_request)
        client_fail("bad reply from the controller: a response to request %lld", (long long)i);
    if (i != id) return 0;
    out->payload = malloc(n ? n : 1);
    if (!out->payload) client_fail("out of memory");
    memcpy(out->payload, p, n);
    Val m = {out->payload, n, 0};
    static const u8 nil = 0xc0;
    if (!lookup(m, "b", &out->body)) out->body = (Val){&nil, 1, 0};
    out->error = ok ? NULL : (const char *)out->payload + (s - (const char *)p);
    out->error_len = ok ? 0 : len;
    return ok ? GOT : REFUSED;
}

/* Sends {"v":1,"k":"req","id":N,"m":method,"b":<body, already packed>}; GOT with the response's
 * body in *reply, REFUSED with its error text there, or LOST (why in `failure`). */
static inline int try_call(Conn *c, const char *method, const Buf *body, Reply *reply) {
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
        client_fail("bad reply from the controller: frame of %zu bytes exceeds the %u-byte limit", payload, MAX_FRAME);
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
                client_fail("bad reply from the controller: frame length %llu exceeds the %u-byte limit",
                            (unsigned long long)len, MAX_FRAME);
            if (c->in.len - 4 < len) break;
            int mine = our_response(c, c->in.p + 4, (size_t)len, id, reply);
            c->in.len -= 4 + (size_t)len; /* what follows stays for a later call on this connection */
            memmove(c->in.p, c->in.p + 4 + len, c->in.len);
            if (mine) return mine;
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

/* Whether Python would write stdout as UTF-8 (strict): PYTHONUTF8=1, or a C/POSIX locale (coerced
 * to UTF-8), or a UTF-8 locale (installed or not: one that is not is the C locale to Python). The
 * programs that print a text the controller rendered leave other locales to Python. */
static inline int python_writes_utf8(void) {
    const char *io = getenv("PYTHONIOENCODING"), *utf8 = getenv("PYTHONUTF8");
    if (io && *io) return 0;
    if (utf8 && *utf8) return !strcmp(utf8, "1");
    const char *name = getenv("LC_ALL");
    if (!name || !*name) name = getenv("LC_CTYPE");
    if (!name || !*name) name = getenv("LANG");
    if (!name || !*name || !strcmp(name, "C") || !strcmp(name, "POSIX")) return 1;
    const char *dot = strchr(name, '.');
    if (!dot) return 0;
    size_t n = strcspn(dot + 1, "@");
    return (n == 5 && !strncasecmp(dot + 1, "utf-8", 5)) || (n == 4 && !strncasecmp(dot + 1, "utf8", 4));
}

#ifdef HAI_FALLBACK_MODULE
/* The front ends of a Python program (squeue.c, sacct.c define HAI_FALLBACK_PROG and
 * HAI_FALLBACK_MODULE, and set g_argc/g_argv first in main): what they do not do themselves,
 * and garbage from the controller or out of memory, goes to the Python program. */
#include <signal.h>

static int g_argc;
static char **g_argv;

/* The Python program, with our argv and environment (sys.argv[0] ours, so click names the program
 * as the launcher would; -P: no cwd on sys.path, as a launcher has none). Never returns. */
static void fallback(void) __attribute__((noreturn));
static void fallback(void) {
    static const char code[] = "import sys; sys.argv[:2] = sys.argv[1:2]; "
                               "from " HAI_FALLBACK_MODULE " import main; raise SystemExit(main())";
    char **args = calloc((size_t)g_argc + 5, sizeof *args);
    if (!args) {
        fputs(HAI_FALLBACK_PROG ": error: out of memory\n", stderr);
        exit(1);
    }
    args[0] = HAI_PYTHON;
    args[1] = "-P";
    args[2] = "-c";
    args[3] = (char *)code;
    args[4] = g_argc > 0 && g_argv[0] ? g_argv[0] : HAI_FALLBACK_PROG;
    for (int i = 1; i < g_argc; i++) args[i + 4] = g_argv[i];
    signal(SIGPIPE, SIG_DFL);
    execv(HAI_PYTHON, args);
    fprintf(stderr, HAI_FALLBACK_PROG ": error: cannot run %s: %s\n", HAI_PYTHON, strerror(errno));
    exit(1);
}

/* Garbage from the controller, out of memory: the Python program, which says what it says. */
static void client_fail(const char *fmt, ...) {
    (void)fmt;
    fallback();
}

/* The text the controller renders for `method` (its answer {"text": ...}), written to stdout; its
 * exit status. Anything but the text (no controller, an error response: a controller too old for
 * the request, {"fallback": ...}, garbage) runs the Python program. */
static int write_rendered(const char *method, Buf *body) {
    Conn c = {.one_request = 1};
    Reply r;
    Val f;
    const char *text;
    size_t len;
    if (conn_try_open(&c) < 0 || try_call(&c, method, body, &r) != GOT || !lookup(r.body, "text", &f) ||
        !get_str(f, &text, &len))
        fallback();
    conn_close(&c);
    /* From here the text is ours to write; a closed pipe ends it quietly, status 1, as the Python
     * program ends (fastargs.run_main). */
    signal(SIGPIPE, SIG_IGN);
    for (size_t done = 0; done < len;) {
        ssize_t w = write(1, text + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EPIPE) return 1;
        if (w < 0 && done == 0) fallback(); /* no stdout, say: the Python program's own message */
        if (w < 0) {
            fprintf(stderr, HAI_FALLBACK_PROG ": error: cannot write the listing: %s\n", strerror(errno));
            return 1;
        }
        done += (size_t)w;
    }
    return 0;
}
#endif

#endif
