/*
 * cli.h - what the files of the `engram` command-line tool share.
 *
 * The tool is a thin front end over the public API of engram.h: it creates,
 * imports, lists, inspects, verifies, looks up and removes tables of one
 * namespace, lists and removes namespaces (`ns`), measures lookups
 * against baselines taken in the same run (`bench`), and runs the
 * end-to-end `demo` shown in the README (one DeepSeek-shaped Engram layer,
 * decode-shaped lookups checked byte for byte).  Internal to the tool;
 * nothing here is installed.  docs/cli.md is its user documentation.
 *
 * Files:
 *   cli_main.c    main(), the command table, argument parsing, help
 *   cli_util.c    error reports, number parsing and formatting, the row
 *                 fills, the progress display, opening the command's store
 *                 (with "did you mean" for a mistyped namespace)
 *   cli_tables.c  create, ls, info, verify, rm, lookup
 *   cli_ns.c      ns ls, ns rm
 *   cli_import.c  writing a table from a row source; import (raw, .npy,
 *                 safetensors)
 *   cli_ckpt.c    checkpoints: inspect, and import --layers (every layer's
 *                 Engram tensors split into the layer API's head tables)
 *   cli_deploy.c  plan (shards of TP x DP ranks), wait, mem (who maps
 *                 each table, which memory cgroup pays for it), numa-copy
 *                 (a table's copy on a NUMA node)
 *   cli_bench.c   bench, and the timing it shares with the demo
 *   cli_demo.c    demo
 *   cli_push.c    push (a namespace's tables to a Redis Cluster)
 *   cli_ngram.c   layout and hash: the Engram n-gram hash (engram_ngram_*)
 *   npy.c         the .npy header parser (npy.h)
 *
 * Conventions: every command returns an exit status (0 ok, 1 an operation
 * failed, 2 usage error); library failures are reported as
 * "engram: <what>: <engram_errmsg()>" on stderr, warnings (an entry
 * skipped, exit status unchanged) as "engram: warning: <what>".  Commands
 * that change something print one line saying what they did on stdout;
 * --json output is one object that starts with "schema": CLI_JSON_SCHEMA.  Numeric arguments are
 * parsed strictly (no signs where none belong, no trailing junk, no
 * overflow).  Big inputs are streamed in fixed-size chunks so that tables
 * larger than memory can be created and imported.  The .npy header parser,
 * which reads bytes from outside and trusts no length before checking it,
 * lives in npy.c, where the fuzz target fuzz/fuzz_npy.c can drive it.
 *
 * Functions shared between the files are named cli_* and declared here;
 * each is documented where it is defined.  Everything else is static.
 */
#ifndef ENGRAM_TOOLS_CLI_H
#define ENGRAM_TOOLS_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engram.h"

#define EXIT_FAIL 1
#define EXIT_USAGE 2

/* ------------------------------------------------------------------------
 * The parsed command line (cli_main.c).
 */

/* Option ids: indexes of struct cli's opt[] and bits of a command's opts. */
enum {
    OPT_ROOT,
    OPT_NS,
    OPT_HELP,
    OPT_ROWS,
    OPT_ROW_BYTES,
    OPT_PITCH,
    OPT_FILL,
    OPT_SEED,
    OPT_JSON,
    OPT_MAP,
    OPT_ALL,
    OPT_OFFSET,
    OPT_ZERO_DEAD,
    OPT_IDS,
    OPT_ITERS,
    OPT_THREADS,
    OPT_COLS,
    OPT_HUGE,
    OPT_SMALL,
    OPT_TOKENS,
    OPT_KEEP,
    OPT_SAFETENSORS,
    OPT_WEIGHT,
    OPT_SCALE,
    OPT_FORCE,
    OPT_STRICT,
    OPT_LAYERS,
    OPT_HEAD_VOCAB,
    OPT_LAYER_IDS,
    OPT_TP,
    OPT_DP,
    OPT_PER_TP,
    OPT_READS,
    OPT_BALANCED,
    OPT_TIMEOUT,
    OPT_OLDER_THAN,
    OPT_DRY_RUN,
    OPT_SHARD,
    OPT_REDIS,
    OPT_TAGGED,
    OPT_NUMA_NODE,
    OPT_NUMA_GPU,
    OPT_INTERLEAVE,
    OPT_VOCAB_SIZE,
    OPT_MAX_NGRAM,
    OPT_HEADS,
    OPT_COMPRESSED_VOCAB,
    OPT_PAD_ID,
    OPT_CONFIG,
    OPT_TOKEN_MAP,
    OPT_HISTORY,
    OPT_LAYER,
    OPT_LOCAL,
    OPT_BY_ROWS,
    OPT_ORIGIN,
    OPT_COUNT
};
/* A command's accepted options are bits of a uint64_t. */
_Static_assert(OPT_COUNT <= 64, "more options than bits in struct command's opts");

/* The version of every --json output's keys ("schema": N, first): bumped
 * when a key changes meaning or goes away, not when one is added. */
#define CLI_JSON_SCHEMA 1

struct cli;

struct command {
    const char *name;
    int (*run)(struct cli *cli);
    uint64_t opts;  /* O(...) accepted besides the global ones */
    int min_args;   /* positional arguments */
    int max_args;   /* -1: no limit */
    const char *synopsis;
    const char *help;
};

struct cli {
    const struct command *cmd;
    const char *root;            /* NULL: engram_default_root() */
    const char *ns;
    const char *opt[OPT_COUNT];  /* value, or "" for a flag; NULL if absent */
    char **args;                 /* positional arguments of the command */
    int nargs;
};

__attribute__((format(printf, 2, 3))) int cli_usage_error(const struct cli *cli,
                                                         const char *fmt, ...);
int cli_opt_u64(const struct cli *cli, int id, uint64_t min, uint64_t max, uint64_t *out);
int cli_check_name(const struct cli *cli, const char *name);

/* ------------------------------------------------------------------------
 * Helpers (cli_util.c).
 */
extern volatile sig_atomic_t cli_interrupted;

const char *cli_lib_detail(int rc);
__attribute__((format(printf, 2, 3))) int cli_lib_fail(int rc, const char *fmt, ...);
__attribute__((format(printf, 1, 2))) int cli_fail(const char *fmt, ...);
__attribute__((format(printf, 1, 2))) void cli_warn(const char *fmt, ...);

int cli_parse_u64(const char *s, uint64_t *out);
int cli_parse_list(const char *s, uint64_t min, uint64_t *v, size_t cap, size_t *n);
int cli_mul_ok(uint64_t a, uint64_t b, uint64_t *out);
/* Edit distance (insertions, deletions, substitutions, swaps of
 * neighbours) of the first 255 bytes of a and b, for "did you mean". */
size_t cli_edit_distance(const char *a, const char *b);
const char *cli_closest(const char *want, const char *const *names, size_t n);
int cli_natural_cmp(const char *a, const char *b);
void cli_sort_names(char **names, size_t n);
int cli_table_fail(engram_store *st, int rc, const char *what, const char *name);
const char *cli_fmt_bytes(uint64_t n, char *buf, size_t len);
const char *cli_fmt_ns(double ns, char *buf, size_t len);
void cli_json_str(FILE *f, const char *s);
uint64_t cli_rng_next(uint64_t *s);

/* Synthetic row contents, reproducible from a seed (cli_util.c). */
enum fill { FILL_ZERO, FILL_PATTERN, FILL_RANDOM };
void cli_fill_row(unsigned char *dst, enum fill fill, uint64_t seed, uint64_t row,
                  uint32_t row_bytes);

/* Progress of a long operation on stderr, in bytes: on a terminal one line
 * redrawn in place (bar, percentage, bytes, rate, time left), erased at
 * the end; elsewhere a plain line every ENGRAM_PROGRESS_SECS seconds
 * (default 10) and, if any was printed, a final one. */
struct progress {
    const char *label;
    int tty;              /* stderr is a terminal */
    int shown;            /* terminal: a line to erase; else: lines were printed */
    uint64_t start_ns;    /* when it began */
    uint64_t last_ns;     /* when a line was last drawn or printed */
    uint64_t interval_ns; /* between two plain lines */
    uint64_t done, total; /* bytes, as last reported */
};
void cli_progress_init(struct progress *p, const char *label);
int cli_progress_cb(void *ud, uint64_t done, uint64_t total);
void cli_progress_end(struct progress *p);

const char *cli_root(const struct cli *cli);
int cli_ns_missing(const char *root, const char *ns, const char *what);
int cli_redis_ns_missing(const struct cli *cli, const char *what);
/* engram --redis NODES --ns NS gc: engram_store_gc() of a Redis
 * namespace, with idle_s from --older-than (0 without it). */
int cli_redis_gc(struct cli *cli, uint64_t idle_s);
int cli_open_redis(const struct cli *cli, const char *ns, uint32_t flags, engram_store **st,
                   int *status);
int cli_open_store(const struct cli *cli, uint32_t flags, int threads, engram_store **st,
                   int quiet_enoent, int *status);
int cli_open_for_write(const struct cli *cli, engram_store **st, int *made, int *status);
void cli_close_written(const struct cli *cli, engram_store *st, int made, int status);

/* ------------------------------------------------------------------------
 * Writing tables (cli_import.c).
 */

/* Source of rows for cli_write_table(): fills `n` rows starting at row
 * `first` into buf (row_bytes apart); returns 0 or an exit status after
 * reporting. */
typedef int (*row_source_fn)(void *ctx, unsigned char *buf, uint64_t first, uint64_t n);

/* The ctx of cli_synth_rows(): synthetic rows for create and the demo. */
struct synth_source {
    enum fill fill;
    uint64_t seed;
    uint32_t row_bytes;
};
int cli_synth_rows(void *ctx, unsigned char *buf, uint64_t first, uint64_t n);

int cli_write_table(engram_store *st, const char *verb, const char *name,
                    const engram_table_spec *spec, row_source_fn src, void *ctx);
int cli_write_table_range(engram_store *st, const char *verb, const char *name,
                          const engram_table_spec *spec, uint64_t row_start, uint64_t total_rows,
                          row_source_fn src, void *ctx);
int cli_read_pitch(const struct cli *cli, engram_table_spec *spec);

/* cli_write_table() hands its source chunks of at most this many bytes
 * (or one row, where a row is larger). */
#define CLI_CHUNK_BYTES ((size_t)8 << 20)

/* The ctx of cli_st_rows(): a range of rows of a checkpoint's weight
 * tensor, each followed by the same row of its scale tensor. */
struct cli_st_source {
    int fd[2];
    uint64_t off[2];  /* file offset of row 0 of the imported range */
    uint32_t len[2];  /* bytes per row of each tensor */
    unsigned n;       /* 1 or 2 tensors */
    unsigned char *tmp; /* CLI_ST_TMP_BYTES */
    const char *path;
};
#define CLI_ST_TMP_BYTES (CLI_CHUNK_BYTES + ENGRAM_ROW_BYTES_MAX)
int cli_st_rows(void *ctx, unsigned char *buf, uint64_t first, uint64_t n);
int cli_open_tensor_file(const char *name, const char *path, const char *tn,
                         engram_tensor_info *ti, const char *prev, char *file, size_t cap,
                         int *fd);
int cli_verify_rows(engram_store *st, const char *verb, const char *name,
                    const engram_table_spec *spec, row_source_fn src, void *ctx);

/* ------------------------------------------------------------------------
 * Checkpoints (cli_ckpt.c).
 */
const char *cli_fmt_shape(const engram_tensor_info *ti, char *buf, size_t len);
int cli_check_rows_tensor(const char *name, const char *tn, const engram_tensor_info *ti,
                          const char *ref_tn, const engram_tensor_info *ref, uint64_t *row_bytes);
int cli_import_layers(struct cli *cli);

/* ------------------------------------------------------------------------
 * Timing (cli_bench.c).
 */

/* An operation to time: 0, or an exit status after reporting. */
typedef int (*op_fn)(void *ctx, size_t iter);

/* What cli_measure() found, per call. */
struct timing {
    size_t iters;
    uint64_t total_ns;
    uint64_t median_ns;
    uint64_t p99_ns;
};

/* A lookup op over a ring of pre-built argument sets (different ids each
 * call, so caches do not flatter the result). */
struct lookup_op {
    engram_store *st;
    const engram_lookup_args *args;
    size_t nargs;
    const char *what;
};
int cli_lookup_op_run(void *ctx, size_t iter);

uint64_t cli_now_ns(void);
int cli_measure(op_fn op, void *ctx, size_t fixed, uint64_t budget_ns, size_t max_iters,
                struct timing *t);
double cli_per_second(uint64_t count_per_iter, const struct timing *t);
double cli_ratio(double a, double b);

/* ------------------------------------------------------------------------
 * The commands, each in the file named above.
 */
int cli_cmd_create(struct cli *cli);
int cli_cmd_ls(struct cli *cli);
int cli_cmd_info(struct cli *cli);
int cli_cmd_verify(struct cli *cli);
int cli_cmd_rm(struct cli *cli);
int cli_cmd_ns(struct cli *cli);
int cli_cmd_lookup(struct cli *cli);
int cli_cmd_import(struct cli *cli);
int cli_cmd_inspect(struct cli *cli);
int cli_cmd_bench(struct cli *cli);
int cli_cmd_demo(struct cli *cli);
int cli_cmd_plan(struct cli *cli);
int cli_cmd_layout(struct cli *cli); /* cli_ngram.c */
/* The n-gram layout of --config and the layout flags (--layer-ids too
 * with use_layer_ids; else only the config's): 0 and *out, or an exit
 * status after reporting (cli_ngram.c). */
int cli_make_layout(const struct cli *cli, int use_layer_ids, engram_ngram_layout **out);
int cli_cmd_hash(struct cli *cli);
int cli_cmd_wait(struct cli *cli);
int cli_cmd_mem(struct cli *cli);
int cli_cmd_gc(struct cli *cli);
int cli_cmd_push(struct cli *cli);
int cli_cmd_pull(struct cli *cli);
int cli_cmd_numa_copy(struct cli *cli);

#endif
