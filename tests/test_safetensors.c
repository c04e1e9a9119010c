/*
 * test_safetensors.c - tables served from safetensors checkpoints
 * (engram_open_safetensors, engram_safetensors_tensor, and _fd for a
 * file open already): packed weight +
 * scale rows for a row range, sharded checkpoints through an index file,
 * and clear errors for bad headers, names, shapes, ranges, links and read
 * failures.
 *
 * The checkpoints are written here byte by byte: an 8-byte little-endian
 * header length, the JSON header, the data.  Weight byte (i, j) is
 * tu_byte(1, i, j) and scale byte (i, j) is tu_byte(2, i, j), so every
 * returned row is checked against values computed independently.
 */
#include "testutil.h"

#include <fcntl.h>

#include "reader.h"
#include "safetensors.h"

enum { N = 1000, W = 256, S = 8 };

/* Writes a safetensors file: header `json`, then `n` data bytes. */
static void write_st(const char *path, const char *json, const unsigned char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    uint64_t hl = strlen(json);
    unsigned char len8[8];
    ASSERT(f != NULL);
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(hl >> (8 * i));
    ASSERT_EQ(fwrite(len8, 1, 8, f), 8);
    ASSERT_EQ(fwrite(json, 1, hl, f), hl);
    if (n)
        ASSERT_EQ(fwrite(data, 1, n, f), n);
    ASSERT_EQ(fclose(f), 0);
}

static void fill_plane(unsigned char *p, uint32_t seed, uint64_t rows, uint32_t cols)
{
    for (uint64_t i = 0; i < rows; i++)
        for (uint32_t j = 0; j < cols; j++)
            p[i * cols + j] = tu_byte(seed, i, j);
}

/* The checkpoint used by most cases: a BF16 tensor first (so the weight
 * does not start at data offset 0), the weight, then the scales. */
static void write_model(const char *path)
{
    size_t other = 6, n = other + (size_t)N * W + (size_t)N * S;
    unsigned char *d = tu_xcalloc(n);
    char json[512];
    fill_plane(d + other, 1, N, W);
    fill_plane(d + other + (size_t)N * W, 2, N, S);
    snprintf(json, sizeof json,
             "{\"__metadata__\":{\"format\":\"pt\"},"
             "\"model.other\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
             "\"engram.w\":{\"dtype\":\"F8_E4M3\",\"shape\":[%d,%d],\"data_offsets\":[6,%zu]},"
             "\"engram.s\":{\"dtype\":\"F8_E8M0\",\"shape\":[%d,%d],"
             "\"data_offsets\":[%zu,%zu]}}   ",
             N, W, other + (size_t)N * W, N, S, other + (size_t)N * W, n);
    write_st(path, json, d, n);
    free(d);
}

/* Checks that row r of the table (global row r + start) is the packed
 * weight + scale row. */
static void check_row(const unsigned char *row, uint64_t g, int with_scale)
{
    for (uint32_t j = 0; j < W; j++)
        if (row[j] != tu_byte(1, g, j)) {
            fprintf(stderr, "weight byte %u of row %llu wrong\n", j, (unsigned long long)g);
            ASSERT(0);
        }
    if (with_scale)
        for (uint32_t j = 0; j < S; j++)
            if (row[W + j] != tu_byte(2, g, j)) {
                fprintf(stderr, "scale byte %u of row %llu wrong\n", j, (unsigned long long)g);
                ASSERT(0);
            }
}

static void test_packed_rows(void)
{
    char path[512];
    engram_store *st;
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_table_id tid, tid2;
    engram_table_info info = ENGRAM_TABLE_INFO_INIT;
    engram_table_spec spec = {10, W + S, 0};
    engram_cache_stats cs = ENGRAM_CACHE_STATS_INIT;
    unsigned char *bound = tu_make_rows(9, 10, W + S, 0, 0);
    enum { T = 500 };
    static int64_t ids[T][2];
    static unsigned char out[T][2][W + S];
    uint64_t rng = 4;

    tu_path(path, sizeof path, "model.safetensors");
    write_model(path);
    o.cache_bytes = 32 << 10; /* far less than the 800 rows */
    o.queue_depth = 8;
    ASSERT_OK(engram_store_open_memory(&o, &st));
    ASSERT_OK(engram_open_safetensors(st, "engram:l1", path, "engram.w", "engram.s", 100, 900,
                                      &tid));
    ASSERT_OK(engram_bind(st, "mem", &spec, bound));
    ASSERT_OK(engram_table_open(st, "mem", &tid2));
    ASSERT_OK(engram_get_table_info(st, "engram:l1", &info));
    ASSERT_EQ(info.kind, ENGRAM_TABLE_SAFETENSORS);
    ASSERT_EQ(info.spec.num_rows, 800);
    ASSERT_EQ(info.spec.row_bytes, W + S);
    ASSERT_EQ(info.mapped, 0);
    /* The shard's place in the tensor: rows [100, 900) of N = 1000. */
    ASSERT_EQ_U64(info.row_start, 100);
    ASSERT_EQ_U64(info.total_rows, N);
    ASSERT_OK(engram_get_table_info(st, "mem", &info));
    ASSERT_EQ_U64(info.row_start, 0);
    ASSERT_EQ_U64(info.total_rows, 0); /* bound memory: no range known */

    for (int pass = 0; pass < 3; pass++) {
        engram_lookup_args a = ENGRAM_LOOKUP_ARGS_INIT;
        engram_table_id tabs[2] = {tid, tid2};
        int64_t offs[2] = {100, 0}; /* global ids of the shard */
        for (int t = 0; t < T; t++) {
            ids[t][0] = t % 50 == 0 ? -1 : 100 + (int64_t)tu_rand_below(&rng, pass ? 40 : 800);
            ids[t][1] = (int64_t)tu_rand_below(&rng, 10);
        }
        ids[1][0] = 100;
        ids[2][0] = 899;
        memset(out, 0xEE, sizeof out);
        a.num_tokens = T;
        a.num_cols = 2;
        a.tables = tabs;
        a.offsets = offs;
        a.ids = ids;
        a.id_type = ENGRAM_ID_INT64;
        a.out = out;
        ASSERT_OK(engram_lookup(st, &a));
        for (int t = 0; t < T; t++) {
            if (ids[t][0] == -1)
                ASSERT_ALL_BYTES(out[t][0], 0xEE, W + S);
            else
                check_row(out[t][0], (uint64_t)ids[t][0], 1);
            ASSERT_ROW(out[t][1], 9, (uint64_t)ids[t][1], W + S);
        }
        /* Ids of other ranks are outside this shard. */
        ids[3][0] = 99;
        ASSERT_ERR(engram_lookup(st, &a), ENGRAM_EBADID);
        ids[3][0] = 900;
        ASSERT_ERR(engram_lookup(st, &a), ENGRAM_EBADID);
    }
    ASSERT_OK(engram_get_cache_stats(st, "engram:l1", &cs));
    ASSERT_EQ(cs.tables, 1);
    ASSERT_GT(cs.hits, 0);
    ASSERT_GT(cs.misses, 0);
    ASSERT_LE(cs.cache_bytes, 32 << 10);
    ASSERT_EQ(cs.reads % 2, 0); /* two reads per row: the weight and the scale */
    ASSERT_ERR(engram_remove(st, "engram:l1"), ENGRAM_EBOUND);
    ASSERT_ERR(engram_open_safetensors(st, "engram:l1", path, "engram.w", NULL, 0, 0, NULL),
               -EEXIST);

    /* Weights only, all rows. */
    ASSERT_OK(engram_open_safetensors(st, "w-only", path, "engram.w", NULL, 0, 0, &tid));
    ASSERT_OK(engram_get_table_info(st, "w-only", &info));
    ASSERT_EQ_U64(info.row_start, 0);
    ASSERT_EQ_U64(info.total_rows, N);
    {
        int64_t one[3] = {0, 999, 500};
        unsigned char o3[3][W];
        ASSERT_OK(tu_lookup1(st, tid, one, 3, o3, 0));
        for (int i = 0; i < 3; i++)
            check_row(o3[i], (uint64_t)one[i], 0);
    }
    engram_store_close(st);
    free(bound);
}

static void test_sharded_index(void)
{
    char p1[512], p2[512], idx[512], bad[512];
    unsigned char *w = tu_xmalloc((size_t)N * W), *s = tu_xmalloc((size_t)N * S);
    char json[256];
    engram_tensor_info ti = ENGRAM_TENSOR_INFO_INIT;
    engram_store *st;
    engram_table_id tid;
    int64_t ids[4] = {0, 17, 999, 17};
    unsigned char out[4][W + S];
    FILE *f;

    fill_plane(w, 1, N, W);
    fill_plane(s, 2, N, S);
    tu_path(p1, sizeof p1, "model-00001-of-00002.safetensors");
    tu_path(p2, sizeof p2, "model-00002-of-00002.safetensors");
    tu_path(idx, sizeof idx, "model.safetensors.index.json");
    snprintf(json, sizeof json,
             "{\"engram.w\":{\"dtype\":\"F8_E4M3\",\"shape\":[%d,%d],\"data_offsets\":[0,%d]}}",
             N, W, N * W);
    write_st(p1, json, w, (size_t)N * W);
    snprintf(json, sizeof json,
             "{\"engram.s\":{\"dtype\":\"F8_E8M0\",\"shape\":[%d,%d],\"data_offsets\":[0,%d]}}",
             N, S, N * S);
    write_st(p2, json, s, (size_t)N * S);
    f = fopen(idx, "w");
    ASSERT(f != NULL);
    fprintf(f, "{\"metadata\":{\"total_size\":%d},\"weight_map\":{"
               "\"engram.w\":\"model-00001-of-00002.safetensors\","
               "\"engram.s\":\"model-00002-of-00002.safetensors\","
               "\"evil\":\"../etc/passwd\"}}",
            N * (W + S));
    fclose(f);

    ASSERT_OK(engram_safetensors_tensor(idx, "engram.s", &ti));
    ASSERT_STR_EQ(ti.shard, "model-00002-of-00002.safetensors");
    ASSERT_STR_EQ(ti.dtype, "F8_E8M0");
    ASSERT_EQ(ti.ndim, 2);
    ASSERT_EQ(ti.shape[0], N);
    ASSERT_EQ(ti.shape[1], S);
    ASSERT_EQ(ti.elem_size, 1);
    ASSERT_EQ(ti.nbytes, N * S);
    ASSERT_EQ(ti.offset, 8 + strlen(json) - 0); /* the second shard's own header */

    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_open_safetensors(st, "t", idx, "engram.w", "engram.s", 0, 0, &tid));
    ASSERT_OK(tu_lookup1(st, tid, ids, 4, out, 0));
    for (int i = 0; i < 4; i++)
        check_row(out[i], (uint64_t)ids[i], 1);
    ASSERT_ERR(engram_open_safetensors(st, "t2", idx, "missing", NULL, 0, 0, NULL), -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "weight_map");
    ASSERT_ERR(engram_open_safetensors(st, "t2", idx, "evil", NULL, 0, 0, NULL), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), "plain file name");
    tu_path(bad, sizeof bad, "bad.index.json");
    f = fopen(bad, "w");
    fputs("{\"weight_map\": [1, 2]}", f);
    fclose(f);
    ASSERT_ERR(engram_open_safetensors(st, "t2", bad, "engram.w", NULL, 0, 0, NULL),
               ENGRAM_ECORRUPT);
    engram_store_close(st);
    free(w);
    free(s);
}

/* What engram_safetensors_list() saw: names, in call order, with shard,
 * dtype and shape. */
typedef struct listing {
    int n, stop_at;
    char line[8][400];
} listing;

static int collect(void *ud, const char *name, const engram_tensor_info *info)
{
    listing *l = ud;
    ASSERT_EQ(info->size, sizeof *info);
    if (l->n == l->stop_at)
        return 42;
    ASSERT_LT(l->n, 8);
    snprintf(l->line[l->n], sizeof l->line[l->n], "%s %s %s [%llu, %llu] %llu", name,
             info->shard[0] ? info->shard : "-", info->dtype,
             (unsigned long long)info->shape[0],
             (unsigned long long)(info->ndim > 1 ? info->shape[1] : 0),
             (unsigned long long)info->nbytes);
    l->n++;
    return 0;
}

/* Listing the tensors of a file and of an index, and "did you mean" for
 * mistyped tensor names. */
static void test_list_and_suggest(void)
{
    char path[512], p1[512], p2[512], idx[512];
    listing l;
    engram_store *st;
    FILE *f;

    tu_path(path, sizeof path, "list.safetensors");
    write_model(path);
    memset(&l, 0, sizeof l);
    l.stop_at = -1;
    ASSERT_OK(engram_safetensors_list(path, collect, &l));
    ASSERT_EQ(l.n, 3); /* file order, without __metadata__ */
    ASSERT_STR_EQ(l.line[0], "model.other - BF16 [3, 0] 6");
    ASSERT_STR_EQ(l.line[1], "engram.w - F8_E4M3 [1000, 256] 256000");
    ASSERT_STR_EQ(l.line[2], "engram.s - F8_E8M0 [1000, 8] 8000");
    memset(&l, 0, sizeof l);
    l.stop_at = 1;
    ASSERT_EQ(engram_safetensors_list(path, collect, &l), 42);
    ASSERT_EQ(l.n, 1);
    ASSERT_ERR(engram_safetensors_list(NULL, collect, &l), -EINVAL);
    ASSERT_ERR(engram_safetensors_list(path, NULL, &l), -EINVAL);

    /* An index over two shards: shard by shard, by name within each. */
    tu_path(p1, sizeof p1, "l-00001.safetensors");
    tu_path(p2, sizeof p2, "l-00002.safetensors");
    tu_path(idx, sizeof idx, "list.safetensors.index.json");
    {
        unsigned char d[40] = {0};
        write_st(p1, "{\"b.w\":{\"dtype\":\"U8\",\"shape\":[2,4],\"data_offsets\":[0,8]},"
                     "\"a.w\":{\"dtype\":\"U8\",\"shape\":[2,4],\"data_offsets\":[8,16]}}",
                 d, 16);
        write_st(p2, "{\"a.s\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", d,
                 24);
    }
    f = fopen(idx, "w");
    ASSERT(f != NULL);
    fputs("{\"weight_map\":{\"a.s\":\"l-00002.safetensors\",\"b.w\":\"l-00001.safetensors\","
          "\"a.w\":\"l-00001.safetensors\"}}",
          f);
    fclose(f);
    memset(&l, 0, sizeof l);
    l.stop_at = -1;
    ASSERT_OK(engram_safetensors_list(idx, collect, &l));
    ASSERT_EQ(l.n, 3);
    ASSERT_STR_EQ(l.line[0], "a.w l-00001.safetensors U8 [2, 4] 8");
    ASSERT_STR_EQ(l.line[1], "b.w l-00001.safetensors U8 [2, 4] 8");
    ASSERT_STR_EQ(l.line[2], "a.s l-00002.safetensors F32 [2, 3] 24");

    /* An index naming a tensor its shard lacks, or a shard that is not a
     * plain file name, or is missing. */
    f = fopen(idx, "w");
    fputs("{\"weight_map\":{\"a.w\":\"l-00001.safetensors\",\"zz\":\"l-00001.safetensors\"}}",
          f);
    fclose(f);
    memset(&l, 0, sizeof l);
    l.stop_at = -1;
    ASSERT_ERR(engram_safetensors_list(idx, collect, &l), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), "'zz'");
    f = fopen(idx, "w");
    fputs("{\"weight_map\":{\"a.w\":\"../l-00001.safetensors\"}}", f);
    fclose(f);
    ASSERT_ERR(engram_safetensors_list(idx, collect, &l), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), "plain file name");
    f = fopen(idx, "w");
    fputs("{\"weight_map\":{\"a.w\":\"l-00009.safetensors\"}}", f);
    fclose(f);
    ASSERT_ERR(engram_safetensors_list(idx, collect, &l), -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "l-00009.safetensors");

    /* Did you mean: in a file, in an index, and nothing for a name far
     * from every tensor. */
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "engram.wieght", NULL, 0, 0, NULL), -ENOENT);
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "engarm.w", NULL, 0, 0, NULL), -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "no tensor 'engarm.w' (did you mean 'engram.w'?)");
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "completely.different.name", NULL, 0, 0,
                                       NULL),
               -ENOENT);
    ASSERT(strstr(engram_errmsg(), "did you mean") == NULL);
    f = fopen(idx, "w");
    fputs("{\"weight_map\":{\"model.layers.1.engram.weight\":\"l-00001.safetensors\"}}", f);
    fclose(f);
    ASSERT_ERR(engram_open_safetensors(st, "x", idx, "model.layers.1.engram.weigth", NULL, 0, 0,
                                       NULL),
               -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "(did you mean 'model.layers.1.engram.weight'?)");
    {
        engram_tensor_info ti = ENGRAM_TENSOR_INFO_INIT;
        ASSERT_ERR(engram_safetensors_tensor(path, "engram.z", &ti), -ENOENT);
        ASSERT_CONTAINS(engram_errmsg(), "did you mean 'engram.");
    }
    engram_store_close(st);
}

/* A header that must be refused, with a phrase of the message. */
static void expect_corrupt(engram_store *st, const char *json, size_t data, const char *phrase)
{
    char path[512];
    unsigned char *d = tu_xcalloc(data);
    tu_path(path, sizeof path, "bad.safetensors");
    unlink(path);
    write_st(path, json, d, data);
    free(d);
    ASSERT_ERR(engram_open_safetensors(st, "bad", path, "w", NULL, 0, 0, NULL), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), phrase);
    ASSERT_CONTAINS(engram_errmsg(), "bad.safetensors");
}

static void test_bad_inputs(void)
{
    char path[512], link[512], raw[512];
    engram_store *st;
    engram_table_id tid;
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    expect_corrupt(st, "{\"w\":{\"dtype\":\"U8\",\"shape\":[4,2],\"data_offsets\":[0,8]", 8,
                   "not valid JSON");
    expect_corrupt(st, "{\"w\":{\"dtype\":\"U8\",\"shape\":[4,2],\"data_offsets\":[0,8]}}", 5,
                   "truncated");
    expect_corrupt(st,
                   "{\"w\":{\"dtype\":\"U8\",\"shape\":[4,2],\"data_offsets\":[0,8]},"
                   "\"v\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}",
                   8, "overlap");
    expect_corrupt(st, "{\"w\":{\"dtype\":\"Q4\",\"shape\":[4,2],\"data_offsets\":[0,8]}}", 8,
                   "unknown dtype");
    expect_corrupt(st, "{\"w\":{\"dtype\":\"U8\",\"shape\":[4,3],\"data_offsets\":[0,8]}}", 8,
                   "need 12 x 1");
    expect_corrupt(st, "{\"w\":{\"dtype\":\"U8\",\"shape\":[4,2],\"data_offsets\":[0,8]}}", 9,
                   "cover 8");
    /* Too many JSON values, refused before cJSON allocates for them: the
     * bound itself, then headers of 4 MiB of "0," with one value under the
     * limit, at it, and one, two and three over it. */
    {
        const char *q = "{\"a\":\"x,[{\\\",\",\"b\":[1,2]}";
        size_t n = (size_t)2 << 20;
        char *big = tu_xmalloc(9 + 2 * n + 1);
        /* Quoted separators and an escaped quote do not count. */
        ASSERT_EQ(engram__json_values_bound(q, strlen(q)), 5); /* 1 + '{' ',' '[' ',' */
        /* {"w":[0,0,...,0]} with c commas holds c + 3 values: 2 Mi - 1 .. 2 Mi + 3. */
        for (size_t c = n - 4; c <= n; c++) {
            size_t v = c + 3;
            memcpy(big, "{\"w\":[", 6);
            for (size_t i = 0; i < c; i++)
                memcpy(big + 6 + 2 * i, "0,", 2);
            memcpy(big + 6 + 2 * c, "0]}", 4);
            ASSERT_EQ(engram__json_values_bound(big, strlen(big)), v);
            /* Up to the limit the JSON is parsed (and refused for what it
             * says); past it, refused before parsing. */
            if (v <= ENGRAM__ST_VALUES_MAX)
                expect_corrupt(st, big, 8, "tensor 'w' is not a JSON object");
            else
                expect_corrupt(st, big, 8, "more than 2097152 JSON values");
        }
        free(big);
    }
    /* The header length field itself: past the end of the file. */
    tu_path(raw, sizeof raw, "len.safetensors");
    {
        FILE *f = fopen(raw, "wb");
        fwrite("\xff\x00\x00\x00\x00\x00\x00\x00{}", 1, 10, f);
        fclose(f);
    }
    ASSERT_ERR(engram_open_safetensors(st, "bad", raw, "w", NULL, 0, 0, NULL), ENGRAM_ECORRUPT);
    ASSERT_CONTAINS(engram_errmsg(), "past the end");

    /* Shapes, ranges, names, links. */
    tu_path(path, sizeof path, "model.safetensors");
    write_model(path);
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "model.other", NULL, 0, 0, NULL),
               ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "expected [N, C]");
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "engram.w", "nope", 0, 0, NULL), -ENOENT);
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "engram.w", "engram.s", 5, 5, NULL),
               ENGRAM_ESPEC);
    ASSERT_ERR(engram_open_safetensors(st, "x", path, "engram.w", "engram.s", 0, N + 1, NULL),
               ENGRAM_ESPEC);
    ASSERT_CONTAINS(engram_errmsg(), "row range");
    ASSERT_ERR(engram_open_safetensors(st, "bad/name", path, "engram.w", NULL, 0, 0, NULL),
               ENGRAM_ESPEC);
    tu_path(link, sizeof link, "link.safetensors");
    ASSERT_EQ(symlink(path, link), 0);
    ASSERT_ERR(engram_open_safetensors(st, "x", link, "engram.w", NULL, 0, 0, NULL),
               ENGRAM_EUNSAFE);
    ASSERT_ERR(engram_open_safetensors(st, "x", "/nonexistent/m.safetensors", "engram.w", NULL, 0,
                                       0, NULL),
               -ENOENT);
    /* Nothing was left behind by the failures: the name is still free. */
    ASSERT_OK(engram_open_safetensors(st, "x", path, "engram.w", "engram.s", 0, 0, &tid));
    engram_store_close(st);
}

static int fail_row_7(void *ud, const char *table, uint64_t row, unsigned seg, int res,
                      unsigned char *data)
{
    (void)ud;
    (void)table;
    (void)data;
    return row == 7 && seg == 1 ? -EIO : res;
}

static void test_read_error(void)
{
    char path[512];
    engram_store *st;
    engram_table_id tid;
    int64_t ids[3] = {6, 7, 8};
    unsigned char out[3][W + S];
    tu_path(path, sizeof path, "model.safetensors");
    write_model(path);
    ASSERT_OK(engram_store_open_memory(NULL, &st));
    ASSERT_OK(engram_open_safetensors(st, "t", path, "engram.w", "engram.s", 0, 0, &tid));
    engram__reader_set_hook(fail_row_7, NULL);
    memset(out, 0xEE, sizeof out);
    ASSERT_ERR(tu_lookup1(st, tid, ids, 3, out, 0), -EIO);
    ASSERT_CONTAINS(engram_errmsg(), "read of row 7");
    ASSERT_ALL_BYTES(out[1], 0xEE, W + S); /* its weight half arrived, but is not written */
    engram__reader_set_hook(NULL, NULL);
    ASSERT_OK(tu_lookup1(st, tid, ids, 3, out, 0));
    for (int i = 0; i < 3; i++)
        check_row(out[i], (uint64_t)ids[i], 1);
    engram_store_close(st);
}

/* An open that fails after the cache state was made (here: the name
 * exists) gives the state's share of the cache budget back.  Before, each
 * such failure kept its share, and a table opened later got less cache:
 * after a few, one set.  Two stores, one with failed opens, must give the
 * table opened next the same cache. */
static void test_failed_open_keeps_budget(void)
{
    char path[512];
    engram_store_options o = ENGRAM_STORE_OPTIONS_INIT;
    engram_cache_stats s[2] = {ENGRAM_CACHE_STATS_INIT, ENGRAM_CACHE_STATS_INIT};
    tu_path(path, sizeof path, "model.safetensors");
    write_model(path);
    o.cache_bytes = 64 << 10; /* less than the whole tensor's rows */
    for (int k = 0; k < 2; k++) {
        engram_store *st;
        ASSERT_OK(engram_store_open_memory(&o, &st));
        ASSERT_OK(engram_open_safetensors(st, "small", path, "engram.w", "engram.s", 0, 10, NULL));
        for (int i = 0; k == 0 && i < 3; i++)
            ASSERT_ERR(engram_open_safetensors(st, "small", path, "engram.w", "engram.s", 0, 0,
                                               NULL),
                       -EEXIST);
        ASSERT_OK(engram_open_safetensors(st, "big", path, "engram.w", "engram.s", 0, 0, NULL));
        ASSERT_OK(engram_get_cache_stats(st, "big", &s[k]));
        engram_store_close(st);
    }
    ASSERT_EQ_U64(s[0].cache_bytes, s[1].cache_bytes);
    ASSERT_GT(s[0].slots, ENGRAM_CACHE_WAYS); /* more than the one set of a starved table */
}

/* Leaves a pattern on the stack below the caller's frame, where the next
 * call's locals will be. */
static __attribute__((noinline)) void dirty_stack(void)
{
    volatile unsigned char junk[16384];
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = 0xA5;
}

/* engram_tensor_info.shard is a C string padded with zeros: bytes after
 * the name are never stack garbage of the library. */
static void test_tensor_info_shard(void)
{
    char path[512];
    engram_tensor_info ti = ENGRAM_TENSOR_INFO_INIT;
    tu_path(path, sizeof path, "model.safetensors");
    write_model(path);
    for (int round = 0; round < 2; round++) {
        memset(&ti, 0x5A, sizeof ti);
        ti.size = sizeof ti;
        dirty_stack();
        ASSERT_OK(engram_safetensors_tensor(path, "engram.w", &ti));
        ASSERT_ALL_BYTES(ti.shard, 0, sizeof ti.shard);
        ASSERT_EQ(ti.reserved, 0);
        ASSERT_STR_EQ(ti.dtype, "F8_E4M3");
    }
}

/* engram_safetensors_tensor_fd(): the tensor of the file open on the
 * descriptor, whatever the path holds by now; the same checks as by path
 * (a FIFO, a file others can write, an index, a bad header, a missing
 * tensor are refused); the descriptor is neither moved nor closed. */
static void test_tensor_fd(void)
{
    char path[512], other[512], fifo[512], idx[512];
    engram_tensor_info ti = ENGRAM_TENSOR_INFO_INIT, byname = ENGRAM_TENSOR_INFO_INIT;
    int fd, ffd;

    tu_path(path, sizeof path, "fd.safetensors");
    tu_path(other, sizeof other, "fd-other.safetensors");
    tu_path(fifo, sizeof fifo, "fd-fifo");
    write_model(path);
    ASSERT_OK(engram_safetensors_tensor(path, "engram.s", &byname));
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT_EQ(lseek(fd, 3, SEEK_SET), 3);
    /* The path now holds another checkpoint: the descriptor is what counts. */
    write_st(other, "{\"engram.s\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[0,4]}}",
             (const unsigned char *)"abcd", 4);
    ASSERT_EQ(rename(other, path), 0);
    memset(&ti, 0x5A, sizeof ti);
    ti.size = sizeof ti;
    ASSERT_OK(engram_safetensors_tensor_fd(fd, path, "engram.s", &ti));
    ASSERT_MEM_EQ(&ti, &byname, sizeof ti);
    ASSERT_EQ(ti.shape[0], N);
    ASSERT_STR_EQ(ti.shard, "");
    ASSERT_EQ(lseek(fd, 0, SEEK_CUR), 3); /* read with pread */
    ASSERT_ERR(engram_safetensors_tensor_fd(fd, path, "nope", &ti), -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "no tensor 'nope'");
    ASSERT_ERR(engram_safetensors_tensor_fd(fd, NULL, "nope", &ti), -ENOENT);
    ASSERT_CONTAINS(engram_errmsg(), "descriptor");
    ASSERT_ERR(engram_safetensors_tensor_fd(fd, path, "", &ti), -EINVAL);
    ASSERT_ERR(engram_safetensors_tensor_fd(-1, path, "engram.s", &ti), -EINVAL);
    ti.size = 0;
    ASSERT_ERR(engram_safetensors_tensor_fd(fd, path, "engram.s", &ti), -EINVAL);
    ti.size = sizeof ti;
    /* The descriptor is still open: the caller's. */
    ASSERT_OK(engram_safetensors_tensor_fd(fd, path, "engram.w", &ti));
    ASSERT_EQ(ti.shape[1], W);
    ASSERT_EQ(fchmod(fd, 0666), 0);
    ASSERT_ERR(engram_safetensors_tensor_fd(fd, path, "engram.s", &ti), ENGRAM_EUNSAFE);
    ASSERT_CONTAINS(engram_errmsg(), "writable by others");
    close(fd);

    /* The file at the path now (the other one) is read as itself. */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT_OK(engram_safetensors_tensor_fd(fd, path, "engram.s", &ti));
    ASSERT_EQ(ti.shape[0], 2);
    ASSERT_STR_EQ(ti.dtype, "U8");
    close(fd);

    /* A FIFO (opened without blocking, as the header asks) is refused
     * without being read. */
    ASSERT_EQ(mkfifo(fifo, 0600), 0);
    ffd = open(fifo, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    ASSERT(ffd >= 0);
    ASSERT_ERR(engram_safetensors_tensor_fd(ffd, fifo, "engram.s", &ti), ENGRAM_EUNSAFE);
    ASSERT_CONTAINS(engram_errmsg(), "not a regular file");
    close(ffd);

    /* An index is not a safetensors file. */
    tu_path(idx, sizeof idx, "fd.safetensors.index.json");
    {
        FILE *f = fopen(idx, "w");
        ASSERT(f != NULL);
        fputs("{\"weight_map\":{\"engram.s\":\"fd.safetensors\"}}", f);
        ASSERT_EQ(fclose(f), 0);
    }
    fd = open(idx, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT_ERR(engram_safetensors_tensor_fd(fd, idx, "engram.s", &ti), ENGRAM_ECORRUPT);
    close(fd);
}

int main(void)
{
    tu_watchdog(120);
    RUN_TEST(test_packed_rows);
    RUN_TEST(test_sharded_index);
    RUN_TEST(test_list_and_suggest);
    RUN_TEST(test_bad_inputs);
    RUN_TEST(test_read_error);
    RUN_TEST(test_failed_open_keeps_budget);
    RUN_TEST(test_tensor_info_shard);
    RUN_TEST(test_tensor_fd);
    printf("test_safetensors: all passed\n");
    return 0;
}
