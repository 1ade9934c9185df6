/* squeue in C: a thin front end of hai_cluster/cli/squeue.py, which stays the reference. Tools poll
 * squeue all day; a Python process costs ~20 ms to start and import before it reads a job, Slurm's
 * squeue (C) ~10 ms in all at 1,000 jobs (docs/BENCHMARKS.md).
 *
 * It sends its arguments and the environment variables squeue reads to the controller's
 * "squeue_text" request (controller/api_listing_text.py), which renders the text with the Python
 * squeue's own code, and writes the text it gets back. Everything else runs the Python squeue with
 * the same arguments and environment, so what the user sees never differs: --help, an answer
 * {"fallback": ...} (forms the controller does not render: -l, --start, -s, errors, ...), an error
 * response (a controller too old to know the request), no controller, a reply it cannot read,
 * arguments or variables that are not UTF-8, or a locale whose charset Python would not write
 * as UTF-8. Built by `python -m hai_cluster.native.build` into the venv's bin, over the Python
 * launcher; without a C compiler the Python squeue is the one installed.
 * The socket and msgpack code, the fallback and the writing of the text are client.h's, shared with
 * the other clients.
 * Build: cc -O2 -DHAI_PYTHON='"/venv/bin/python"' -o squeue squeue.c (client.h beside it) */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef HAI_PYTHON
#error "define HAI_PYTHON, the interpreter of the Python squeue (python -m hai_cluster.native.build does)"
#endif
#define HAI_FALLBACK_PROG "squeue"
#define HAI_FALLBACK_MODULE "hai_cluster.cli.squeue"
#include "client.h"

/* ---- the request ----------------------------------------------------------------------------- */

/* What squeue.py reads of the environment (api_listing_text.ENV_NAMES): the SQUEUE_* variables
 * and getpass.getuser()'s, for --me. */
static const char *const ENV[] = {"SQUEUE_FORMAT", "SQUEUE_FORMAT2", "SQUEUE_USERS", "SQUEUE_STATES",
                                  "SQUEUE_PARTITION", "SQUEUE_NAMES", "LOGNAME", "USER", "LNAME", "USERNAME"};

/* The squeue_text request's body: {"argv": our arguments, "env": those of ENV we have}. */
static void request(Buf *out) {
    size_t nenv = 0, i;
    const char *values[sizeof ENV / sizeof *ENV];
    for (i = 0; i < sizeof ENV / sizeof *ENV; i++)
        if ((values[i] = getenv(ENV[i])) != NULL) {
            if (!cstr_ok(values[i])) fallback();
            nenv++;
        }
    put_map(out, 2);
    put_cstr(out, "argv");
    put_array(out, (size_t)(g_argc > 0 ? g_argc - 1 : 0));
    for (int a = 1; a < g_argc; a++) put_cstr(out, g_argv[a]);
    put_cstr(out, "env");
    put_map(out, nenv);
    for (i = 0; i < sizeof ENV / sizeof *ENV; i++)
        if (values[i]) { put_cstr(out, ENV[i]); put_cstr(out, values[i]); }
}

int main(int argc, char **argv) {
    g_argc = argc;
    g_argv = argv;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "--usage") || !cstr_ok(argv[i])) fallback();
    if (!python_writes_utf8()) fallback();
    Buf body = {0};
    request(&body);
    return write_rendered("squeue_text", &body);
}
