/* hsubmit in C: the submit path of hai_cluster/cli/hsubmit.py, which stays the reference (and runs
 * --help). A submission is one process start; a Python one costs ~7 ms of interpreter start before
 * any work, sbatch (C) ~7 ms in all. Built by `python -m hai_cluster.native.build` into the venv's
 * bin, over pip's Python launcher; without a C compiler the Python hsubmit is the one installed.
 *
 * The controller does the work (options, directives, checks); the client sends its argv, cwd,
 * environment and umask, and the script when the answer asks for it (protocol/framing.py: a 4-byte
 * big-endian length, then one msgpack map). Replies are read with bounds checks throughout:
 * garbage on the socket is "bad reply from the controller", never a crash.
 * The socket and msgpack code is client.h's, shared with the other clients.
 * Build: cc -O2 -DHAI_PYTHON='"/venv/bin/python"' -o hsubmit hsubmit.c (client.h beside it) */
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
#define RETRY_WINDOW 20.0 /* hsubmit.py's: seconds a retry waits for a controller that restarts */
#include "client.h"

extern char **environ;

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

/* client.h's garbage and out of memory: hsubmit's own error message */
static void client_fail(const char *fmt, ...) {
    va_list ap;
    error_head();
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (lost[0]) fputc(')', stderr);
    fputc('\n', stderr);
    exit(1);
}

/* ---- UTF-8 ------------------------------------------------------------------------------------ */

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

/* ---- the controller's refusals -------------------------------------------------------------- */

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

/* ---- the connection: frames out, the response to our request back ---------------------------- */

static void conn_open(Conn *c) {
    if (conn_try_open(c) < 0) die("%s", failure);
}

/* The response to one request; else hsubmit.py's message: the controller's own error (every
 * line of it), or why there was no answer. */
static Reply call(Conn *c, const char *method, const Buf *body) {
    Reply reply;
    int got = try_call(c, method, body, &reply);
    if (got == REFUSED) die_lines(reply.error, reply.error_len);
    if (got != GOT) die("%s", failure);
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
    int got = try_call(c, "submit", body, &reply);
    if (got == GOT) return reply;
    if (got == REFUSED) die_lines(reply.error, reply.error_len);
    snprintf(lost, sizeof lost, "%s", failure);
    conn_close(c);
    double deadline = monotonic() + RETRY_WINDOW;
    for (;;) {
        got = conn_try_open(c) < 0 ? BUSY : try_call(c, "submit", body, &reply);
        if (got == REFUSED && memmem(reply.error, reply.error_len, "try again", 9)) {
            /* a controller that restarts refuses the retry for a moment: wait, within the window */
            int shown_len = (int)(reply.error_len < 500 ? reply.error_len : 500);
            snprintf(failure, sizeof failure, "%.*s", shown_len, reply.error);
            free(reply.payload);
            got = BUSY;
        }
        if (got == REFUSED) die_lines(reply.error, reply.error_len);
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
