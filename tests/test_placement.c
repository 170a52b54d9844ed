/* test_placement.c - common/placement.c: shard row ranges, the shard that
 * owns a row id, and placements resolved from configs (the single-server
 * form, MNIST split over two servers, rnn_lm's table sharded). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "placement.h"

#define CONTAINS(msg, s) CHECK_MSG(strstr((msg), (s)) != NULL, "'%s' not in: %s", (s), (msg))

/* Ranges of n shards over R rows tile [0, R): contiguous, no gap, no
 * overlap, sizes differ by at most one, none empty when n <= R. */
static void test_ranges(void) {
    int bad = 0;
    for (int64_t R = 1; R <= 100; R++)
        for (int n = 1; n <= 8; n++) {
            int64_t next = 0, minsz = R, maxsz = 0;
            for (int k = 0; k < n; k++) {
                int64_t lo, hi;
                ps_shard_range(R, n, k, &lo, &hi);
                if (lo != next || hi < lo) bad++;
                if (hi - lo < minsz) minsz = hi - lo;
                if (hi - lo > maxsz) maxsz = hi - lo;
                next = hi;
            }
            if (next != R || maxsz - minsz > 1 || (n <= R && minsz < 1)) bad++;
        }
    CHECK_MSG(bad == 0, "%d bad tilings", bad);
    int64_t lo, hi;
    ps_shard_range(10000, 2, 1, &lo, &hi);
    CHECK(lo == 5000 && hi == 10000);
    ps_shard_range(10, 3, 0, &lo, &hi);
    CHECK(lo == 0 && hi == 3);
    ps_shard_range(10, 3, 2, &lo, &hi);
    CHECK(lo == 6 && hi == 10);
}

static void set(ps_config *c, const char *k, const char *v) {
    ps_err e;
    ps_err_clear(&e);
    CHECK_MSG(ps_config_set(c, k, v, "test", &e) == PS_OK, "%s=%s: %s", k, v, e.msg);
}

/* rnn_lm with emb over n shards (servers s0..s{n-1}) and ntoken rows. */
static void lm_sharded(ps_config *c, int n, int64_t rows) {
    ps_config_defaults(c);
    set(c, "model.name", "rnn_lm");
    char key[64], val[64], list[256] = "";
    snprintf(val, sizeof val, "%lld", (long long)rows);
    set(c, "model.sizes.ntoken", val);
    for (int k = 0; k < n; k++) {
        snprintf(key, sizeof key, "servers.s%d.address", k);
        snprintf(val, sizeof val, "127.0.0.1:%d", 30000 + k);
        set(c, key, val);
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, "%ss%d", k ? "," : "", k);
    }
    set(c, "model.placement.emb.shards", list);
    set(c, "model.placement.decoder", "s0");
    set(c, "model.placement.rnn", "s0/cpu");
}

/* shard_of agrees with the ranges for every id, and is -1 outside [0, R). */
static void test_shard_of(void) {
    int bad = 0, cases = 0;
    for (int64_t R = 1; R <= 100; R++)
        for (int n = 1; n <= 8 && n <= R; n++) {
            ps_config c;
            ps_placement p;
            ps_err e;
            ps_err_clear(&e);
            lm_sharded(&c, n, R);
            if (ps_placement_resolve(&c, &p, &e) != PS_OK) {
                CHECK_MSG(0, "R=%lld n=%d: %s", (long long)R, n, e.msg);
                continue;
            }
            int s = ps_placement_stage(&p, "emb");
            cases++;
            if (s != 0 || p.stages[s].rows != R || p.stages[s].n_shards != n) { bad++; continue; }
            for (int64_t id = 0; id < R; id++) {
                int k = ps_placement_shard_of(&p, s, id);
                int64_t lo, hi;
                if (k < 0 || k >= n) { bad++; continue; }
                ps_shard_range(R, n, k, &lo, &hi);
                if (!(lo <= id && id < hi) || p.stages[s].shards[k].lo != lo || p.stages[s].shards[k].hi != hi)
                    bad++;
            }
            if (ps_placement_shard_of(&p, s, -1) != -1 || ps_placement_shard_of(&p, s, R) != -1) bad++;
            if (ps_placement_shard_of(&p, ps_placement_stage(&p, "decoder"), 0) != -1) bad++;
        }
    CHECK(cases == 100 * 8 - 28);   /* n <= R: all but 28 pairs with R < n */
    CHECK_MSG(bad == 0, "%d disagreements", bad);
}

/* model.placement.emb.rows: chosen boundaries (pseudo-random, strictly
 * increasing in 1..R-1) tile [0, R) as given, and shard_of agrees with
 * lo/hi for every id. */
static void test_chosen_rows(void) {
    int bad = 0, cases = 0;
    uint64_t x = 88172645463325252ull;
    for (int64_t R = 2; R <= 80; R++)
        for (int n = 2; n <= 8 && n <= R; n++)
            for (int rep = 0; rep < 4; rep++) {
                /* n-1 distinct boundaries from 1..R-1, sorted */
                int64_t b[8];
                int nb = 0;
                for (int64_t v = 1; v < R && nb < n - 1; v++) {
                    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                    /* take v with probability (needed)/(left) */
                    if ((int64_t)(x % (uint64_t)(R - v)) < (n - 1 - nb)) b[nb++] = v;
                }
                if (nb != n - 1) { bad++; continue; }
                char list[256] = "";
                for (int k = 0; k < nb; k++) {
                    size_t o = strlen(list);
                    snprintf(list + o, sizeof list - o, "%s%lld", k ? "," : "", (long long)b[k]);
                }
                ps_config c;
                ps_placement p;
                ps_err e;
                ps_err_clear(&e);
                lm_sharded(&c, n, R);
                set(&c, "model.placement.emb.rows", list);
                if (ps_placement_resolve(&c, &p, &e) != PS_OK) {
                    CHECK_MSG(0, "R=%lld n=%d rows %s: %s", (long long)R, n, list, e.msg);
                    continue;
                }
                cases++;
                const ps_place_stage *ps = &p.stages[0];
                int64_t next = 0;
                for (int k = 0; k < n; k++) {
                    if (ps->shards[k].lo != next || ps->shards[k].hi <= ps->shards[k].lo) bad++;
                    if (k < n - 1 && ps->shards[k].hi != b[k]) bad++;
                    next = ps->shards[k].hi;
                }
                if (next != R) bad++;
                for (int64_t id = 0; id < R; id++) {
                    int k = ps_placement_shard_of(&p, 0, id);
                    if (k < 0 || k >= n || !(ps->shards[k].lo <= id && id < ps->shards[k].hi)) bad++;
                }
                if (ps_placement_shard_of(&p, 0, -1) != -1 || ps_placement_shard_of(&p, 0, R) != -1) bad++;
            }
    CHECK(cases > 1500);
    CHECK_MSG(bad == 0, "%d disagreements over %d cases", bad, cases);
    /* the boundaries a user gives for a skewed vocabulary: a small first shard */
    ps_config c;
    ps_placement p;
    ps_err e;
    ps_err_clear(&e);
    lm_sharded(&c, 3, 2000);
    set(&c, "model.placement.emb.rows", "12, 140");
    CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
    CHECK(p.stages[0].shards[0].hi == 12 && p.stages[0].shards[1].lo == 12 && p.stages[0].shards[1].hi == 140 &&
          p.stages[0].shards[2].lo == 140 && p.stages[0].shards[2].hi == 2000);
    CHECK(ps_placement_shard_of(&p, 0, 11) == 0 && ps_placement_shard_of(&p, 0, 12) == 1 &&
          ps_placement_shard_of(&p, 0, 139) == 1 && ps_placement_shard_of(&p, 0, 140) == 2 &&
          ps_placement_shard_of(&p, 0, 1999) == 2);
}

/* No servers: one implicit server hosting every stage on its device. */
static void test_single_server(void) {
    ps_config c;
    ps_placement p;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    set(&c, "model.placement.fc", "cuda:1");
    set(&c, "server.address", "10.0.0.5:50051");
    CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
    CHECK(p.n_servers == 1 && !strcmp(p.server_name[0], "") && !strcmp(p.server_addr[0], "10.0.0.5:50051"));
    CHECK(p.n_stages == 2);
    CHECK(!strcmp(p.stages[0].name, "conv") && p.stages[0].server == 0 && !strcmp(p.stages[0].device, "cpu"));
    CHECK(!strcmp(p.stages[1].name, "fc") && p.stages[1].server == 0 && !strcmp(p.stages[1].device, "cuda:1"));
    CHECK(ps_placement_hosts(&p, 0, 0) && ps_placement_hosts(&p, 1, 0));
    CHECK(ps_placement_servers_used(&p) == 1);
    CHECK(ps_placement_stage(&p, "nope") == -1);
    /* every model of the registry resolves this way */
    set(&c, "model.placement.fc", "cpu");
    const char *models[] = {"cartpole_policy", "rnn_lm"};
    for (int m = 0; m < 2; m++) {
        ps_config_defaults(&c);
        set(&c, "model.name", models[m]);
        CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s: %s", models[m], e.msg);
        for (int s = 0; s < p.n_stages; s++) CHECK(p.stages[s].server == 0 && p.stages[s].n_shards == 0);
        CHECK(ps_placement_servers_used(&p) == 1);
    }
}

/* The tutorial's two-device split across two hosts. */
static void test_mnist_two_servers(void) {
    ps_config c;
    ps_placement p;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    set(&c, "servers.ps0.address", "127.0.0.1:50061");
    set(&c, "servers.ps1.address", "127.0.0.1:50062");
    set(&c, "model.placement.conv", "ps0/cpu");
    set(&c, "model.placement.fc", "ps1");
    CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
    CHECK(p.n_servers == 2 && !strcmp(p.server_name[1], "ps1") && !strcmp(p.server_addr[1], "127.0.0.1:50062"));
    int conv = ps_placement_stage(&p, "conv"), fc = ps_placement_stage(&p, "fc");
    CHECK(conv == 0 && fc == 1);
    CHECK(p.stages[conv].server == 0 && p.stages[fc].server == 1 && !strcmp(p.stages[fc].device, "cpu"));
    CHECK(ps_placement_hosts(&p, conv, 0) && !ps_placement_hosts(&p, conv, 1));
    CHECK(!ps_placement_hosts(&p, fc, 0) && ps_placement_hosts(&p, fc, 1));
    CHECK(ps_placement_servers_used(&p) == 2);

    /* sync across the two is refused; on one server it is fine */
    set(&c, "server.consistency", "sync");
    CHECK(ps_placement_resolve(&c, &p, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "server.consistency: sync needs one server: stages span ps0, ps1; use hogwild");
    ps_config_defaults(&c);
    set(&c, "servers.ps0.address", "127.0.0.1:50061");
    set(&c, "model.placement.conv", "ps0");
    set(&c, "model.placement.fc", "ps0/cuda:0");
    set(&c, "server.consistency", "ssp");
    CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
    CHECK(ps_placement_servers_used(&p) == 1 && !strcmp(p.stages[1].device, "cuda:0"));
}

/* rnn_lm: emb sharded over ps0 and ps1, decoder and rnn on ps2. */
static void test_lm_sharded(void) {
    ps_config c;
    ps_placement p;
    ps_err e;
    ps_err_clear(&e);
    ps_config_defaults(&c);
    set(&c, "model.name", "rnn_lm");
    set(&c, "model.sizes.ntoken", "10001");
    set(&c, "servers.ps0.address", "127.0.0.1:50061");
    set(&c, "servers.ps1.address", "127.0.0.1:50062");
    set(&c, "servers.ps2.address", "127.0.0.1:50063");
    set(&c, "model.placement.emb.shards", "ps0, ps1/cuda:0");
    set(&c, "model.placement.decoder", "ps2/cpu");
    set(&c, "model.placement.rnn", "ps2");
    CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
    int emb = ps_placement_stage(&p, "emb");
    const ps_place_stage *ps = &p.stages[emb];
    CHECK(ps->server == -1 && ps->n_shards == 2 && ps->rows == 10001 && !strcmp(ps->table, "encoder.weight"));
    CHECK(ps->shards[0].server == 0 && ps->shards[0].lo == 0 && ps->shards[0].hi == 5000);
    CHECK(ps->shards[1].server == 1 && ps->shards[1].lo == 5000 && ps->shards[1].hi == 10001);
    CHECK(!strcmp(ps->shards[0].device, "cpu") && !strcmp(ps->shards[1].device, "cuda:0"));
    CHECK(ps_placement_shard_of(&p, emb, 4999) == 0 && ps_placement_shard_of(&p, emb, 5000) == 1);
    CHECK(ps_placement_hosts(&p, emb, 0) && ps_placement_hosts(&p, emb, 1) && !ps_placement_hosts(&p, emb, 2));
    CHECK(p.stages[ps_placement_stage(&p, "decoder")].server == 2);
    CHECK(p.stages[ps_placement_stage(&p, "rnn")].server == 2);
    CHECK(ps_placement_servers_used(&p) == 3);
    /* the registry's default rows when model.sizes.ntoken is not set */
    ps_config_defaults(&c);
    set(&c, "model.name", "rnn_lm");
    set(&c, "servers.a.address", "h1:1");
    set(&c, "servers.b.address", "h2:1");
    set(&c, "model.placement.emb.shards", "a,b");
    set(&c, "model.placement.decoder", "a");
    set(&c, "model.placement.rnn", "b");
    CHECK_MSG(ps_placement_resolve(&c, &p, &e) == PS_OK, "%s", e.msg);
    CHECK(p.stages[0].rows == 10000 && p.stages[0].shards[1].lo == 5000);
}

int main(void) {
    test_ranges();
    test_shard_of();
    test_chosen_rows();
    test_single_server();
    test_mnist_two_servers();
    test_lm_sharded();
    return check_summary("test_placement");
}
