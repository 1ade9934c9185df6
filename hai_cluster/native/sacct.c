/* sacct in C: a thin front end of hai_cluster/cli/sacct.py, which stays the reference. Tools poll
 * sacct all day (`sacct -X -n -P -o JobID,State,Elapsed`); a Python process costs ~20 ms to start
 * and import before it reads a job (docs/BENCHMARKS.md).
 *
 * It sends its arguments, the environment variables sacct reads, its clock and its time zone
 * (TZ, its local midnight by mktime, its UTC offset at a few instants) to the controller's
 * "sacct_text" request (controller/api_sacct_text.py), which renders the text with the Python
 * sacct's own code when its local time is ours, and writes the text it gets back. Everything else
 * runs the Python sacct with the same arguments and environment, so what the user sees never
 * differs: -h/--help, an answer {"fallback": ...} (another time zone, forms the controller does
 * not render, errors), an error response (a controller too old to know the request), no
 * controller, a reply it cannot read, arguments or variables that are not UTF-8, or a locale whose
 * charset Python would not write as UTF-8. Built by `python -m hai_cluster.native.build` into the
 * venv's bin, over the Python launcher; without a C compiler the Python sacct is the one installed.
 * The socket and msgpack code, the fallback and the writing of the text are client.h's, shared with
 * the other clients.
 * Build: cc -O2 -DHAI_PYTHON='"/venv/bin/python"' -o sacct sacct.c (client.h beside it) */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef HAI_PYTHON
#error "define HAI_PYTHON, the interpreter of the Python sacct (python -m hai_cluster.native.build does)"
#endif
#define HAI_FALLBACK_PROG "sacct"
#define HAI_FALLBACK_MODULE "hai_cluster.cli.sacct"
#include "client.h"

/* ---- the request ----------------------------------------------------------------------------- */

/* What sacct.py reads of the environment (api_sacct_text.ENV_NAMES): SACCT_FORMAT, TZ (the
 * controller renders only in its own zone) and getpass.getuser()'s variables. */
static const char *const ENV[] = {"SACCT_FORMAT", "TZ", "LOGNAME", "USER", "LNAME", "USERNAME"};

static void put_offset(Buf *out, time_t t) {
    struct tm tm;
    if (!localtime_r(&t, &tm)) fallback();
    put_array(out, 2);
    put_int(out, (int64_t)t);
    put_int(out, (int64_t)tm.tm_gmtoff);
}

/* The sacct_text request's body: {"argv", "env": those of ENV we have, "now", "midnight": our
 * today's 00:00:00 (mktime), "offsets": [[t, UTC offset at t]] now, at midnight and half a year
 * either side (the zone's rules: its DST too)}. */
static void request(Buf *out) {
    size_t nenv = 0, i;
    const char *values[sizeof ENV / sizeof *ENV];
    for (i = 0; i < sizeof ENV / sizeof *ENV; i++)
        if ((values[i] = getenv(ENV[i])) != NULL) {
            if (!cstr_ok(values[i])) fallback();
            nenv++;
        }
    tzset();
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    time_t now = ts.tv_sec;
    if (!localtime_r(&now, &tm)) fallback();
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    tm.tm_isdst = -1;
    time_t midnight = mktime(&tm);
    if (midnight == (time_t)-1) fallback();
    put_map(out, 5);
    put_cstr(out, "argv");
    put_array(out, (size_t)(g_argc > 0 ? g_argc - 1 : 0));
    for (int a = 1; a < g_argc; a++) put_cstr(out, g_argv[a]);
    put_cstr(out, "env");
    put_map(out, nenv);
    for (i = 0; i < sizeof ENV / sizeof *ENV; i++)
        if (values[i]) { put_cstr(out, ENV[i]); put_cstr(out, values[i]); }
    put_cstr(out, "now");
    put_double(out, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    put_cstr(out, "midnight");
    put_int(out, (int64_t)midnight);
    put_cstr(out, "offsets");
    put_array(out, 4);
    put_offset(out, now);
    put_offset(out, midnight);
    put_offset(out, now - 183 * 86400);
    put_offset(out, now + 183 * 86400);
}

int main(int argc, char **argv) {
    g_argc = argc;
    g_argv = argv;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "--usage") || !strcmp(argv[i], "-h") || !cstr_ok(argv[i]))
            fallback();
    if (!python_writes_utf8()) fallback();
    Buf body = {0};
    request(&body);
    return write_rendered("sacct_text", &body);
}
