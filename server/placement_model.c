/* placement_model.c - the model options of the stages this psd hosts,
 * from the config and its resolved placement (see placement_model.h). */
#include "placement_model.h"

#include <string.h>
#include <unistd.h>

/* The hosted stages of servers[cfg->self], the shard's rows and devices
 * from the resolved placement p. */
static ps_status hosted_opts(const ps_config *cfg, ps_placement *p, ps_model_opts *mo, ps_err *err) {
    if (ps_placement_resolve(cfg, p, err) != PS_OK) return err->code;
    int self = cfg->self;
    mo->n_hosted = 0;
    mo->n_placement = 0;
    mo->shard_stage = NULL;
    for (int s = 0; s < p->n_stages; s++) {
        const ps_place_stage *ps = &p->stages[s];
        if (!ps_placement_hosts(p, s, self)) continue;
        const char *device = ps->device;
        for (int k = 0; k < ps->n_shards; k++) {
            if (ps->shards[k].server != self) continue;
            if (mo->shard_stage)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s holds shards of two stages (%s and %s); "
                                  "one sharded stage per server", cfg->servers[self].name, mo->shard_stage, ps->name);
            mo->shard_stage = ps->name;
            mo->shard_lo = ps->shards[k].lo;
            mo->shard_hi = ps->shards[k].hi;
            device = ps->shards[k].device;
        }
        mo->hosted[mo->n_hosted++] = ps->name;
        mo->placement_stage[mo->n_placement] = ps->name;
        mo->placement_device[mo->n_placement++] = device;
    }
    if (!mo->n_hosted)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "servers.%s hosts no stage of model %s: place a stage on it "
                          "in model.placement, or remove it from servers", cfg->servers[self].name, mo->arch);
    return PS_OK;
}

ps_status ps_placement_model_opts(const ps_config *c, ps_placement *p, ps_model_opts *mo, ps_err *err) {
    memset(mo, 0, sizeof *mo);
    mo->arch = c->model.arch;
    mo->file = c->model.file[0] ? c->model.file : NULL;
    mo->cpu_backend = ps_config_enum_name("model.backend", c->model.backend);
    mo->n_placement = c->model.n_placement;
    for (int i = 0; i < c->model.n_placement; i++) {
        mo->placement_stage[i] = c->model.placement[i].stage;
        mo->placement_device[i] = c->model.placement[i].n_shards ? c->model.placement[i].shard_device[0]
                                                                  : c->model.placement[i].device;
    }
    if (c->self >= 0 && hosted_opts(c, p, mo, err)) return err->code;
    mo->n_sizes = c->model.n_sizes;
    for (int i = 0; i < c->model.n_sizes; i++) {
        mo->size_key[i] = c->model.sizes[i].key;
        mo->size_value[i] = c->model.sizes[i].value;
    }
    mo->seed = c->model.seed;
    mo->snapshot_steps = c->model.snapshot_steps;
    mo->compute_threads = c->server.compute_threads > 0 ? c->server.compute_threads
                                                         : (int)sysconf(_SC_NPROCESSORS_ONLN);
    mo->pin_compute = c->server.pin_compute;
    /* the model checks the settings (e.g. momentum with adam, weight decay
     * with an embedding table) and names the one it refuses */
    mo->optim = &c->optimizer;
    return PS_OK;
}
