/* report_limit.c - per-client rate, repeat and log limits of ReportPartial
 * (report_limit.h). */
#include "report_limit.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct client {
    uint64_t key;           /* hash of the client's identity; 0 = a free slot */
    double tokens, refilled;
    double logged;          /* when its last line was logged */
    uint64_t held;          /* lines held back since */
    double seen;
} client;

struct ps_report_limit {
    pthread_mutex_t mu;
    double rate, burst;
    client clients[PS_REPORT_CLIENTS];
    uint64_t recent[PS_REPORT_RECENT];  /* (client key ^ context) of recent reports, a ring */
    size_t next;
};

static uint64_t mix(uint64_t z) {
    z ^= z >> 33;
    z *= 0xff51afd7ed558ccdULL;
    z ^= z >> 33;
    z *= 0xc4ceb9fe1a85ec53ULL;
    return z ^ (z >> 33);
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h ? h : 1;
}

ps_report_limit *ps_report_limit_create(double rate, double burst) {
    if (!(rate > 0) || !(burst >= 1)) return NULL;
    ps_report_limit *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    r->rate = rate;
    r->burst = burst;
    return r;
}

void ps_report_limit_free(ps_report_limit *r) {
    if (!r) return;
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The client's slot, a new one (the least recently seen is forgotten). */
static client *client_locked(ps_report_limit *r, uint64_t key, double now) {
    client *lru = &r->clients[0];
    for (int i = 0; i < PS_REPORT_CLIENTS; i++) {
        client *c = &r->clients[i];
        if (c->key == key) return c;
        if (!c->key || (lru->key && c->seen < lru->seen)) lru = c;
    }
    *lru = (client){.key = key, .tokens = r->burst, .refilled = now, .logged = now - 2, .seen = now};
    return lru;
}

ps_status ps_report_limit_admit(ps_report_limit *r, const char *client_id, uint64_t ctx, double now, int *log,
                                uint64_t *held, ps_err *err) {
    uint64_t key = hash_str(client_id ? client_id : "");
    uint64_t pair = mix(key ^ mix(ctx)) | 1;
    ps_status st = PS_OK;
    *log = 0;
    *held = 0;
    pthread_mutex_lock(&r->mu);
    client *c = client_locked(r, key, now);
    c->seen = now;
    for (size_t i = 0; i < PS_REPORT_RECENT && !st; i++)
        if (r->recent[i] == pair) st = ps_err_set(err, PS_ERR_ALREADY_EXISTS, "context %llx was reported already",
                                                  (unsigned long long)ctx);
    if (!st) {
        c->tokens += (now - c->refilled) * r->rate;
        if (c->tokens > r->burst) c->tokens = r->burst;
        c->refilled = now;
        if (c->tokens < 1) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ReportPartial: more than %g reports a second from this "
                            "client (a burst of %g); not counted - a trainer reports a partial step once",
                            r->rate, r->burst);
        } else {
            c->tokens -= 1;
            r->recent[r->next] = pair;
            r->next = (r->next + 1) % PS_REPORT_RECENT;
            if (now - c->logged >= 1.0) {
                *log = 1;
                *held = c->held;
                c->held = 0;
                c->logged = now;
            } else {
                c->held++;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}
