/*
 * cluster_int.h - the inside of the Redis Cluster client, shared by its
 * files (internal to src/redis/: slots.c routes, conn.c connects, cluster.c
 * runs single commands, read.c runs batches of ranged reads).  What the
 * client offers is cluster.h.
 */
#ifndef ENGRAM_REDIS_CLUSTER_INT_H
#define ENGRAM_REDIS_CLUSTER_INT_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cluster.h"

#define READ_BUF (64u << 10) /* bytes read from a socket at once */
/* Bytes handed to hiredis's reader at once.  It keeps unparsed bytes in
 * one buffer and moves what is left to its front every time a parse has
 * consumed 1 KiB, so feeding it a large read costs a copy per reply of
 * the rest of the read; small slices keep that copy short. */
#define FEED_SLICE 4096u
#define BACKOFF_MIN_NS 1000000u    /* 1 ms */
#define BACKOFF_MAX_NS 100000000u  /* 100 ms */
#define ASK_MARK UINT32_MAX        /* an expected reply that answers ASKING */

typedef struct rnode {
    char host[256];
    char addr[272]; /* host:port, for messages and MOVED matching */
    int port;
    _Atomic int replicas; /* as the last map said: what WAIT waits for */
} rnode;

/* Why a range of a batch is not done (rcl_get.why). */
enum { W_NONE, W_MOVED, W_ASK, W_BUSY, W_CONN, W_NOSLOT };

/* What the last reply parsed on a connection was (fast functions). */
enum { K_NONE, K_STRING, K_ERROR, K_STATUS, K_INTEGER, K_NIL, K_ARRAY };

typedef struct rconn {
    int fd;
    uint32_t node;
    redisReader *rd;
    redisReplyObjectFunctions *plain_fn; /* hiredis's own: redisReply objects */
    char *out;
    size_t olen, ocap, ooff;
    uint32_t *exp; /* batch: the range each reply answers, or ASK_MARK */
    size_t nexp, expcap, ehead;
    int dirty;     /* wrote since the last sync */
    int failed;    /* the connection broke: closed at the end of the batch */
    int err;       /* why it failed */
    /* The last reply, as the fast functions saw it. */
    int rkind;
    size_t rlen;
    char rtext[200];
    engram__rcl_get *g; /* the batch's ranges */
} rconn;

struct engram__rsess {
    engram__rcl *cl;
    struct engram__rsess *next;     /* free list */
    struct engram__rsess *all_next; /* every session, for destroy */
    rconn **conns;                  /* [ENGRAM__RCL_MAX_NODES] */
    rconn **act;                    /* connections of the current batch */
    struct pollfd *pfd;
    uint32_t *order, *cnt;          /* ranges grouped by node */
    size_t order_cap;
    engram__rcl_get *gets;
    size_t gets_cap;
    char *rbuf;
    int lost_dirty;                 /* a connection with unsynced writes broke ... */
    uint8_t lost[ENGRAM__RCL_MAX_NODES]; /* ... to these nodes (while lost_dirty) */
    /* The batch's failures: the first final one, the last transient one. */
    int final_code;
    char final_msg[1200];
    char last_msg[700];
};

struct engram__rcl {
    pthread_mutex_t lock;         /* nodes, sessions */
    pthread_mutex_t refresh_lock; /* one map reload at a time (and ctl) */
    rnode *nodes[ENGRAM__RCL_MAX_NODES];
    _Atomic uint32_t nnodes;
    uint32_t nseeds;
    _Atomic uint16_t slot_node[ENGRAM__RCL_SLOTS];
    _Atomic uint64_t map_version;
    uint16_t fresh[ENGRAM__RCL_SLOTS]; /* the map being loaded (refresh_lock) */
    _Atomic uint32_t next_probe;  /* the node a reload asks first */
    engram__rsess *free, *all;
    engram__rsess *ctl;           /* the reloads' session (refresh_lock) */
    pid_t pid;                    /* the process the sessions belong to */
    char *user, *password, *seeds;
    uint64_t timeout_ns, connect_ns;
    /* Counters (engram_redis_stats). */
    _Atomic uint64_t batches, gets, commands, moved, ask, retries, connects, conn_errors,
        refreshes, timeouts;
};

static inline void ctr(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static inline const rnode *node_get(engram__rcl *cl, uint32_t id)
{
    /* Nodes below the count are complete (release store in intern);
     * callers hold ids they got from intern or the map, both below it. */
    (void)atomic_load_explicit(&cl->nnodes, memory_order_acquire);
    return cl->nodes[id];
}

static inline uint64_t map_version(engram__rcl *cl)
{
    return atomic_load_explicit(&cl->map_version, memory_order_acquire);
}

static inline uint32_t slot_owner(engram__rcl *cl, unsigned slot)
{
    return atomic_load_explicit(&cl->slot_node[slot], memory_order_relaxed);
}

/* The functions the client's files share go by their short names in
 * these files; the linker sees them prefixed, so that nothing the static
 * library holds can collide with a program's own names. */
#define parse_addr engram__rcl_parse_addr
#define node_intern engram__rcl_node_intern
#define redirect_node engram__rcl_redirect_node
#define denied engram__rcl_denied
#define transient_error engram__rcl_transient_error
#define refresh engram__rcl_refresh
#define map_failed engram__rcl_map_failed
#define backoff engram__rcl_backoff
#define conn_close engram__rcl_conn_close
#define out_reserve engram__rcl_out_reserve
#define left_ms engram__rcl_left_ms
#define conn_flush engram__rcl_conn_flush
#define conn_reply engram__rcl_conn_reply
#define conn_append_argv engram__rcl_conn_append_argv
#define conn_call engram__rcl_conn_call
#define conn_get engram__rcl_conn_get
#define sess_free engram__rcl_sess_free
#define sess_new engram__rcl_sess_new

/* ---- slots.c ---- */

/* Splits "host:port" (IPv6 in brackets, or bare with the port after the
 * last ':').  0 or -EINVAL. */
int parse_addr(const char *s, size_t n, char *host, size_t hcap, int *port);
/* The index of node host:port, added if new.  ENGRAM__RCL_NONE when the
 * table is full or out of memory. */
uint32_t node_intern(engram__rcl *cl, const char *host, int port);
/* The node of a "MOVED <slot> <host:port>" or "ASK ..." error. */
uint32_t redirect_node(engram__rcl *cl, const char *text, unsigned *slot);
/* Whether an error reply says the connection's user may not. */
int denied(const char *text);
/* Whether an error reply names a passing condition of the cluster. */
int transient_error(const char *text);
/* Loads the slot map from the first node that answers CLUSTER SLOTS,
 * unless it changed since `seen` (another thread reloaded it).  0, or a
 * negative code with the reason in the thread's message. */
int refresh(engram__rcl *cl, uint64_t seen, uint64_t deadline);
/* After a failed reload of the slot map: adds its message to the failure
 * that made it needed, in s->last_msg. */
void map_failed(engram__rsess *s);
/* Sleeps the backoff of retry `attempt` (1 ms doubling to 100 ms), not
 * past the deadline. */
void backoff(unsigned attempt, uint64_t deadline);

/* ---- conn.c ---- */

/* Milliseconds left until `deadline`, rounded up. */
uint64_t left_ms(uint64_t deadline);
/* Closes c and forgets it in s; a connection with writes not yet synced
 * is remembered as lost (engram__rcl_sync() fails). */
void conn_close(engram__rsess *s, rconn *c);
/* Room for `more` bytes at the end of c's output: 0 or -ENOMEM. */
int out_reserve(rconn *c, size_t more);
/* Writes what the connection has to write without blocking: 0, or a
 * negative errno (the connection is broken). */
int conn_flush(rconn *c);
/* Waits for one plain reply (hiredis objects) on c, writing what is
 * pending first.  0 and *reply, -ETIMEDOUT, -EIO / -errno (broken). */
int conn_reply(engram__rsess *s, rconn *c, uint64_t deadline, redisReply **reply);
/* Formats argv as a command and appends it to c's output. */
int conn_append_argv(rconn *c, int argc, const char **argv, const size_t *lens);
/* Runs one command on c and waits for its reply. */
int conn_call(engram__rsess *s, rconn *c, int argc, const char **argv, const size_t *lens,
              uint64_t deadline, redisReply **reply);
/* s's connection to node `id`, opened (and authenticated) if it has none:
 * 0 and *out; on failure a negative errno with the reason in s->last_msg:
 * -EACCES (AUTH refused) is final, anything else transient. */
int conn_get(engram__rsess *s, uint32_t id, uint64_t deadline, rconn **out);
/* A new session of cl, with no connection; NULL without memory. */
engram__rsess *sess_new(engram__rcl *cl);
/* Closes s's connections and frees it. */
void sess_free(engram__rsess *s);

#endif
