/* placement.h - where each stage of a cluster's model lives: which psd
 * (servers.<name>) and device hosts it, or which row ranges of its
 * embedding table each shard server holds.
 *
 * Resolved once from a checked config (ps_config_check_cluster) and the
 * model file it names; psd (what do I host?), ps-train (whom do I call for a
 * stage, which shard owns a row id?) and --check-config read the same
 * answer, so they cannot disagree.
 *
 * The single-server form (no servers.* in the config) resolves to one
 * implicit server, index 0, named "" with the address server.address, that
 * hosts every stage on the device model.placement.<stage> gives.
 *
 * Shards: a stage placed with model.placement.<stage>.shards: [a, b, ...]
 * (n entries) keeps its first layer's table (an embedding of R rows) split
 * into contiguous ranges: shard k holds global rows [R*k/n, R*(k+1)/n)
 * (integer division; ps_shard_range), or, with model.placement.<stage>.rows:
 * [B1, ..., B(n-1)], [B_k, B_{k+1}) with B_0 = 0 and B_n = R (checked here:
 * n-1 boundaries, strictly increasing, in 1..R-1). Everything that needs a
 * shard's rows reads shards[k].lo/hi, never ps_shard_range. Row ids travel
 * global: the shard's
 * psd maps id - lo to its local row and refuses ids outside [lo, hi).
 *
 * A plain value; no allocation.
 */
#ifndef PS_PLACEMENT_H
#define PS_PLACEMENT_H

#include <stdint.h>

#include "config.h"
#include "status.h"

typedef struct ps_place_shard {
    int server;                        /* index into ps_placement.servers */
    char device[PS_CONFIG_DEVICE_MAX];
    int64_t lo, hi;                    /* global rows [lo, hi) */
} ps_place_shard;

typedef struct ps_place_stage {
    char name[PS_CONFIG_STAGE_MAX];    /* model stage, in model order */
    int server;                        /* hosting server; -1 when sharded */
    char device[PS_CONFIG_DEVICE_MAX]; /* unsharded: its device */
    int n_shards;                      /* 0 = not sharded */
    ps_place_shard shards[PS_CONFIG_MAX_SHARDS];
    int64_t rows;                      /* sharded: rows of the table (R) */
    int equal;                         /* sharded: 1 = ps_shard_range's split, 0 = model.placement.<stage>.rows */
    char table[64];                    /* sharded: the table's parameter name ("encoder.weight") */
} ps_place_stage;

typedef struct ps_placement {
    int n_servers;                     /* >= 1 */
    char server_name[PS_CONFIG_MAX_SERVERS][PS_CONFIG_NAME_MAX];   /* "" in the single-server form */
    char server_addr[PS_CONFIG_MAX_SERVERS][PS_CONFIG_ADDR_MAX];   /* where trainers dial */
    int n_stages;                      /* every stage of the model */
    ps_place_stage stages[PS_CONFIG_MAX_STAGES];
} ps_placement;

/* Resolve c (checked with ps_config_check_cluster first, or this checks the
 * same things and fails the same way). */
ps_status ps_placement_resolve(const ps_config *c, ps_placement *p, ps_err *err);

/* The placement part of ps_placement_resolve alone: model stages and sizes
 * (ps_config_check_model), every stage placed, servers named in a
 * placement defined, shard lists valid; without ps_config_check_cluster's
 * checks of the servers' addresses and the consistency mode (it calls
 * this). */
ps_status ps_placement_build(const ps_config *c, ps_placement *p, ps_err *err);

/* Shard k of n over rows R: [R*k/n, R*(k+1)/n) - the equal split used when
 * a stage gives no rows; resolved stages carry their ranges in lo/hi. */
void ps_shard_range(int64_t rows, int n, int k, int64_t *lo, int64_t *hi);

/* The shard of stage s that holds global row id (0..n_shards-1), or -1
 * when the stage is not sharded or id is outside [0, rows). */
int ps_placement_shard_of(const ps_placement *p, int s, int64_t id);

/* Stage index of that name, -1 if absent. */
int ps_placement_stage(const ps_placement *p, const char *name);

/* 1 when server `server` hosts stage s (whole or one of its shards). */
int ps_placement_hosts(const ps_placement *p, int s, int server);

/* Number of distinct servers the stages use (sync/ssp need 1). */
int ps_placement_servers_used(const ps_placement *p);

#endif
