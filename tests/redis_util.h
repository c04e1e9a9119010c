/*
 * redis_util.h - a Redis Cluster of the test's own: redis-server
 * processes on free loopback ports of 127.0.0.1, joined with
 * `redis-cli --cluster create`, and stopped by their PIDs.
 *
 * Each server is started with PR_SET_PDEATHSIG = SIGKILL, so that the
 * kernel kills it if the test dies in any way (a signal, a sanitizer
 * abort, _exit), and is killed and reaped by the test's exit handler
 * otherwise.  Servers never listen on anything but 127.0.0.1 and keep no
 * data on disk (save "" and no AOF: a server restarted comes back empty).
 * They log to a directory of their own under $TMPDIR (or /tmp), which the
 * exit handler removes, unless the test failed: then it is kept and named.
 *
 * Ports: a server binds its port p and its cluster bus port p + 10000.
 * Both are picked below the kernel's ephemeral range
 * (/proc/sys/net/ipv4/ip_local_port_range), where the client side of the
 * other tests' connections (and their TIME_WAIT sockets) never are, and
 * checked free by binding them.  Another test picking the same port at
 * the same time is still possible: a server that could not bind (its log
 * says "Address already in use") makes tr_start() start again at once
 * with new ports.
 *
 * Load: the cluster node timeout is 5 s with replicas (a failover takes
 * about that) and 15 s without, so that a server descheduled on a busy
 * machine is not failed by the others, and the waits for the cluster are
 * generous (they end as soon as it is up).
 *
 * tr_start() returns TU_SKIP_CODE (with the reason on stderr) when
 * redis-server or redis-cli is missing or the cluster does not come up;
 * with ENGRAM_REQUIRE_REDIS=1 in the environment (scripts/test.sh sets
 * it) that is a failure instead.
 */
#ifndef ENGRAM_REDIS_UTIL_H
#define ENGRAM_REDIS_UTIL_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "testutil.h"

#define TR_MAX 12

/* A base port p is picked in [TR_PORT_MIN, ephemeral start - TR_BUS_OFFSET). */
#define TR_PORT_MIN 11000
#define TR_BUS_OFFSET 10000

typedef struct tr_cluster {
    int n, masters, replicas;
    int node_timeout_ms;
    int port[TR_MAX];
    pid_t pid[TR_MAX];
    char dir[400];
    char nodes[TR_MAX * 24]; /* "127.0.0.1:p,127.0.0.1:q,..." */
    char password[64];       /* the default user's ("" = none) */
    const char *const *extra; /* more "--option value" arguments, NULL-terminated */
} tr_cluster;

/* Every server started and not yet reaped, for the exit handler; the
 * process that started them; the directory of their logs. */
static pid_t tr_all_pids[64];
static pid_t tr_owner;
static char tr_logs[300];
static int tr_keep_logs;

/* The exit handler: kills and reaps the servers (only in the process
 * that started them: a forked child that exits must not), then removes
 * their logs, or keeps them if the test failed. */
static inline void tr_kill_all(void)
{
    if (getpid() != tr_owner)
        return;
    for (size_t i = 0; i < sizeof tr_all_pids / sizeof *tr_all_pids; i++) {
        if (tr_all_pids[i] > 0) {
            kill(tr_all_pids[i], SIGKILL);
            waitpid(tr_all_pids[i], NULL, 0);
            tr_all_pids[i] = 0;
        }
    }
    if (tr_logs[0] && (tu_failed || tr_keep_logs))
        fprintf(stderr, "the Redis servers' logs are kept in %s\n", tr_logs);
    else if (tr_logs[0])
        tu_rm_rf(tr_logs);
}

/* The directory the servers log to (made once per process). */
static inline const char *tr_logs_dir(void)
{
    const char *tmp = getenv("TMPDIR");
    if (tr_logs[0])
        return tr_logs;
    snprintf(tr_logs, sizeof tr_logs, "%s/engram-redis-%ld-XXXXXX", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    if (!mkdtemp(tr_logs)) {
        fprintf(stderr, "FAIL: mkdtemp(%s): %s\n", tr_logs, strerror(errno));
        tr_logs[0] = '\0';
        tu_fail_exit();
    }
    return tr_logs;
}

static inline void tr_track(pid_t pid)
{
    if (!tr_owner) {
        tr_owner = getpid();
        atexit(tr_kill_all);
    }
    for (size_t i = 0; i < sizeof tr_all_pids / sizeof *tr_all_pids; i++)
        if (tr_all_pids[i] == 0) {
            tr_all_pids[i] = pid;
            return;
        }
}

static inline void tr_untrack(pid_t pid)
{
    for (size_t i = 0; i < sizeof tr_all_pids / sizeof *tr_all_pids; i++)
        if (tr_all_pids[i] == pid)
            tr_all_pids[i] = 0;
}

static inline int tr_skip(const char *why)
{
    const char *req = getenv("ENGRAM_REQUIRE_REDIS");
    /* The reason names the logs of the cluster that did not come up. */
    tr_keep_logs = 1;
    if (req && strcmp(req, "1") == 0) {
        fprintf(stderr, "FAIL: %s (ENGRAM_REQUIRE_REDIS=1)\n", why);
        tu_fail_exit();
    }
    printf("SKIP: %s\n", why);
    return TU_SKIP_CODE;
}

static inline int tr_in_path(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[1024];
    while (path && *path) {
        const char *c = strchr(path, ':');
        size_t n = c ? (size_t)(c - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, path, prog);
        if (access(buf, X_OK) == 0)
            return 1;
        path += n + (c != NULL);
    }
    return 0;
}

/* The first port of the kernel's ephemeral range: the ports it gives
 * the client side of connections and bind() to port 0 (32768 if it
 * cannot be read). */
static inline int tr_ephemeral_start(void)
{
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
    int lo = 32768, hi;
    if (f) {
        if (fscanf(f, "%d %d", &lo, &hi) != 2)
            lo = 32768;
        fclose(f);
    }
    return lo;
}

/* 1 if nothing holds TCP port `port` of 127.0.0.1: no listener, no
 * connection, no TIME_WAIT (bind() without SO_REUSEADDR refuses them
 * all). */
static inline int tr_port_free(int port)
{
    struct sockaddr_in a;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), ok;
    if (s < 0 || port <= 0 || port > 65535) {
        if (s >= 0)
            close(s);
        return 0;
    }
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    ok = bind(s, (struct sockaddr *)&a, sizeof a) == 0;
    close(s);
    return ok;
}

/* 1 if base port p, or its bus port, is one of taken[0..n) or theirs. */
static inline int tr_port_taken(int p, const int *taken, int n)
{
    for (int i = 0; i < n; i++)
        if (p == taken[i] || p == taken[i] + TR_BUS_OFFSET || p + TR_BUS_OFFSET == taken[i])
            return 1;
    return 0;
}

/* A free TCP port p of 127.0.0.1 whose cluster bus port p + 10000 is free
 * too, both below the ephemeral range (see the top), and neither one of
 * taken[0..n) nor their bus ports.  -1 if none is found. */
static inline int tr_pick_port(const int *taken, int n)
{
    static unsigned seed;
    int lo = TR_PORT_MIN, hi = tr_ephemeral_start() - TR_BUS_OFFSET - 1;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    if (hi - lo >= 64) {
        for (int tries = 0; tries < 4000; tries++) {
            int p = lo + (int)(rand_r(&seed) % (unsigned)(hi - lo + 1));
            if (!tr_port_taken(p, taken, n) && tr_port_free(p) &&
                tr_port_free(p + TR_BUS_OFFSET))
                return p;
        }
        return -1;
    }
    /* No room below the ephemeral range (a system that gives it nearly
     * every port): ports the kernel picks, checked free, and the retries
     * of tr_start() for one taken meanwhile. */
    for (int tries = 0; tries < 200; tries++) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), p;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(s, (struct sockaddr *)&a, &al) != 0) {
            if (s >= 0)
                close(s);
            continue;
        }
        p = ntohs(a.sin_port);
        close(s);
        if (p + TR_BUS_OFFSET <= 65535 && !tr_port_taken(p, taken, n) &&
            tr_port_free(p + TR_BUS_OFFSET))
            return p;
    }
    return -1;
}

/* A free port as tr_pick_port() picks them, for a test that wants one
 * nothing listens on. */
static inline int tr_free_port(void)
{
    return tr_pick_port(NULL, 0);
}

/* Starts (or restarts) server i of c.  Returns its PID. */
static inline pid_t tr_spawn(tr_cluster *c, int i)
{
    char port[16], conf[400], log[450], timeout[16];
    const char *argv[64];
    int a = 0;
    pid_t parent = getpid(), pid;
    snprintf(port, sizeof port, "%d", c->port[i]);
    snprintf(conf, sizeof conf, "nodes-%d.conf", c->port[i]);
    snprintf(log, sizeof log, "%s/server-%d.log", c->dir, c->port[i]);
    snprintf(timeout, sizeof timeout, "%d", c->node_timeout_ms);
    argv[a++] = "redis-server";
    argv[a++] = "--port";
    argv[a++] = port;
    argv[a++] = "--bind";
    argv[a++] = "127.0.0.1";
    argv[a++] = "--cluster-enabled";
    argv[a++] = "yes";
    argv[a++] = "--cluster-config-file";
    argv[a++] = conf;
    argv[a++] = "--cluster-node-timeout";
    argv[a++] = timeout;
    argv[a++] = "--dir";
    argv[a++] = c->dir;
    argv[a++] = "--save";
    argv[a++] = "";
    argv[a++] = "--appendonly";
    argv[a++] = "no";
    argv[a++] = "--logfile";
    argv[a++] = log;
    argv[a++] = "--daemonize";
    argv[a++] = "no";
    if (c->password[0]) {
        argv[a++] = "--requirepass";
        argv[a++] = c->password;
        argv[a++] = "--masterauth";
        argv[a++] = c->password;
    }
    for (int e = 0; c->extra && c->extra[e] && a < 62; e++)
        argv[a++] = c->extra[e];
    argv[a] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "FAIL: fork: %s\n", strerror(errno));
        tu_fail_exit();
    }
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        /* Dies with the test, however the test dies. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp("redis-server", (char *const *)(uintptr_t)argv);
        _exit(127);
    }
    tr_track(pid);
    c->pid[i] = pid;
    return pid;
}

/* Stops server i (SIGKILL: no shutdown save) and reaps it. */
static inline void tr_kill(tr_cluster *c, int i)
{
    if (c->pid[i] > 0) {
        kill(c->pid[i], SIGKILL);
        waitpid(c->pid[i], NULL, 0);
        tr_untrack(c->pid[i]);
        c->pid[i] = 0;
    }
}

static inline void tr_stop(tr_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        tr_kill(c, i);
}

/* A connection to server i, authenticated; NULL if it does not answer. */
static inline redisContext *tr_connect(const tr_cluster *c, int i)
{
    struct timeval tv = {1, 0};
    redisContext *r = redisConnectWithTimeout("127.0.0.1", c->port[i], tv);
    if (!r || r->err) {
        if (r)
            redisFree(r);
        return NULL;
    }
    redisSetTimeout(r, (struct timeval){10, 0});
    if (c->password[0]) {
        redisReply *a = redisCommand(r, "AUTH %s", c->password);
        if (a)
            freeReplyObject(a);
    }
    return r;
}

/* Runs a command on server i; NULL if it does not answer. */
static inline redisReply *tr_vcmd(const tr_cluster *c, int i, const char *fmt, va_list ap)
{
    redisContext *r = tr_connect(c, i);
    redisReply *rep;
    if (!r)
        return NULL;
    rep = redisvCommand(r, fmt, ap);
    redisFree(r);
    return rep;
}

static inline redisReply *tr_cmd(const tr_cluster *c, int i, const char *fmt, ...)
{
    va_list ap;
    redisReply *r;
    va_start(ap, fmt);
    r = tr_vcmd(c, i, fmt, ap);
    va_end(ap);
    return r;
}

/* Runs a command that must succeed (not an error reply); returns the
 * reply. */
static inline redisReply *tr_must(const tr_cluster *c, int i, const char *fmt, ...)
{
    va_list ap;
    redisReply *r;
    va_start(ap, fmt);
    r = tr_vcmd(c, i, fmt, ap);
    va_end(ap);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        TU_FAIL_HEAD(__FILE__, __LINE__);
        fprintf(stderr, "redis command '%s' on port %d: %s\n", fmt, c->port[i],
                r ? r->str : "no answer");
        tu_fail_exit();
    }
    return r;
}

static inline void tr_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static inline uint64_t tr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 1 if reply text `r` (INFO-style) contains `needle`. */
static inline int tr_has(const redisReply *r, const char *needle)
{
    return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) &&
           strstr(r->str, needle) != NULL;
}

/* 1 if server i is a master (ROLE). */
static inline int tr_is_master(const tr_cluster *c, int i)
{
    redisReply *r = tr_cmd(c, i, "ROLE");
    int m = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0 &&
            r->element[0]->type == REDIS_REPLY_STRING && strcmp(r->element[0]->str, "master") == 0;
    if (r)
        freeReplyObject(r);
    return m;
}

/* Waits until every live server says cluster_state:ok and knows `known`
 * nodes, and every live master has `replicas` replicas online.  1 if so
 * within `ms`. */
static inline int tr_wait_ok(const tr_cluster *c, int known, int replicas, unsigned ms)
{
    uint64_t end = tr_now_ms() + ms;
    char kn[64], sl[64];
    snprintf(kn, sizeof kn, "cluster_known_nodes:%d", known);
    snprintf(sl, sizeof sl, "connected_slaves:%d", replicas);
    while (tr_now_ms() < end) {
        int ok = 1;
        for (int i = 0; i < c->n && ok; i++) {
            redisReply *r;
            if (c->pid[i] <= 0)
                continue;
            r = tr_cmd(c, i, "CLUSTER INFO");
            ok = tr_has(r, "cluster_state:ok") && tr_has(r, "cluster_slots_ok:16384") &&
                 tr_has(r, kn);
            if (r)
                freeReplyObject(r);
            if (ok && replicas >= 0 && tr_is_master(c, i)) {
                int owns;
                r = tr_cmd(c, i, "CLUSTER SLOTS");
                owns = 0;
                /* Only masters that serve slots have replicas. */
                if (r && r->type == REDIS_REPLY_ARRAY)
                    for (size_t k = 0; k < r->elements; k++)
                        if (r->element[k]->elements >= 3 &&
                            r->element[k]->element[2]->element[1]->integer == c->port[i])
                            owns = 1;
                if (r)
                    freeReplyObject(r);
                if (owns) {
                    r = tr_cmd(c, i, "INFO replication");
                    ok = tr_has(r, sl) && (replicas == 0 || !tr_has(r, "state=wait_bgsave")) &&
                         (replicas == 0 || tr_has(r, "state=online"));
                    if (r)
                        freeReplyObject(r);
                }
            }
        }
        if (ok)
            return 1;
        tr_sleep_ms(100);
    }
    return 0;
}

/* 1 if the log of server i says it could not bind a port. */
static inline int tr_bind_failed(const tr_cluster *c, int i)
{
    char path[460], line[512];
    int found = 0;
    FILE *f;
    snprintf(path, sizeof path, "%s/server-%d.log", c->dir, c->port[i]);
    if (!(f = fopen(path, "re")))
        return 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, "Address already in use") != NULL;
    fclose(f);
    return found;
}

/* Waits until server i answers: 1, or 0 when `ms` have passed, or -1 if
 * the server exited (reaped here; tr_bind_failed() tells whether it
 * could not bind its ports). */
static inline int tr_wait_started(tr_cluster *c, int i, unsigned ms)
{
    uint64_t end = tr_now_ms() + ms;
    while (tr_now_ms() < end) {
        redisContext *r = tr_connect(c, i);
        if (r) {
            redisFree(r);
            return 1;
        }
        if (c->pid[i] > 0 && waitpid(c->pid[i], NULL, WNOHANG) == c->pid[i]) {
            tr_untrack(c->pid[i]);
            c->pid[i] = 0;
            return -1;
        }
        tr_sleep_ms(50);
    }
    return 0;
}

/* Waits until server i answers: 1 if it does within `ms`, else 0. */
static inline int tr_wait_up(tr_cluster *c, int i, unsigned ms)
{
    return tr_wait_started(c, i, ms) == 1;
}

/* Starts a cluster of `masters` masters with `replicas` replicas each;
 * `password` ("" or NULL: none) for the default user, `extra` more
 * server arguments (NULL-terminated, may be NULL).  0, or TU_SKIP_CODE
 * with the reason printed.  Three attempts, each with new ports; a server
 * that could not bind a port taken meanwhile starts a new attempt at
 * once, not counted among the three (up to 20 of those). */
static inline int tr_start(tr_cluster *c, int masters, int replicas, const char *password,
                           const char *const *extra)
{
    char why[700];
    int attempt = 0, rebinds = 0;
    memset(c, 0, sizeof *c);
    c->masters = masters;
    c->replicas = replicas;
    c->n = masters * (1 + replicas);
    c->extra = extra;
    c->node_timeout_ms = replicas ? 5000 : 15000;
    snprintf(c->password, sizeof c->password, "%s", password ? password : "");
    if (c->n > TR_MAX) {
        fprintf(stderr, "FAIL: at most %d servers\n", TR_MAX);
        tu_fail_exit();
    }
    if (!tr_in_path("redis-server") || !tr_in_path("redis-cli"))
        return tr_skip("redis-server or redis-cli not found in PATH (Debian: apt-get install "
                       "redis-server redis-tools; scripts/setup.sh does it)");
    while (attempt < 3) {
        int up = 1, a = 0, status, rebind = 0;
        const char *argv[TR_MAX + 8];
        char addrs[TR_MAX][24], reps[8];
        pid_t pid;
        snprintf(c->dir, sizeof c->dir, "%s/redis-%d-%d-%d", tr_logs_dir(),
                 masters * 10 + replicas, attempt, rebinds);
        if (mkdir(c->dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "FAIL: mkdir %s: %s\n", c->dir, strerror(errno));
            tu_fail_exit();
        }
        c->nodes[0] = '\0';
        for (int i = 0; i < c->n; i++) {
            if ((c->port[i] = tr_pick_port(c->port, i)) < 0) {
                tr_stop(c);
                return tr_skip("no free loopback port below the ephemeral range");
            }
            snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", c->port[i]);
            snprintf(c->nodes + strlen(c->nodes), sizeof c->nodes - strlen(c->nodes), "%s%s",
                     i ? "," : "", addrs[i]);
            tr_spawn(c, i);
        }
        for (int i = 0; i < c->n && up; i++) {
            int r = tr_wait_started(c, i, 30000);
            up = r == 1;
            rebind = r < 0 && tr_bind_failed(c, i);
            if (!up)
                snprintf(why, sizeof why, "redis-server on port %d %s (its log: %s/server-%d.log)",
                         c->port[i],
                         r == 0   ? "did not answer within 30 s"
                         : rebind ? "could not bind its ports: Address already in use"
                                  : "exited",
                         c->dir, c->port[i]);
        }
        if (!up) {
            tr_stop(c);
            if (rebind && rebinds < 20) {
                /* Another process took one of its ports since it was found
                 * free: new ports, at once. */
                rebinds++;
                continue;
            }
            attempt++;
            continue;
        }
        argv[a++] = "redis-cli";
        argv[a++] = "--cluster";
        argv[a++] = "create";
        for (int i = 0; i < c->n; i++)
            argv[a++] = addrs[i];
        snprintf(reps, sizeof reps, "%d", replicas);
        argv[a++] = "--cluster-replicas";
        argv[a++] = reps;
        argv[a++] = "--cluster-yes";
        argv[a] = NULL;
        fflush(stdout);
        fflush(stderr);
        if ((pid = fork()) == 0) {
            char logp[460];
            int fd;
            snprintf(logp, sizeof logp, "%s/create.log", c->dir);
            fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            if (c->password[0])
                setenv("REDISCLI_AUTH", c->password, 1);
            execvp("redis-cli", (char *const *)(uintptr_t)argv);
            _exit(127);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            snprintf(why, sizeof why, "redis-cli --cluster create failed (see %s/create.log)",
                     c->dir);
            tr_stop(c);
            attempt++;
            continue;
        }
        if (!tr_wait_ok(c, c->n, replicas, 120000)) {
            snprintf(why, sizeof why, "the cluster did not reach cluster_state:ok within 120 s "
                                      "(logs in %s)",
                     c->dir);
            tr_stop(c);
            attempt++;
            continue;
        }
        printf("   (redis servers on %s, logs in %s: kept if the test fails)\n", c->nodes,
               c->dir);
        return 0;
    }
    return tr_skip(why);
}

/* The index of the server on `port`, or -1. */
static inline int tr_index(const tr_cluster *c, int port)
{
    for (int i = 0; i < c->n; i++)
        if (c->port[i] == port)
            return i;
    return -1;
}

/* The index of the master serving `slot` as live server `ask` sees it. */
static inline int tr_slot_owner(const tr_cluster *c, int ask, unsigned slot)
{
    redisReply *r = tr_must(c, ask, "CLUSTER SLOTS");
    int owner = -1;
    for (size_t k = 0; k < r->elements; k++) {
        const redisReply *e = r->element[k];
        if ((unsigned long long)e->element[0]->integer <= slot &&
            slot <= (unsigned long long)e->element[1]->integer)
            owner = tr_index(c, (int)e->element[2]->element[1]->integer);
    }
    freeReplyObject(r);
    return owner;
}

/* The node id of server i (CLUSTER MYID), into id[41]. */
static inline void tr_node_id(const tr_cluster *c, int i, char *id)
{
    redisReply *r = tr_must(c, i, "CLUSTER MYID");
    snprintf(id, 41, "%s", r->str);
    freeReplyObject(r);
}

/* A live server other than `not` (-1: any). */
static inline int tr_live(const tr_cluster *c, int not)
{
    for (int i = 0; i < c->n; i++)
        if (i != not && c->pid[i] > 0)
            return i;
    return -1;
}

#endif
