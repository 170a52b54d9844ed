/* task_cartpole.c - the "cartpole" task: the observers of PyTorch's
 * distributed RPC tutorial's REINFORCE agent, with psd hosting the policy
 * (model cartpole_policy, stage "policy") and its optimizer (task.h).
 *
 * One round is one episode of CartPole-v1 (cartpole.h) under one
 * context id: at every step t a training Forward of the observation
 * (stage "policy", seq = t) answers the action probabilities, the observer
 * samples the action with its own RNG and steps its environment. At the
 * episode's end it computes the discounted returns of ITS OWN rewards
 * (R_t = sum_k gamma^k r_{t+k}, never across observers), normalises them
 * over the episode (--normalize episode, as PyTorch's single-agent
 * reinforce.py), and sends d loss / d probs of
 *     loss = -sum_t log pi(a_t | s_t) * R_t  -  beta * sum_t H(pi(. | s_t))
 * for every recorded step in ONE Backward, then Step into psd's round.
 * Under consistency sync with sync_reduce sum (configs/cartpole.yaml) the
 * round's step is the gradient of the sum of every observer's loss - the
 * tutorial's one loss over all observers - applied once.
 *
 * The Step carries named scalars (reward = the episode's length, loss);
 * psd aggregates them per round and answers min/mean/max and the running
 * reward (an EMA), so every observer prints the tutorial's lines and all of
 * them stop at once when psd says the round solved it (server.stop_*).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cartpole.h"
#include "clock.h"
#include "reinforce.h"
#include "task.h"

#define LAT_CAP (1 << 16) /* select-action round trips kept for the median */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct cartpole_task {
    double gamma;          /* --gamma */
    double entropy;        /* --entropy: beta */
    int normalize;         /* --normalize: 1 episode, 0 none */
    long max_rounds;       /* --max-rounds */
    int episode_steps;     /* --episode-steps (truncation) */
    int log_interval;      /* trainer.log_every */
    ps_cartpole env;
    ps_rng act_rng;        /* this observer's action sampling */
    /* one episode, T <= episode_steps */
    float *obs;            /* (T, 4) */
    float *probs;          /* (T, 2) */
    int *actions;          /* (T) */
    double *rewards;       /* (T) */
    double *returns;       /* (T) */
    float *grads;          /* (T, 2) d loss / d probs */
    uint32_t *seqs;        /* (T) */
    ps_client_tensor *gt;  /* (T) */
    float *lat_us;         /* select-action (Forward) round trips, a sample of at most LAT_CAP */
    long nlat;
    int solved;            /* psd said the running reward crossed the threshold */
    double last_reward, running;
} cartpole_task;

static void *cartpole_create(void) {
    cartpole_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->gamma = 0.99;
    t->normalize = 1;
    t->max_rounds = 10000;
    t->episode_steps = PS_CARTPOLE_MAX_STEPS;
    return t;
}

static void cartpole_destroy(void *arg) {
    cartpole_task *t = arg;
    if (!t) return;
    free(t->obs);
    free(t->probs);
    free(t->actions);
    free(t->rewards);
    free(t->returns);
    free(t->grads);
    free(t->seqs);
    free(t->gt);
    free(t->lat_us);
    free(t);
}

static ps_status parse_double(const char *flag, const char *v, double lo, double hi, double *out, ps_err *err) {
    ps_status st = ps_parse_double(flag, v, lo, hi, 0, out, err);
    return st ? ps_err_prefix(err, "cartpole") : PS_OK;
}

static ps_status cartpole_set_flag(void *arg, const char *flag, const char *v, ps_err *err) {
    cartpole_task *t = arg;
    if (!strcmp(flag, "--gamma")) return parse_double(flag, v, 0, 1, &t->gamma, err);
    if (!strcmp(flag, "--entropy")) return parse_double(flag, v, 0, 100, &t->entropy, err);
    if (!strcmp(flag, "--max-rounds")) {
        long n;
        if (ps_parse_long(flag, v, 1, 1000000000, &n, err)) return ps_err_prefix(err, "cartpole");
        t->max_rounds = n;
        return PS_OK;
    }
    if (!strcmp(flag, "--episode-steps")) {
        long n;
        if (ps_parse_long(flag, v, 1, 100000, &n, err)) return ps_err_prefix(err, "cartpole");
        t->episode_steps = (int)n;
        return PS_OK;
    }
    if (!strcmp(flag, "--normalize")) {
        if (!strcmp(v, "episode")) t->normalize = 1;
        else if (!strcmp(v, "none")) t->normalize = 0;
        else return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "cartpole: --normalize: '%s' is not one of: episode, none", v);
        return PS_OK;
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "cartpole: unknown flag '%s'", flag);
}

static ps_status cartpole_init(void *arg, const ps_task_env *env, ps_err *err) {
    cartpole_task *t = arg;
    size_t T = (size_t)t->episode_steps;
    if (T > 4096)  /* Backward's more_seqs (proto/ps.options) */
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "cartpole: --episode-steps %d: at most 4096 steps fit one Backward",
                          t->episode_steps);
    t->obs = malloc(T * PS_CARTPOLE_OBS * sizeof(float));
    t->probs = malloc(T * PS_CARTPOLE_ACTIONS * sizeof(float));
    t->actions = malloc(T * sizeof(int));
    t->rewards = malloc(T * sizeof(double));
    t->returns = malloc(T * sizeof(double));
    t->grads = malloc(T * PS_CARTPOLE_ACTIONS * sizeof(float));
    t->seqs = malloc(T * sizeof(uint32_t));
    t->gt = calloc(T, sizeof(ps_client_tensor));
    t->lat_us = malloc(LAT_CAP * sizeof(float));
    if (!t->obs || !t->probs || !t->actions || !t->rewards || !t->returns || !t->grads || !t->seqs || !t->gt || !t->lat_us)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    /* Each observer its own environment and action stream (the tutorial
     * seeds every observer alike; we do not). */
    uint64_t seed = env->cfg->trainer.seed * 1000003ULL + (uint64_t)env->rank;
    ps_cartpole_init(&t->env, seed, t->episode_steps);
    ps_rng_seed(&t->act_rng, seed ^ 0x5bd1e9955bd1e995ULL);
    t->log_interval = env->cfg->trainer.log_every;
    return PS_OK;
}

static ps_status cartpole_begin_epoch(void *arg, const ps_task_env *env, int epoch, int *rounds, ps_err *err) {
    cartpole_task *t = arg;
    (void)env, (void)epoch, (void)err;
    *rounds = t->solved ? 0 : (int)t->max_rounds;
    return PS_OK;
}

/* Returns, normalisation and d loss / d probs of the episode's T steps
 * (reinforce.h); returns the loss. */
static double episode_grads(cartpole_task *t, int T) {
    ps_reinforce_returns(t->rewards, T, t->gamma, t->normalize, t->returns);
    return ps_reinforce_grads(t->probs, T, PS_CARTPOLE_ACTIONS, t->actions, t->returns, t->entropy, t->grads);
}

/* One episode under one context (ps_retry_once: a lost one runs again). */
typedef struct episode_job {
    cartpole_task *t;
    const ps_task_env *env;
    int T;
    double loss;
    uint64_t round;
    ps_client_step_out so;
    ps_client_round rep;
} episode_job;

static void episode_release(void *arg, uint64_t ctx) {
    episode_job *j = arg;
    ps_client_release_context(j->env->cl, ctx, (uint32_t)j->env->rank, NULL, NULL);  /* best effort */
}

static ps_status episode_step(void *arg, uint64_t ctx, ps_err *err) {
    episode_job *j = arg;
    ps_client_scalar sc[2] = {{"reward", (double)j->T}, {"loss", j->loss}};
    return ps_client_step_scalars(j->env->cl, ctx, j->round, sc, 2, &j->so, &j->rep, err);
}

static ps_status episode_once(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    episode_job *j = arg;
    cartpole_task *t = j->t;
    ps_status st;
    float obs[PS_CARTPOLE_OBS];
    ps_cartpole_reset(&t->env, obs);
    int T = 0;
    j->round = 0;
    for (;;) {
        memcpy(t->obs + (size_t)T * 4, obs, sizeof obs);
        ps_client_fwd f = {.ctx = ctx, .seq = (uint32_t)T, .rank = (uint32_t)j->env->rank, .train = 1,
                           .stage = "policy",
                           .input = {.dtype = PS_CLIENT_F32, .ndim = 2, .dims = {1, PS_CARTPOLE_OBS},
                                     .data = t->obs + (size_t)T * 4}};
        ps_client_fwd_out o = {.out = t->probs + (size_t)T * 2, .out_cap = 2};
        double t0 = (ps_mono_s() * 1e6);
        if ((st = ps_client_forward_ex(j->env->cl, &f, &o, err))) return st;
        if (t->nlat < LAT_CAP) t->lat_us[t->nlat++] = (float)((ps_mono_s() * 1e6) - t0);
        *kept = PS_KEPT_HELD;
        if (o.ndim != 2 || o.dims[0] != 1 || o.dims[1] != 2)
            return ps_err_set(err, PS_ERR_INTERNAL, "policy returned a (%lld, %lld) output, expected (1, 2)",
                              (long long)o.dims[0], (long long)(o.ndim > 1 ? o.dims[1] : 0));
        if (T == 0) j->round = o.round;
        const float *p = t->probs + (size_t)T * 2;
        if (!(p[0] >= 0 && p[1] >= 0 && isfinite(p[0]) && isfinite(p[1])))
            return ps_err_set(err, PS_ERR_INTERNAL, "policy returned probabilities %g, %g", p[0], p[1]);
        /* Categorical(probs).sample() */
        double u = (double)(ps_rng_next(&t->act_rng) >> 11) * 0x1.0p-53 * ((double)p[0] + p[1]);
        int a = u < p[0] ? 0 : 1;
        t->actions[T] = a;
        int term = 0, trunc = 0;
        double r = 0;
        ps_cartpole_step(&t->env, a, obs, &r, &term, &trunc);
        t->rewards[T] = r;
        T++;
        if (term || trunc) break;
    }
    j->T = T;
    j->loss = episode_grads(t, T);
    for (int i = 0; i < T; i++) {
        t->seqs[i] = (uint32_t)i;
        t->gt[i] = (ps_client_tensor){.dtype = PS_CLIENT_F32, .ndim = 2, .dims = {1, 2}, .data = t->grads + (size_t)i * 2};
    }
    ps_client_bwd b = {.ctx = ctx, .n = T, .seqs = t->seqs, .grads = t->gt};
    if ((st = ps_client_backward_ex(j->env->cl, &b, NULL, err))) return st;
    *kept = PS_KEPT_STEP;
    return episode_step(j, ctx, err);
}

static ps_status cartpole_run_round(void *arg, const ps_task_env *env, int epoch, int r, ps_task_round *out,
                                    ps_err *err) {
    cartpole_task *t = arg;
    (void)epoch;
    episode_job job = {.t = t, .env = env};
    ps_once_ops ops = {.unit = "episode", .run = episode_once, .step = episode_step, .arg = &job, .marks_step = 1,
                       .release = episode_release};
    /* A straggler's episode (its sync round closed without it: ABORTED) is
     * played again under a new context by ps_retry_once, into the open round. */
    ps_status st = ps_retry_once(env->retry, env->ids, &ops, err);
    if (st) return st;
    /* psd's round metrics: the round's rewards over all observers and the
     * running reward (server.metrics_ema_of / _alpha); the tutorial's
     * "Last reward" is the round's minimum. */
    const ps_client_round_scalar *rw = ps_client_round_find(&job.rep, "reward");
    t->last_reward = rw ? rw->min : job.T;
    t->running = rw ? rw->ema : job.T;
    int solved = job.rep.solved;
    if (r % t->log_interval == 0 || solved) {
        printf("Rank %ld Episode %d\tLast reward: %.2f\tAverage reward: %.2f\t(own %d steps, round %llu of %u "
               "observers, loss %.4f)\n", env->rank, r + 1, t->last_reward, t->running, job.T,
               (unsigned long long)job.so.round, job.so.round_contexts, job.loss);
    }
    if (solved) {
        printf("Rank %ld Solved! Running reward is now %.2f (round %llu, %d episodes)\n", env->rank, t->running,
               (unsigned long long)job.so.round, r + 1);
        t->solved = 1;
    }
    fflush(stdout);
    *out = (ps_task_round){.loss = job.loss, .samples = job.T, .version = job.so.version, .printed = 1,
                           .stop = solved};
    return PS_OK;
}

/* Greedy episodes (eval Forwards, dropout off) with psd's current weights. */
static ps_status cartpole_evaluate(void *arg, const ps_task_env *env, ps_err *err) {
    cartpole_task *t = arg;
    const int episodes = 5;
    long total = 0;
    ps_cartpole e;
    ps_cartpole_init(&e, env->cfg->trainer.seed * 1000003ULL + (uint64_t)env->rank + 7777, t->episode_steps);
    for (int k = 0; k < episodes; k++) {
        float obs[4], p[2];
        ps_cartpole_reset(&e, obs);
        for (;;) {
            ps_client_fwd f = {.rank = (uint32_t)env->rank, .stage = "policy",
                               .input = {.dtype = PS_CLIENT_F32, .ndim = 2, .dims = {1, 4}, .data = obs}};
            ps_client_fwd_out o = {.out = p, .out_cap = 2};
            ps_status st = ps_client_forward_ex(env->cl, &f, &o, err);
            if (st) return st;
            int term, trunc;
            ps_cartpole_step(&e, p[1] > p[0], obs, NULL, &term, &trunc);
            if (term || trunc) break;
        }
        total += e.steps;
    }
    printf("Rank %ld greedy policy: %.1f steps per episode over %d episodes (limit %d)\n", env->rank,
           (double)total / episodes, episodes, t->episode_steps);
    if (t->nlat) {   /* the first LAT_CAP training Forwards */
        qsort(t->lat_us, (size_t)t->nlat, sizeof(float), cmp_float);
        printf("Rank %ld select-action round trip (training Forward): median %.0f us, p90 %.0f us over %ld calls\n",
               env->rank, t->lat_us[t->nlat / 2], t->lat_us[t->nlat * 9 / 10], t->nlat);
    }
    return PS_OK;
}

static const ps_task_flag cartpole_flags[] = {
    {"--gamma", NULL, "G", NULL, "discount factor of the returns (default 0.99)"},
    {"--max-rounds", NULL, "N", NULL, "episodes (rounds) at most per epoch (default 10000)"},
    {"--episode-steps", NULL, "N", NULL, "truncate an episode after N steps (CartPole-v1: 500)"},
    {"--normalize", NULL, "HOW", NULL, "returns normalised per 'episode' (default, as reinforce.py) or 'none'"},
    {"--entropy", NULL, "BETA", NULL, "entropy bonus weight in the loss (default 0)"},
    {0},
};

const ps_task ps_task_cartpole = {
    .name = "cartpole",
    .description = "PyTorch's RPC tutorial's REINFORCE observers: CartPole-v1, policy on psd",
    .unit = "episode",
    .flags = cartpole_flags,
    .create = cartpole_create,
    .set_flag = cartpole_set_flag,
    .init = cartpole_init,
    .begin_epoch = cartpole_begin_epoch,
    .run_round = cartpole_run_round,
    .evaluate = cartpole_evaluate,
    .destroy = cartpole_destroy,
};
