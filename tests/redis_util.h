/*
 * redis_util.h - a Redis Cluster of the test's own: redis-server
 * processes on free loopback ports of 127.0.0.1, joined with
 * `redis-cli --cluster create`, and stopped by their PIDs.
 *
 * Each server is started with PR_SET_PDEATHSIG = SIGKILL, so that the
 * kernel kills it if the test dies in any way (a signal, a sanitizer
 * abort, _exit), and is killed and reaped by the test's exit handler
 * otherwise.  Servers never listen on anything but 127.0.0.1, keep no
 * data on disk (save "" and no AOF: a server restarted comes back empty)
 * and log to the test's scratch directory.
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

typedef struct tr_cluster {
    int n, masters, replicas;
    int port[TR_MAX];
    pid_t pid[TR_MAX];
    char dir[300];
    char nodes[TR_MAX * 24]; /* "127.0.0.1:p,127.0.0.1:q,..." */
    char password[64];       /* the default user's ("" = none) */
    const char *const *extra; /* more "--option value" arguments, NULL-terminated */
} tr_cluster;

/* Every server started and not yet reaped, for the exit handler. */
static pid_t tr_all_pids[64];

static inline void tr_kill_all(void)
{
    for (size_t i = 0; i < sizeof tr_all_pids / sizeof *tr_all_pids; i++) {
        if (tr_all_pids[i] > 0) {
            kill(tr_all_pids[i], SIGKILL);
            waitpid(tr_all_pids[i], NULL, 0);
            tr_all_pids[i] = 0;
        }
    }
}

static inline void tr_track(pid_t pid)
{
    static int registered;
    if (!registered) {
        atexit(tr_kill_all);
        registered = 1;
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

/* A free TCP port p of 127.0.0.1 whose cluster bus port p + 10000 is free
 * too (the kernel picks p; it may be taken again before the server binds
 * it, which tr_start survives by trying again). */
static inline int tr_free_port(void)
{
    for (int tries = 0; tries < 200; tries++) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        int s = socket(AF_INET, SOCK_STREAM, 0), s2, port, ok;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(s, (struct sockaddr *)&a, &al) != 0) {
            if (s >= 0)
                close(s);
            continue;
        }
        port = ntohs(a.sin_port);
        close(s);
        if (port + 10000 > 65535)
            continue;
        s2 = socket(AF_INET, SOCK_STREAM, 0);
        a.sin_port = htons((uint16_t)(port + 10000));
        ok = s2 >= 0 && bind(s2, (struct sockaddr *)&a, sizeof a) == 0;
        if (s2 >= 0)
            close(s2);
        if (ok)
            return port;
    }
    return -1;
}

/* Starts (or restarts) server i of c.  Returns its PID. */
static inline pid_t tr_spawn(tr_cluster *c, int i)
{
    char port[16], conf[400], log[400], timeout[16];
    const char *argv[64];
    int a = 0;
    pid_t parent = getpid(), pid;
    snprintf(port, sizeof port, "%d", c->port[i]);
    snprintf(conf, sizeof conf, "nodes-%d.conf", c->port[i]);
    snprintf(log, sizeof log, "%s/server-%d.log", c->dir, c->port[i]);
    snprintf(timeout, sizeof timeout, "%d", 1500);
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

/* Waits until server i answers. */
static inline int tr_wait_up(const tr_cluster *c, int i, unsigned ms)
{
    uint64_t end = tr_now_ms() + ms;
    while (tr_now_ms() < end) {
        redisContext *r = tr_connect(c, i);
        if (r) {
            redisFree(r);
            return 1;
        }
        tr_sleep_ms(50);
    }
    return 0;
}

/* Starts a cluster of `masters` masters with `replicas` replicas each;
 * `password` ("" or NULL: none) for the default user, `extra` more
 * server arguments (NULL-terminated, may be NULL).  0, or TU_SKIP_CODE
 * with the reason printed. */
static inline int tr_start(tr_cluster *c, int masters, int replicas, const char *password,
                           const char *const *extra)
{
    char path[400], why[600];
    memset(c, 0, sizeof *c);
    c->masters = masters;
    c->replicas = replicas;
    c->n = masters * (1 + replicas);
    c->extra = extra;
    snprintf(c->password, sizeof c->password, "%s", password ? password : "");
    if (c->n > TR_MAX) {
        fprintf(stderr, "FAIL: at most %d servers\n", TR_MAX);
        tu_fail_exit();
    }
    if (!tr_in_path("redis-server") || !tr_in_path("redis-cli"))
        return tr_skip("redis-server or redis-cli not found in PATH (Debian: apt-get install "
                       "redis-server redis-tools; scripts/setup.sh does it)");
    for (int attempt = 0; attempt < 3; attempt++) {
        int ok = 1, a = 0, status;
        const char *argv[TR_MAX + 8];
        char addrs[TR_MAX][24], reps[8];
        pid_t pid;
        snprintf(path, sizeof path, "redis-%d-%d", attempt, masters * 10 + replicas);
        tu_path(c->dir, sizeof c->dir, path);
        if (mkdir(c->dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "FAIL: mkdir %s: %s\n", c->dir, strerror(errno));
            tu_fail_exit();
        }
        c->nodes[0] = '\0';
        for (int i = 0; i < c->n; i++) {
            if ((c->port[i] = tr_free_port()) < 0)
                return tr_skip("no free loopback port");
            snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%d", c->port[i]);
            snprintf(c->nodes + strlen(c->nodes), sizeof c->nodes - strlen(c->nodes), "%s%s",
                     i ? "," : "", addrs[i]);
            tr_spawn(c, i);
        }
        for (int i = 0; i < c->n && ok; i++)
            ok = tr_wait_up(c, i, 10000);
        if (!ok) {
            snprintf(why, sizeof why, "a redis-server did not start (logs in %s)", c->dir);
            tr_stop(c);
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
            char logp[450];
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
            continue;
        }
        if (!tr_wait_ok(c, c->n, replicas, 60000)) {
            snprintf(why, sizeof why, "the cluster did not reach cluster_state:ok (logs in %s)",
                     c->dir);
            tr_stop(c);
            continue;
        }
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
