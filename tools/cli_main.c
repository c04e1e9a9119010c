/*
 * cli_main.c - main(), the command table, argument parsing and help of the
 * `engram` command-line tool.  See cli.h for what the other files hold.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engram.h"
#include "cli.h"

/* ------------------------------------------------------------------------
 * Command-line parsing.
 */
static const struct opt_def {
    const char *name;
    int has_arg;
} opt_defs[OPT_COUNT] = {
    [OPT_ROOT] = {"root", 1},      [OPT_NS] = {"ns", 1},
    [OPT_HELP] = {"help", 0},      [OPT_ROWS] = {"rows", 1},
    [OPT_ROW_BYTES] = {"row-bytes", 1}, [OPT_PITCH] = {"pitch", 1},
    [OPT_FILL] = {"fill", 1},      [OPT_SEED] = {"seed", 1},
    [OPT_JSON] = {"json", 0},      [OPT_MAP] = {"map", 0},
    [OPT_ALL] = {"all", 0},        [OPT_OFFSET] = {"offset", 1},
    [OPT_ZERO_DEAD] = {"zero-dead", 0}, [OPT_IDS] = {"ids", 1},
    [OPT_ITERS] = {"iters", 1},    [OPT_THREADS] = {"threads", 1},
    [OPT_COLS] = {"cols", 1},      [OPT_HUGE] = {"huge", 0},
    [OPT_SMALL] = {"small", 0},    [OPT_TOKENS] = {"tokens", 1},
    [OPT_KEEP] = {"keep", 0},
    [OPT_SAFETENSORS] = {"safetensors", 1}, [OPT_WEIGHT] = {"weight", 1},
    [OPT_SCALE] = {"scale", 1},
    [OPT_FORCE] = {"force", 0},    [OPT_STRICT] = {"strict", 0},
    [OPT_LAYERS] = {"layers", 0},  [OPT_HEAD_VOCAB] = {"head-vocab", 1},
    [OPT_LAYER_IDS] = {"layer-ids", 1},
    [OPT_TP] = {"tp", 1},          [OPT_DP] = {"dp", 1},
    [OPT_PER_TP] = {"per-tp", 0},  [OPT_READS] = {"reads", 1},
    [OPT_BALANCED] = {"balanced", 0}, [OPT_TIMEOUT] = {"timeout", 1},
    [OPT_OLDER_THAN] = {"older-than", 1}, [OPT_DRY_RUN] = {"dry-run", 0},
    [OPT_SHARD] = {"shard", 1},
    [OPT_REDIS] = {"redis", 1},    [OPT_TAGGED] = {"tagged", 0},
    [OPT_NUMA_NODE] = {"numa-node", 1}, [OPT_NUMA_GPU] = {"numa-gpu", 1},
    [OPT_INTERLEAVE] = {"interleave", 1},
    [OPT_VOCAB_SIZE] = {"vocab-size", 1}, [OPT_MAX_NGRAM] = {"max-ngram", 1},
    [OPT_HEADS] = {"heads", 1},    [OPT_COMPRESSED_VOCAB] = {"compressed-vocab", 1},
    [OPT_PAD_ID] = {"pad-id", 1},  [OPT_CONFIG] = {"config", 1},
    [OPT_TOKEN_MAP] = {"token-map", 1}, [OPT_HISTORY] = {"history", 1},
    [OPT_LAYER] = {"layer", 1},    [OPT_LOCAL] = {"local", 0},
    [OPT_BY_ROWS] = {"by-rows", 0}, [OPT_ORIGIN] = {"origin", 0},
};

#define O(x) (UINT64_C(1) << OPT_##x)
#define GLOBAL_OPTS (O(ROOT) | O(NS) | O(HELP))
#define NUMA_OPTS (O(NUMA_NODE) | O(NUMA_GPU) | O(INTERLEAVE))
#define LAYOUT_OPTS                                                                          \
    (O(LAYER_IDS) | O(VOCAB_SIZE) | O(MAX_NGRAM) | O(HEADS) | O(COMPRESSED_VOCAB) |          \
     O(PAD_ID) | O(CONFIG))
#define LAYOUT_SYNOPSIS                                                                      \
    "(--config CONFIG.json | --layer-ids L,... --vocab-size V --max-ngram N --heads H\n"      \
    "                    --compressed-vocab C --pad-id P)"
#define LAYOUT_HELP                                                                          \
    "The layout, from a model's config.json (--config: engram_layer_ids,\n"                  \
    "engram_vocab_size, engram_max_ngram_size, engram_n_head_per_ngram,\n"                    \
    "engram_compressed_vocab_size, engram_pad_id, at the top or under text_config)\n"        \
    "or from the flags, which also replace the config's values:\n"                           \
    "  --layer-ids L,...     the model's Engram layers, in its config's order\n"             \
    "  --vocab-size V        the base table size (primes are searched above V - 1)\n"        \
    "  --max-ngram N         the longest n-gram (columns: (N - 1) x heads)\n"                \
    "  --heads H             heads per n-gram order\n"                                       \
    "  --compressed-vocab C  compressed token ids are below C\n"                             \
    "  --pad-id P            the compressed id of padding\n"
#define NUMA_HELP                                                                            \
    "\n"                                                                                     \
    "NUMA placement of the table's pages (a tmpfs namespace such as /dev/shm; one of):\n"   \
    "  --numa-node N     on node N (preferred: a full node spills to others)\n"            \
    "  --numa-gpu PCI    on the node of the PCI device PCI, a GPU's bus id such as\n"      \
    "                    0000:3b:00.0 (nvidia-smi --query-gpu=pci.bus_id)\n"               \
    "  --interleave L    interleaved over the nodes of list L (0-1,3) or all\n"           \
    "'engram info NAME' shows where the pages are (docs/operations.md, NUMA).\n"

/* Prints a usage error for the current command and returns 2. */
int cli_usage_error(const struct cli *cli, const char *fmt, ...)
{
    va_list ap;
    fputs("engram: ", stderr);
    if (cli->cmd)
        fprintf(stderr, "%s: ", cli->cmd->name);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (cli->cmd)
        fprintf(stderr, "\nTry 'engram %s --help'.\n", cli->cmd->name);
    else
        fputs("\nTry 'engram --help'.\n", stderr);
    return EXIT_USAGE;
}

/* Reads an unsigned option into *out (left alone when the option is
 * absent), checking [min, max].  Returns 0 or the usage exit status. */
int cli_opt_u64(const struct cli *cli, int id, uint64_t min, uint64_t max, uint64_t *out)
{
    const char *s = cli->opt[id];
    uint64_t v;
    int rc;

    if (!s)
        return 0;
    if ((rc = cli_parse_u64(s, &v)) == -2)
        return cli_usage_error(cli, "--%s: %s is out of range [%" PRIu64 ", %" PRIu64 "]",
                               opt_defs[id].name, s, min, max);
    if (rc != 0)
        return cli_usage_error(cli, "--%s: '%s' is not a non-negative decimal integer",
                               opt_defs[id].name, s);
    if (v < min || v > max)
        return cli_usage_error(cli, "--%s: %" PRIu64 " is outside [%" PRIu64 ", %" PRIu64 "]",
                               opt_defs[id].name, v, min, max);
    *out = v;
    return 0;
}

/* Checks a table name before any store is opened, as a usage error. */
int cli_check_name(const struct cli *cli, const char *name)
{
    int rc = engram_name_check(name);
    if (rc != 0)
        return cli_usage_error(cli, "invalid table name '%s': %s", name, cli_lib_detail(rc));
    return 0;
}

/* ------------------------------------------------------------------------
 * Commands, help and main.
 */
static const struct command commands[] = {
    {"create", cli_cmd_create,
     O(ROWS) | O(ROW_BYTES) | O(PITCH) | O(FILL) | O(SEED) | O(REDIS) | NUMA_OPTS, 1, 1,
     "create NAME --rows N --row-bytes R [--pitch P] [--fill zero|pattern|random] [--seed S]\n"
     "                   [--numa-node N | --numa-gpu PCI | --interleave L]",
     "Creates table NAME of N synthetic rows of R bytes, streamed to the store in 8 MiB\n"
     "chunks (so tables larger than memory work) and published atomically.\n"
     "\n"
     "  --rows N          number of rows (>= 1)\n"
     "  --row-bytes R     bytes per row (1 .. 16777216)\n"
     "  --pitch P         bytes between row starts (>= R; default R)\n"
     "  --fill KIND       zero, pattern (default) or random\n"
     "  --seed S          seed of the pattern and random fills (default 0)\n"
     "\n"
     "pattern: bytes 0..7 of row i hold i as a little-endian uint64 (truncated for\n"
     "shorter rows); the 8 bytes at offset 8*w (w >= 1) hold, little-endian,\n"
     "  mix64(S*0xD6E8FEB86659FD93 ^ i*0x9E3779B97F4A7C15 ^ w*0xC2B2AE3D27D4EB4F)\n"
     "where mix64(z) is the splitmix64 finaliser:\n"
     "  z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB;\n"
     "  z ^ z>>31   (all mod 2^64).\n"
     "random: the same construction with other constants for every word; reproducible\n"
     "from --seed.\n" NUMA_HELP},
    {"import", cli_cmd_import,
     O(ROW_BYTES) | O(PITCH) | O(SAFETENSORS) | O(WEIGHT) | O(SCALE) | O(ROWS) | O(LAYERS) |
         O(HEAD_VOCAB) | O(LAYER_IDS) | O(REDIS) | O(SHARD) | O(TP) | O(DP) | O(PER_TP) |
         O(READS) | O(BALANCED) | O(CONFIG) | NUMA_OPTS,
     0, 2,
     "import NAME FILE [--row-bytes R] [--pitch P] | import --safetensors CKPT --weight W "
     "[--scale S] [--rows A:B] [--pitch P] NAME | import --layers --safetensors CKPT "
     "(--head-vocab N0,N1,... | --config CONFIG.json) [--weight PAT] [--scale PAT] "
     "[--layer-ids L,...] [--pitch P] "
     "[--shard S --tp T [--dp D] [--per-tp] [--reads R0,... [--balanced]]]\n"
     "                   (each form also with [--numa-node N | --numa-gpu PCI | --interleave L])",
     "Creates table NAME from FILE, streamed in 8 MiB chunks.\n"
     "\n"
     "FILE is either an .npy file (recognised by its magic bytes; format 1.0, 2.0 or\n"
     "3.0) holding a C-ordered array of any dtype and shape (rows, ...): each row is\n"
     "the bytes of one entry of the first dimension, as stored (a uint8 (N, 264)\n"
     "array gives 264-byte rows, a float32 (N, 64) one 256-byte rows, a 1-D array\n"
     "rows of one element); or raw rows back to back, which needs --row-bytes and a\n"
     "size that is a multiple of it.\n"
     "\n"
     "  --row-bytes R     bytes per row (raw files; checked against .npy files)\n"
     "  --pitch P         bytes between row starts in the table (>= R; default R)\n"
     "\n"
     "With --safetensors, NAME is made of rows A:B (default: all) of the 2-D weight\n"
     "tensor W [N, C] of checkpoint CKPT, each followed by the same row of the scale\n"
     "tensor S [N, D] if given (e.g. [N, 256] F8_E4M3 + [N, 8] F8_E8M0 = 264-byte\n"
     "rows).  CKPT is a .safetensors file or a model.safetensors.index.json whose\n"
     "weight_map names the shard of each tensor.  The header is validated first; the\n"
     "rows are streamed with a progress bar on a terminal, synced, then verified (the\n"
     "table's checksum, and 1024 rows read back against the checkpoint).\n"
     "\n"
     "  --safetensors CKPT  the checkpoint\n"
     "  --weight W          the weight tensor\n"
     "  --scale S           the scale tensor (optional)\n"
     "  --rows A:B          import rows [A, B) only (a TP shard); B empty = N.  The\n"
     "                      table records the range (engram info: row_range), and\n"
     "                      global id g is its row g - A: look up with --offset A\n"
     "\n"
     "With --layers, the Engram layers of checkpoint CKPT become the tables of the\n"
     "layer API: head h of layer L is table engram:l{L}:h{h}.  Layer L is a weight\n"
     "tensor [N, C] and a scale tensor [N, D] (e.g. [N, 256] F8_E4M3 + [N, 8]\n"
     "F8_E8M0 = 264-byte rows) whose N rows are the heads' rows one after the other;\n"
     "--head-vocab gives each head's row count, in that order (they must add up to\n"
     "N).  Head h gets rows [p, p + N_h) of the layer, p the sum of the heads before\n"
     "it, and records that range (engram info: row_range; global id g of the layer\n"
     "is row g - p of the head).  The layers are found through the index by name\n"
     "patterns in which {L} stands for the layer number.  Everything is checked\n"
     "before the first table is written (tensors, shapes, sizes, names free); each\n"
     "table is verified after it is written, with a line per table; if one fails,\n"
     "the tables this import published are removed.\n"
     "\n"
     "  --layers            import every layer the --weight pattern finds\n"
     "  --head-vocab N0,... the rows of each head (the same for every layer)\n"
     "  --config CONFIG.json  instead: the model's n-gram layout (as 'engram layout\n"
     "                      --config' prints it): layer L's heads are its columns,\n"
     "                      their rows its primes (each layer its own)\n"
     "  --weight PAT        the weight tensors (default model.layers.{L}.engram.weight)\n"
     "  --scale PAT         the scale tensors (default model.layers.{L}.engram.scale)\n"
     "  --layer-ids L,...   only these layers (each must exist)\n"
     "  --shard S           only the heads of shard S of the plan the following\n"
     "                      options describe, as 'engram plan' prints it (a rank's\n"
     "                      shard: tp_rank * D + dp_rank, or tp_rank with --per-tp)\n"
     "  --tp, --dp, --per-tp, --reads, --balanced   the plan, as for 'engram plan'\n"
     "\n"
     "'engram inspect CKPT' lists a checkpoint's tensors.\n" NUMA_HELP},
    {"inspect", cli_cmd_inspect, O(JSON), 1, 1, "inspect CKPT [--json]",
     "Lists the tensors of a safetensors checkpoint: name, dtype, shape and the shard\n"
     "file that holds it.  CKPT is a .safetensors file or a\n"
     "model.safetensors.index.json, whose weight_map gives each tensor's shard.  The\n"
     "headers are checked as import checks them.  Names are sorted with numbers in\n"
     "numeric order (layers.2 before layers.10).\n"
     "\n"
     "  --json            print a JSON array of {name, dtype, shape, nbytes, shard}\n"},
    {"ls", cli_cmd_ls, O(JSON) | O(STRICT) | O(REDIS), 0, 0, "ls [--json] [--strict]",
     "Lists the tables of the namespace with their rows, row bytes, pitch and data\n"
     "size.  A namespace that does not exist is an error (exit 1) that names the\n"
     "path and the closest existing namespace.  An entry of the namespace that is\n"
     "not a readable table (a stray file, a table of another owner) is skipped with\n"
     "a warning on stderr; the exit status stays 0 unless --strict.\n"
     "\n"
     "  --json            print one JSON object: {schema, root, namespace, tables:\n"
     "                    [{name, kind, num_rows, row_bytes, row_pitch, data_size}],\n"
     "                    skipped: [{name, reason}]} (docs/cli.md)\n"
     "  --strict          exit 1 if any entry was skipped\n"},
    {"info", cli_cmd_info, O(JSON) | O(MAP) | O(REDIS), 1, 1, "info NAME [--json] [--map]",
     "Shows every field the library reports about table NAME: spec, file layout,\n"
     "checksum, creation time, the NUMA nodes its pages are on (counted with\n"
     "move_pages; tables above 65536 pages are sampled) and, with --map, the mapping\n"
     "in this process.\n"
     "\n"
     "  --json            print one JSON object, {schema, name, path, kind, num_rows,\n"
     "                    row_bytes, ...} (the checksum as a hex string; docs/cli.md)\n"
     "  --map             map the table first, to report resident and huge-page bytes\n"},
    {"verify", cli_cmd_verify, O(ALL) | O(REDIS) | O(ORIGIN), 0, -1,
     "verify NAME... | verify --all [--origin [--redis NODES]]",
     "Re-reads each table and checks its header and data checksum; prints\n"
     "'NAME: OK' or 'NAME: FAILED' per table (and the reason on stderr).  A progress\n"
     "bar is drawn on stderr when it is a terminal.  Exits 1 if any table failed.\n"
     "\n"
     "  --all             verify every table of the namespace\n"
     "  --origin          also compare each local table with the remote namespace it\n"
     "                    was pulled from (engram pull): OK while the remote still\n"
     "                    publishes it, or publishes the same rows again; FAILED when\n"
     "                    the remote holds other rows or no such table (pull again),\n"
     "                    or the table records no origin.  The cluster is reached at\n"
     "                    the nodes recorded at the pull, or at --redis NODES\n"},
    {"lookup", cli_cmd_lookup, O(OFFSET) | O(ZERO_DEAD) | O(REDIS), 2, -1,
     "lookup NAME ID [ID...] [--offset O] [--zero-dead]",
     "Gathers the rows of the given ids with engram_lookup and prints one line per\n"
     "id: 'ID: hex bytes'.  Id -1 is padding: it prints 'ID: dead'.  Any other id\n"
     "outside the table fails with the library's message naming position and value.\n"
     "\n"
     "  --offset O        subtract O from every id (except -1) first: global ids\n"
     "  --zero-dead       have the library zero-fill dead rows, printed as zeros\n"},
    {"rm", cli_cmd_rm, O(REDIS), 1, -1, "rm NAME...",
     "Removes the named tables (the names are free again at once; processes that\n"
     "have a table mapped keep reading their mapping).  Prints 'removed NAME' for\n"
     "each.\n"},
    {"ns", cli_cmd_ns, O(JSON) | O(STRICT) | O(FORCE), 1, -1,
     "ns ls [--json] [--strict] | ns rm NS... [--force]",
     "Manages the namespaces of the root (--root, else ENGRAM_ROOT, else the default).\n"
     "\n"
     "ns ls lists them with their number of tables, data size, users (processes that\n"
     "have tables of it open: each holds a lease while its store is open) and when it\n"
     "was last used.  A namespace that cannot be opened (another user's) is skipped\n"
     "with a warning on stderr; the exit status stays 0 unless --strict.\n"
     "\n"
     "ns rm removes each namespace NS: its tables (only with --force; without it a\n"
     "namespace that holds tables is refused), then its directory.  Refused, with\n"
     "nothing removed: a namespace where a table is being written, one in use by\n"
     "another process (unless --force: it keeps reading what it opened), or one that\n"
     "holds an entry that is not a table (remove that yourself).  Prints 'removed\n"
     "namespace NS (N tables)' for each.\n"
     "\n"
     "  --json            (ls) print one JSON object: {schema, root, namespaces:\n"
     "                    [{name, tables, data_size, users, stale_leases, last_used}],\n"
     "                    skipped: [{name, reason}]}; last_used in s since the epoch\n"
     "  --strict          (ls) exit 1 if any namespace was skipped\n"
     "  --force           (rm) remove the namespace's tables with it, also while in use\n"},
    {"gc", cli_cmd_gc, O(OLDER_THAN) | O(DRY_RUN) | O(JSON) | O(STRICT) | O(REDIS), 0, 0,
     "gc [--older-than DURATION] [--dry-run] [--json] [--strict]\n"
     "                   | --redis NODES --ns NS gc [--older-than D] [--dry-run] [--json]",
     "Removes, with their tables, the namespaces of the root that no live process\n"
     "uses (no lease: a process killed with its store open leaves a stale one, which\n"
     "does not count) and that were last used longer ago than DURATION, so a crashed\n"
     "job never leaks its tables for good.  Prints 'removed NS: ...' or 'kept NS:\n"
     "...' (in use, or used recently) for each namespace, then a summary; namespaces\n"
     "it may not remove (another user's, a table being written, an entry that is not\n"
     "a table) are kept with a warning on stderr.\n"
     "\n"
     "  --older-than D    idle time before removal: seconds, or N with s, m, h or d\n"
     "                    (default 1d)\n"
     "  --dry-run         say what would be removed, remove nothing\n"
     "  --json            print one JSON object: {schema, root, older_than, dry_run,\n"
     "                    namespaces: [{name, action, reason}]}, action one of\n"
     "                    removed, would_remove, kept, failed\n"
     "  --strict          exit 1 if any namespace could not be looked at\n"
     "\n"
     "With --redis, gc settles what unfinished writes left in namespace NS of the\n"
     "cluster (engram_store_gc()): the chunks of pushes that died, failed or ended\n"
     "in doubt without being published, and of removals that died half-way.  A\n"
     "push that may still be running (it showed life within its chunk TTL, and\n"
     "within --older-than, default 0) is kept.  Prints 'deleted NAME: ...' or\n"
     "'kept NAME: ...' for each, then a summary; JSON: {schema, redis, namespace,\n"
     "older_than, dry_run, pending: [{name, action, reason}]}.\n"},
    {"layout", cli_cmd_layout, LAYOUT_OPTS | O(JSON), 0, 0,
     "layout " LAYOUT_SYNOPSIS " [--json]",
     "Prints the Engram n-gram layout of a model: for each layer its table's rows\n"
     "and multipliers, and for each column (c = (n - 2) x heads + head) its prime\n"
     "(rows) and offset (first row in the layer's table), as the released models\n"
     "compute them (docs/ngram.md).\n"
     "\n" LAYOUT_HELP
     "  --json                print one JSON object: {schema, vocab_size, max_ngram,\n"
     "                        heads, num_cols, compressed_vocab, pad_id, layers:\n"
     "                        [{layer_id, num_rows, multipliers, primes, offsets}]}\n"},
    {"hash", cli_cmd_hash,
     LAYOUT_OPTS | O(TOKEN_MAP) | O(HISTORY) | O(LAYER) | O(LOCAL) | O(JSON), 0, -1,
     "hash TOKEN... " LAYOUT_SYNOPSIS "\n"
     "                   [--token-map MAP.npy] [--history T,...] [--layer L] [--local] [--json]",
     "Hashes the tokens of one request (a chunk of it, after --history) into row\n"
     "ids, one line per token and layer: 'POSITION TOKEN layer L: ID...' with one id\n"
     "per column.  -1 is a token that takes no part (DEAD).  A bad token fails with\n"
     "the library's message naming its position.\n"
     "\n" LAYOUT_HELP
     "  --token-map MAP.npy   the tokens are raw ids: MAP (int32 or int64 [V]) gives\n"
     "                        each one's compressed id (engramstore.build_token_map)\n"
     "  --history T,...       the tokens before the chunk, oldest first (its last\n"
     "                        max_ngram - 1 are used)\n"
     "  --layer L             only layer L (a number of --layer-ids)\n"
     "  --local               each column's own rows (without the offsets)\n"
     "  --json                print {schema, local, layer_ids, tokens, ids: [T][L][C]}\n"},
    {"plan", cli_cmd_plan,
     O(HEAD_VOCAB) | O(TP) | O(DP) | O(PER_TP) | O(READS) | O(BALANCED) | O(LAYER_IDS) | O(JSON) |
         O(BY_ROWS),
     0, 0,
     "plan --head-vocab N0,... --tp T [--dp D] [--per-tp] [--reads R0,... [--balanced] |\n"
     "                   --by-rows] [--layer-ids L,...] [--json]",
     "Prints which heads of an Engram layer each rank of a TP x DP topology holds:\n"
     "its shard, head range, and the global rows [row_start, row_end) of the layer\n"
     "(heads laid out one after the other); each head h is table engram:l<L>:h<h>\n"
     "and its lookup offset is its first row.  The head-wise plan gives each shard\n"
     "ceil(heads / shards) heads in order, one shard per rank (slot tp_rank * dp +\n"
     "dp_rank), and refuses a topology that leaves a shard without a head.\n"
     "\n"
     "  --head-vocab N0,...  each head's rows (the same for every layer)\n"
     "  --tp T, --dp D       the topology (D default 1)\n"
     "  --per-tp             one shard per TP rank, shared by its DP peers\n"
     "  --reads R0,...       each head's read counts: each shard's reads, and the\n"
     "                       imbalance (busiest / mean) of this plan and the other\n"
     "  --balanced           cut the heads by --reads to make the busiest shard read\n"
     "                       as little as possible (every shard keeps a head)\n"
     "  --by-rows            the row-wise plan, for more shards than heads: the\n"
     "                       layer's rows cut into equal ranges, heads split between\n"
     "                       shards; each rank holds its range as one table, looked\n"
     "                       up with offset row_start (JSON: {schema, tp, dp, mode,\n"
     "                       plan, heads, rows, shards: [{shard, row_start, row_end,\n"
     "                       first_head, last_head}], ranks: [{tp_rank, dp_rank,\n"
     "                       shard, layers, row_start, row_end}]})\n"
     "  --layer-ids L,...    the layers, for the table names and JSON (default 0)\n"
     "  --json               the plan for engines: {schema, tp, dp, mode, plan, heads,\n"
     "                       shards, [imbalance], ranks: [{tp_rank, dp_rank, shard,\n"
     "                       layers: {L: {tables, offsets, row_start, row_end}}}]}\n"},
    {"wait", cli_cmd_wait, O(TIMEOUT) | O(REDIS), 1, -1, "wait NAME... [--timeout SECS]",
     "Waits until each named table is published in the namespace (by another\n"
     "process populating it), sleeping on the directory's inotify events, then\n"
     "prints 'NAME: published'.  Exit status 1 if --timeout passes first.\n"
     "\n"
     "  --timeout SECS    give up after SECS seconds per table (default: never)\n"},
    {"mem", cli_cmd_mem, O(JSON), 0, -1, "mem [NAME...] [--json]",
     "Shows who holds the memory of the namespace's tables (or the named ones): the\n"
     "file's bytes, the processes that map it, the PSS of all of them (the resident\n"
     "bytes they map, each page once), and the memory cgroup its pages are charged\n"
     "to: the cgroup of the process that wrote them, for as long as the file exists,\n"
     "not of the processes that map it later.  The cgroup needs CAP_SYS_ADMIN to\n"
     "read (/proc/kpagecgroup); processes of other users are counted only where\n"
     "their maps may be read.  When some cannot be read, their share is checked by\n"
     "PSS (this process maps the table's resident pages for a moment: some 0.2 s a\n"
     "GiB), and a warning says so only if they may map the table.\n"
     "\n"
     "  --json            {schema, tables: [{name, file_bytes, processes, unreadable,\n"
     "                    unreadable_may_map, total_pss_bytes, cgroup, cgroup_pages,\n"
     "                    sampled_pages}]}\n"},
    {"numa-copy", cli_cmd_numa_copy, O(NUMA_NODE), 1, -1, "numa-copy NAME... --numa-node N",
     "Writes NAME.numaN, a copy of each named table whose pages are on NUMA node N,\n"
     "in the same namespace (a tmpfs), with the table's rows and row range.  Every\n"
     "process of the node may run it: one writes each copy, the others find it\n"
     "(a copy with other rows is an error).  Prints 'NAME.numaN: written on node N'\n"
     "or 'NAME.numaN: already there'.  A store opened with NUMA-local lookups\n"
     "(ENGRAM_OPEN_NUMA_LOCAL; Python numa_local=True) then serves NAME from the\n"
     "copy on the node of the thread that opens it.\n"
     "\n"
     "  --numa-node N     the node (required)\n"},
    {"bench", cli_cmd_bench, O(IDS) | O(ITERS) | O(THREADS) | O(COLS) | O(JSON) | O(HUGE), 1, -1,
     "bench NAME... [--ids T] [--cols C] [--iters N] [--threads N] [--huge] [--json]",
     "Measures engram_lookup of uniform random ids (a fresh batch each call, from a\n"
     "ring of 8), each named table one column, and in the same run two baselines:\n"
     "the same lookups on a store with 1 gather thread, and a plain memcpy of the\n"
     "same number of bytes (sequential bandwidth).  Prints median and p99 time per\n"
     "call, rows/s, GB/s and the ratios.  Tables are mapped prefaulted.\n"
     "\n"
     "  --ids T           ids per column per call (tokens; default 256)\n"
     "  --cols C          C columns, cycling over the named tables (default: one\n"
     "                    column per name)\n"
     "  --iters N         timed calls per measurement (default: as many as fit\n"
     "                    in 1 s)\n"
     "  --threads N       gather threads (default 0: one per CPU, at most 8)\n"
     "  --huge            serve private huge-page copies (ENGRAM_OPEN_PRIVATE_HUGE)\n"
     "  --json            machine-readable output (one JSON object; docs/cli.md)\n"},
    {"demo", cli_cmd_demo, O(SMALL) | O(TOKENS) | O(ITERS) | O(KEEP) | O(THREADS), 0, 0,
     "demo [--small] [--tokens T] [--iters N] [--threads N] [--keep]",
     "Runs the library end to end on one DeepSeek-shaped Engram layer: creates a\n"
     "fresh namespace demo-<pid> (or --ns) of 24 tables engram:l1:h0..h23 (8 heads x 3\n"
     "n-gram orders), each a prime number of 264-byte rows (about 2 GiB in all, far\n"
     "larger than a CPU cache, or 64 MiB with --small), pattern-filled; then runs\n"
     "decode-shaped lookups (T tokens x 24 columns of global ids with prefix-sum\n"
     "offsets, ~1% padding ids -1) for T in 1, 16, 256, 4096, checks returned rows\n"
     "against the pattern and against a naive baseline gather over its own read-only\n"
     "mmap of the same files, and prints median and p99 latency per lookup (the two\n"
     "interleaved), rows/s and the speedup (baseline median / engram median: higher\n"
     "is better), then the store's stats.\n"
     "Any wrong byte fails the demo with exit status 1.\n"
     "\n"
     "  --small           64 MiB of tables instead of 2 GiB (CI)\n"
     "  --tokens T        also measure batches of T tokens\n"
     "  --iters N         timed lookups per measurement (default: a time budget)\n"
     "  --threads N       gather threads (default 0: one per CPU, at most 8)\n"
     "  --keep            keep the namespace and its tables\n"},
    {"push", cli_cmd_push, O(REDIS) | O(TAGGED), 1, -1,
     "push NS [NAME...] --redis HOST:PORT[,...] [--tagged]",
     "Copies the tables of local namespace NS (under --root; all of them, or the\n"
     "named ones) to namespace NS of the Redis Cluster reached at the given nodes,\n"
     "where 'engram --redis HOST:PORT --ns NS' then lists, describes, verifies, looks\n"
     "up and removes them.  Each table goes up in 1 MiB chunk keys and is published\n"
     "create-only once all its chunks are written and on the replicas.  A table\n"
     "already in the cluster with the same rows (spec and checksum) is skipped; one\n"
     "with other rows is an error (remove it first with 'engram --redis ... rm').\n"
     "\n"
     "  --redis NODES     the cluster: host:port[,host:port...] (any of its nodes)\n"
     "  --tagged          keep each table's chunks in one slot (one node) instead of\n"
     "                    spreading them over the cluster\n"
     "\n"
     "A password, and an ACL user, are read from ENGRAM_REDIS_PASSWORD and\n"
     "ENGRAM_REDIS_USER (never from the command line, where other users see it).\n"},
    {"pull", cli_cmd_pull, O(REDIS), 1, -1, "pull NS [NAME...] --redis HOST:PORT[,...]",
     "Copies the tables of namespace NS of the Redis Cluster reached at the given\n"
     "nodes (all of them, or the named ones) into local namespace NS (under --root,\n"
     "made if missing), to be served from local memory (engram_pull()).  Each table\n"
     "is read in large pipelined batches from every master at once, every chunk\n"
     "checked against the cluster's checksums and the whole table before it is\n"
     "published, create-only and atomic like any table: a pull that is killed or\n"
     "fails leaves nothing visible, so run it again.  A table already here with the\n"
     "cluster's rows (spec and checksum) is kept; one with other rows is an error.\n"
     "The ranks of a node may all run the same pull: one copies each table, the\n"
     "others wait for it.  Prints 'NAME: pulled (SIZE)' or 'NAME: already here with\n"
     "the same rows (SIZE)' per table, with a progress bar on a terminal.\n"
     "\n"
     "  --redis NODES     the cluster: host:port[,host:port...] (any of its nodes)\n"
     "\n"
     "A password, and an ACL user, are read from ENGRAM_REDIS_PASSWORD and\n"
     "ENGRAM_REDIS_USER.\n"},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static void print_main_help(FILE *f)
{
    fprintf(f,
            "Usage: engram [--root DIR] [--ns NAME] [--redis HOST:PORT[,...]] COMMAND [ARGS]\n"
            "\n"
            "Stores Engram embedding tables (static tables of fixed-size rows) in a\n"
            "namespace directory and gathers rows by id.\n"
            "\n"
            "Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(f, "  %s\n", commands[i].synopsis);
    fprintf(f,
            "\n"
            "Global options (also accepted after the command):\n"
            "  --root DIR    root directory of namespaces (default: $ENGRAM_ROOT if set,\n"
            "                else /dev/shm/engram, or /tmp/engram without /dev/shm; now\n"
            "                %s)\n"
            "  --ns NAME     namespace (default 'default')\n"
            "  --redis NODES the namespace is kept in the Redis Cluster at NODES\n"
            "                (host:port[,...]) instead of under --root: create, import,\n"
            "                ls, info, verify, lookup and rm work on it; the password\n"
            "                (and ACL user) come from ENGRAM_REDIS_PASSWORD (and\n"
            "                ENGRAM_REDIS_USER)\n"
            "  -h, --help    show help; 'engram COMMAND --help' for one command\n"
            "  --version     print the version\n"
            "\n"
            "Environment: ENGRAM_ROOT (the default root), ENGRAM_PROGRESS_SECS (seconds\n"
            "between progress lines when stderr is not a terminal; default 10).\n"
            "\n"
            "Exit status: 0 ok, 1 an operation failed, 2 usage error.  docs/cli.md has\n"
            "the details and the JSON outputs.\n",
            engram_default_root());
}

static void print_command_help(const struct command *c)
{
    printf("Usage: engram [--root DIR] [--ns NAME] %s\n\n%s", c->synopsis, c->help);
}

/* Prints the version; returns the exit status 0. */
static int print_version(void)
{
    /* A shared library older or newer than the header the tool was built
     * with is worth saying. */
    if (engram_version_number() == ENGRAM_VERSION_NUMBER)
        printf("engram %s\n", engram_version_string());
    else
        printf("engram %s (built against the header of %d.%d.%d)\n", engram_version_string(),
               ENGRAM_VERSION_MAJOR, ENGRAM_VERSION_MINOR, ENGRAM_VERSION_PATCH);
    return 0;
}

/* Recognises "--name" / "--name=value" / "-h".  Returns the option id or
 * -1, and sets *inline_val to the text after '=' when present. */
static int lookup_option(const char *arg, const char **inline_val)
{
    const char *name, *eq;
    size_t len;

    *inline_val = NULL;
    if (strcmp(arg, "-h") == 0)
        return OPT_HELP;
    if (strncmp(arg, "--", 2) != 0)
        return -1;
    name = arg + 2;
    eq = strchr(name, '=');
    len = eq ? (size_t)(eq - name) : strlen(name);
    for (int i = 0; i < OPT_COUNT; i++) {
        if (strlen(opt_defs[i].name) == len && strncmp(opt_defs[i].name, name, len) == 0) {
            if (eq)
                *inline_val = eq + 1;
            return i;
        }
    }
    return -1;
}

/* An argument is an option if it starts with "--", or is "-h", or is '-'
 * followed by something other than a digit (so negative ids such as -1 are
 * positional). */
static int looks_like_option(const char *a)
{
    return a[0] == '-' && a[1] != '\0' && !isdigit((unsigned char)a[1]);
}

/* The usage error for a command that is not one, with the closest
 * command if one is close ("did you mean"). */
static int unknown_command(const struct cli *cli, const char *name)
{
    const char *names[NCOMMANDS], *hint;
    for (size_t c = 0; c < NCOMMANDS; c++)
        names[c] = commands[c].name;
    hint = cli_closest(name, names, NCOMMANDS);
    if (hint)
        return cli_usage_error(cli, "unknown command '%s'; did you mean '%s'?", name, hint);
    return cli_usage_error(cli, "unknown command '%s'", name);
}

static int parse_and_run(int argc, char **argv)
{
    struct cli cli;
    int i = 1, nargs = 0, only_positional = 0;
    char **pos;

    memset(&cli, 0, sizeof(cli));
    cli.ns = "default";

    /* Global options before the command. */
    for (; i < argc && looks_like_option(argv[i]); i++) {
        const char *val;
        int id;
        if (strcmp(argv[i], "--version") == 0)
            return print_version();
        id = lookup_option(argv[i], &val);
        if (id == OPT_HELP) {
            print_main_help(stdout);
            return 0;
        }
        if (id != OPT_ROOT && id != OPT_NS && id != OPT_REDIS)
            return cli_usage_error(&cli, "unknown option '%s' before the command", argv[i]);
        if (!val) {
            if (i + 1 >= argc)
                return cli_usage_error(&cli, "--%s needs a value", opt_defs[id].name);
            val = argv[++i];
        }
        if (cli.opt[id])
            return cli_usage_error(&cli, "--%s given twice", opt_defs[id].name);
        cli.opt[id] = val;
    }
    if (i >= argc) {
        print_main_help(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0) {
        if (i + 1 >= argc) {
            print_main_help(stdout);
            return 0;
        }
        for (size_t c = 0; c < NCOMMANDS; c++) {
            if (strcmp(argv[i + 1], commands[c].name) == 0) {
                print_command_help(&commands[c]);
                return 0;
            }
        }
        return unknown_command(&cli, argv[i + 1]);
    }
    for (size_t c = 0; c < NCOMMANDS; c++)
        if (strcmp(argv[i], commands[c].name) == 0)
            cli.cmd = &commands[c];
    if (!cli.cmd)
        return unknown_command(&cli, argv[i]);
    if (cli.opt[OPT_REDIS] && !(cli.cmd->opts & O(REDIS)))
        return cli_usage_error(&cli, "%s does not work on a Redis Cluster (--redis)",
                               cli.cmd->name);
    i++;

    /* --help and --version anywhere among the options win over any other
     * usage error (the first of them given). */
    for (int j = i; j < argc && strcmp(argv[j], "--") != 0; j++) {
        if (strcmp(argv[j], "--help") == 0 || strcmp(argv[j], "-h") == 0) {
            print_command_help(cli.cmd);
            return 0;
        }
        if (strcmp(argv[j], "--version") == 0)
            return print_version();
    }

    pos = calloc((size_t)argc, sizeof(*pos));
    if (!pos)
        return cli_fail("out of memory");
    for (; i < argc; i++) {
        const char *val;
        int id;
        if (only_positional || !looks_like_option(argv[i])) {
            pos[nargs++] = argv[i];
            continue;
        }
        if (strcmp(argv[i], "--") == 0) {
            only_positional = 1;
            continue;
        }
        id = lookup_option(argv[i], &val);
        if (id < 0 || !((GLOBAL_OPTS | cli.cmd->opts) & (UINT64_C(1) << id))) {
            free(pos);
            return cli_usage_error(&cli, "unknown option '%s'", argv[i]);
        }
        if (!opt_defs[id].has_arg && val) {
            free(pos);
            return cli_usage_error(&cli, "--%s takes no value", opt_defs[id].name);
        }
        if (opt_defs[id].has_arg && !val) {
            if (i + 1 >= argc) {
                free(pos);
                return cli_usage_error(&cli, "--%s needs a value", opt_defs[id].name);
            }
            val = argv[++i];
        }
        if (cli.opt[id]) {
            free(pos);
            return cli_usage_error(&cli, "--%s given twice", opt_defs[id].name);
        }
        cli.opt[id] = val ? val : "";
    }
    cli.args = pos;
    cli.nargs = nargs;

    if (nargs < cli.cmd->min_args || (cli.cmd->max_args >= 0 && nargs > cli.cmd->max_args)) {
        int st;
        if (nargs < cli.cmd->min_args)
            st = cli_usage_error(&cli, "missing arguments; usage: engram %s", cli.cmd->synopsis);
        else
            st = cli_usage_error(&cli, "unexpected argument '%s'", pos[cli.cmd->max_args]);
        free(pos);
        return st;
    }
    if (cli.opt[OPT_ROOT]) {
        if (cli.opt[OPT_ROOT][0] == '\0') {
            free(pos);
            return cli_usage_error(&cli, "--root: empty directory name");
        }
        cli.root = cli.opt[OPT_ROOT];
    }
    if (cli.opt[OPT_NS]) {
        int rc = engram_name_check(cli.opt[OPT_NS]);
        if (rc != 0) {
            int st = cli_usage_error(&cli, "invalid namespace name '%s': %s", cli.opt[OPT_NS],
                                     cli_lib_detail(rc));
            free(pos);
            return st;
        }
        cli.ns = cli.opt[OPT_NS];
    }

    {
        int st = cli.cmd->run(&cli);
        free(pos);
        return st;
    }
}

int main(int argc, char **argv)
{
    int status = parse_and_run(argc, argv);

    /* Output that could not be written (a full disk, a closed pipe) is a
     * failure, not a silent success. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "engram: write error on standard output: %s\n", strerror(errno));
        if (status == 0)
            status = EXIT_FAIL;
    }
    return status;
}
