/* hai-jobexec: what a job's process does between the shepherd's spawn and the job's exec, in C.

The shepherd (hai_cluster/agent/jobproc.py, start_job) starts this with posix_spawn, which on
Linux is a vfork: no copy of the shepherd's page tables, no copy-on-write faults while the
child runs, no Python interpreter torn down at the exec. The spawn already reset every signal
to its default (the C library's own two: below) and emptied the mask. Then, in the order of
jobproc.exec_job (the Python path, which stays for container launches and where this is not
built), and with the same messages:

  join the run's cgroups; setsid; the job's resource limits (as root: a hard limit above the
  shepherd's may be set); as the user: groups, gid, uid, umask, chdir, the checkpoint dir, stdout
  and stderr opened, stdin from /dev/null; a root runtime takes root back; every fd closed but the
  error pipe and the runtime's; exec.

A failure writes "<step> failed: <strerror>" to the error pipe and exits 127; the pipe is
close-on-exec, so a successful exec closes it: that is how the shepherd knows the job started.

    hai-jobexec 2 ERRFD ENVFD [--cgroup PROCS]... [--rlimit NAME:RESOURCE:SOFT:HARD]... [--keep FD]...
                --user NAME --uid N --gid N
                --groups G,G,... [--as-user] --umask N --chdir DIR [--checkpoint DIR] [--trunc]
                --stdout PATH [--stderr PATH] --label TEXT [--hint TEXT] -- PROGRAM ARG...

The job's environment comes in ENVFD (a memfd: "K=V" strings, each ended by a NUL), not as
this process's own: it runs as root, and the job's LD_PRELOAD or GLIBC_TUNABLES must never
reach its loader; nor in the arguments, which every user on the node can read in ps. Only the
shepherd runs this (not a user command: it needs root, and trusts its arguments as the shepherd
built them). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#define PROTOCOL "2" /* jobproc.JOBEXEC_PROTOCOL: a helper from another version refuses */
#define MAX_LIST 256
#define MSG_MAX 4000

static int errfd = -1;
static char step[PATH_MAX + 256];

static void fail_with(int err, const char *extra) {
    char msg[MSG_MAX + 1];
    int n = snprintf(msg, sizeof msg, "%s failed: %s%s", step, strerror(err), extra ? extra : "");
    if (n > MSG_MAX) n = MSG_MAX;
    if (errfd >= 0 && n > 0) {
        ssize_t w = write(errfd, msg, (size_t)n);
        (void)w;
    }
    _exit(127);
}

static void fail(void) { fail_with(errno, NULL); }

static void usage(const char *why) {
    snprintf(step, sizeof step, "preparing the job process (hai-jobexec: %s)", why);
    fail_with(EINVAL, NULL);
}

static long number(const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) usage("a number was expected");
    return v;
}

/* os.makedirs(path, 0o700, exist_ok=True): parents 0777 (less the umask), the last 0700. */
static int make_dirs(const char *path) {
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof buf) {
        errno = len ? ENAMETOOLONG : ENOENT;
        return -1;
    }
    memcpy(buf, path, len + 1);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = '\0';
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0700) == 0) return 0;
    int err = errno;
    struct stat st;
    if (err == EEXIST && stat(buf, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    errno = err;
    return -1;
}

/* ENVFD's strings as an environment (NULL-terminated); NULL when it cannot be read */
static char **read_env(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) return NULL;
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return NULL;
        got += (size_t)n;
    }
    buf[size] = '\0';
    size_t count = 0;
    for (size_t i = 0; i < size; i++) count += buf[i] == '\0';
    char **env = calloc(count + 1, sizeof *env);
    if (!env) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < size && k < count; k++) {
        env[k] = buf + i;
        i += strlen(buf + i) + 1;
    }
    env[k] = NULL;
    return env;
}

/* posix_spawn leaves the C library's own signals (SIGCANCEL, SIGSETXID: the kernel's first
   real-time ones, which glibc's sigaction refuses to touch) ignored in its child, and an ignored
   signal survives exec: the job must start with them at their defaults, as after a fork. All
   zeros is SIG_DFL, no flags, an empty mask in any architecture's kernel sigaction. */
static void default_libc_signals(void) {
    unsigned long zero[16] = {0};
    for (int sig = __SIGRTMIN; sig < SIGRTMIN; sig++) syscall(SYS_rt_sigaction, sig, zero, NULL, (NSIG - 1) / 8);
}

/* --rlimit NAME:RESOURCE:SOFT:HARD (-1: unlimited), as jobproc._jobexec_options writes it */
struct limit {
    char name[16];
    int resource;
    struct rlimit value;
};

static rlim_t limit_value(const char *s, char **end) {
    errno = 0;
    long long v = strtoll(s, end, 10);
    if (errno || *end == s || v < -1) usage("bad --rlimit");
    return v == -1 ? RLIM_INFINITY : (rlim_t)v;
}

static void parse_limit(const char *val, struct limit *out) {
    const char *colon = strchr(val, ':');
    if (!colon || colon == val || (size_t)(colon - val) >= sizeof out->name) usage("bad --rlimit");
    memcpy(out->name, val, (size_t)(colon - val));
    out->name[colon - val] = '\0';
    char *end;
    errno = 0;
    long res = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end != ':' || res < 0 || res >= RLIM_NLIMITS) usage("bad --rlimit");
    out->resource = (int)res;
    out->value.rlim_cur = limit_value(end + 1, &end);
    if (*end != ':') usage("bad --rlimit");
    out->value.rlim_max = limit_value(end + 1, &end);
    if (*end) usage("bad --rlimit");
}

static const char *show_limit(rlim_t v, char *buf, size_t size) {
    if (v == RLIM_INFINITY) return "unlimited";
    snprintf(buf, size, "%llu", (unsigned long long)v);
    return buf;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Without close_range (Linux < 5.9): the fds in [low, high) that are open, as /proc lists them
   (a loop up to the fd limit would make a million calls where the limit is raised), else that loop. */
static void close_listed(unsigned int low, unsigned int high) {
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL) {
        long max = sysconf(_SC_OPEN_MAX);
        unsigned int top = high == ~0U ? (unsigned int)(max > 0 ? max : 1 << 20) : high;
        for (unsigned int fd = low; fd < top; fd++) close((int)fd);
        return;
    }
    int self = dirfd(dir);
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        char *end;
        unsigned long fd = strtoul(entry->d_name, &end, 10);
        if (end == entry->d_name || *end != '\0' || (long)fd == self) continue;
        if (fd >= low && (high == ~0U || fd < high)) close((int)fd);
    }
    closedir(dir);
}

static void close_others(const int *keep, int nkeep) {
    /* close_range over the gaps between the fds kept (they are few and sorted below) */
    int sorted[MAX_LIST + 1], n = 0;
    for (int i = 0; i < nkeep; i++) sorted[n++] = keep[i];
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
            int t = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = t;
        }
    unsigned int low = 3;
    for (int i = 0; i <= n; i++) {
        unsigned int high = i < n ? (unsigned int)sorted[i] : ~0U;
        if (i < n && (unsigned int)sorted[i] < low) continue;
        if (high > low) {
#if defined(SYS_close_range) && !defined(HAI_NO_CLOSE_RANGE)
            if (syscall(SYS_close_range, low, high == ~0U ? ~0U : high - 1, 0) != 0)
#endif
                close_listed(low, high);
        }
        if (i < n) low = (unsigned int)sorted[i] + 1;
    }
}

int main(int argc, char **argv) {
    const char *cgroups[MAX_LIST];
    struct limit limits[MAX_LIST];
    int nlimits = 0;
    int keep[MAX_LIST + 1];  /* and the error pipe */
    gid_t *groups = NULL;
    int ncg = 0, nkeep = 0, ngroups = -1, as_user = 0, trunc = 0;
    const char *user = NULL, *chdir_to = NULL, *checkpoint = NULL, *out_path = NULL, *err_path = NULL;
    const char *label = NULL, *hint = NULL;
    long uid = -1, gid = -1, mask = -1;

    if (argc < 4 || strcmp(argv[1], PROTOCOL) != 0) {
        if (argc >= 3) errfd = (int)strtol(argv[2], NULL, 10);
        usage("another version's protocol");
    }
    errfd = (int)number(argv[2]);
    int envfd = (int)number(argv[3]);
    int i = 4;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *opt = argv[i];
        if (strcmp(opt, "--as-user") == 0) { as_user = 1; continue; }
        if (strcmp(opt, "--trunc") == 0) { trunc = 1; continue; }
        if (i + 1 >= argc) usage("an option without its value");
        const char *val = argv[++i];
        if (strcmp(opt, "--cgroup") == 0) {
            if (ncg == MAX_LIST) usage("too many cgroups");
            cgroups[ncg++] = val;
        } else if (strcmp(opt, "--rlimit") == 0) {
            if (nlimits == MAX_LIST) usage("too many limits");
            parse_limit(val, &limits[nlimits++]);
        } else if (strcmp(opt, "--keep") == 0) {
            if (nkeep == MAX_LIST) usage("too many fds to keep");
            keep[nkeep++] = (int)number(val);
        } else if (strcmp(opt, "--user") == 0) user = val;
        else if (strcmp(opt, "--uid") == 0) uid = number(val);
        else if (strcmp(opt, "--gid") == 0) gid = number(val);
        else if (strcmp(opt, "--umask") == 0) mask = number(val);
        else if (strcmp(opt, "--chdir") == 0) chdir_to = val;
        else if (strcmp(opt, "--checkpoint") == 0) checkpoint = val;
        else if (strcmp(opt, "--stdout") == 0) out_path = val;
        else if (strcmp(opt, "--stderr") == 0) err_path = val;
        else if (strcmp(opt, "--label") == 0) label = val;
        else if (strcmp(opt, "--hint") == 0) hint = val;
        else if (strcmp(opt, "--groups") == 0) {
            size_t most = 1;
            for (const char *p = val; *p; p++) most += *p == ',';
            groups = calloc(most, sizeof *groups);
            if (!groups) usage("out of memory");
            ngroups = 0;
            for (const char *p = val; *p;) {
                char *end;
                errno = 0;
                unsigned long g = strtoul(p, &end, 10);
                if (errno || end == p || (*end && *end != ',')) usage("bad --groups");
                groups[ngroups++] = (gid_t)g;
                p = *end ? end + 1 : end;
            }
        } else usage("an unknown option");
    }
    if (i + 1 >= argc || !user || uid < 0 || gid < 0 || mask < 0 || !chdir_to || !out_path || !label ||
        ngroups < 0)
        usage("a missing argument");
    char **prog = argv + i + 1;
    char **env = read_env(envfd);
    if (!env) {
        snprintf(step, sizeof step, "preparing the job process (reading its environment)");
        fail_with(errno ? errno : EIO, NULL);
    }
    close(envfd);
    keep[nkeep] = errfd;
    int nclose_keep = nkeep + 1;

    default_libc_signals();
    int nroot = getgroups(0, NULL);  /* ours (root's), taken back for a root runtime */
    gid_t *root_groups = calloc(nroot > 0 ? (size_t)nroot : 1, sizeof *root_groups);
    if (!root_groups || (nroot = getgroups(nroot, root_groups)) < 0) {
        snprintf(step, sizeof step, "preparing the job process (reading its groups)");
        fail();
    }

    for (int c = 0; c < ncg; c++) {
        const char *slash = strrchr(cgroups[c], '/');
        int dirlen = slash ? (int)(slash - cgroups[c]) : 0;
        snprintf(step, sizeof step, "joining the cgroup %.*s", dirlen, cgroups[c]);
        int fd = open(cgroups[c], O_WRONLY | O_CLOEXEC);
        if (fd < 0) fail();
        if (write(fd, "0", 1) != 1) fail();
        close(fd);
    }
    snprintf(step, sizeof step, "setsid");
    if (setsid() < 0) fail();
    for (int k = 0; k < nlimits; k++) {
        char soft[24], hard[24];
        snprintf(step, sizeof step, "setting the job's resource limit %.15s (%.23s:%.23s)", limits[k].name,
                 show_limit(limits[k].value.rlim_cur, soft, sizeof soft),
                 show_limit(limits[k].value.rlim_max, hard, sizeof hard));
        if (setrlimit(limits[k].resource, &limits[k].value) != 0) fail();
    }
    /* For a root runtime only the effective ids change (-1 keeps real and saved ids: root) */
    uid_t ruid = as_user ? (uid_t)uid : (uid_t)-1;
    gid_t rgid = as_user ? (gid_t)gid : (gid_t)-1;
    snprintf(step, sizeof step, "setting the groups of user %s", user);
    if (setgroups((size_t)ngroups, groups) != 0) fail();
    snprintf(step, sizeof step, "setgid to %ld", gid);
    if (setresgid(rgid, (gid_t)gid, rgid) != 0) fail();
    snprintf(step, sizeof step, "setuid to %ld", uid);
    if (setresuid(ruid, (uid_t)uid, ruid) != 0) fail();
    umask((mode_t)mask);
    snprintf(step, sizeof step, "chdir to %s", chdir_to);
    if (chdir(chdir_to) != 0) fail();
    if (checkpoint && !is_dir(checkpoint)) {
        snprintf(step, sizeof step, "creating checkpoint dir %s", checkpoint);
        if (make_dirs(checkpoint) != 0) fail();
    }
    /* a requeued job (attempt > 0) continues its output file instead of wiping it */
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (trunc ? O_TRUNC : 0);
    snprintf(step, sizeof step, "opening stdout %s", out_path);
    int out = open(out_path, flags, 0644);
    if (out < 0) fail();
    int err = out;
    if (err_path && strcmp(err_path, out_path) != 0) {
        snprintf(step, sizeof step, "opening stderr %s", err_path);
        err = open(err_path, flags, 0644);
        if (err < 0) fail();
    }
    snprintf(step, sizeof step, "opening /dev/null");
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0) fail();
    if (dup2(null, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) fail();
    if (!as_user) {
        snprintf(step, sizeof step, "taking back root to start %s", prog[0]);
        if (setresuid(0, 0, 0) != 0 || setresgid(0, 0, 0) != 0 || setgroups((size_t)nroot, root_groups) != 0)
            fail();
    }
    for (int k = 0; k < nkeep; k++) {
        int fl = fcntl(keep[k], F_GETFD);
        if (fl >= 0) fcntl(keep[k], F_SETFD, fl & ~FD_CLOEXEC);
    }
    close_others(keep, nclose_keep);
    fcntl(errfd, F_SETFD, FD_CLOEXEC); /* a successful exec closes it: the job started */
    snprintf(step, sizeof step, "exec of %s", label);
    execve(prog[0], prog, env);
    fail_with(errno, errno == ENOENT ? hint : NULL);
    return 127;
}
