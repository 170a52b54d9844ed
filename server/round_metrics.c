/* round_metrics.c - the trainers' named scalars aggregated per round:
 * min/mean/max, the EMA and the stop rule (round_metrics.h). */
#include "round_metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

typedef struct acc {        /* one name within the open round */
    uint32_t count;
    double sum, min, max;
} acc;

struct ps_rmetrics {
    pthread_mutex_t mu;
    ps_rmetrics_opts o;
    int nnames;
    char names[PS_RM_MAX_NAMES][PS_RM_NAME_MAX];
    char *owners[PS_RM_MAX_NAMES];   /* who brought names[k]; NULL: reserved (configured) */
    double ema[PS_RM_MAX_NAMES];
    int has_ema[PS_RM_MAX_NAMES];
    acc open[PS_RM_MAX_NAMES];  /* hogwild/ssp: the round being gathered */
    int open_steps;
    int warned;
    int solved;
    ps_round_report latest;
};

ps_rmetrics *ps_rmetrics_create(const ps_rmetrics_opts *o, ps_err *err) {
    if (!(o->alpha > 0 && o->alpha <= 1) || o->round_steps < 1) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "round metrics need 0 < alpha <= 1 (got %g) and round_steps >= 1 "
                   "(got %d)", o->alpha, o->round_steps);
        return NULL;
    }
    ps_rmetrics *m = calloc(1, sizeof *m);
    if (!m) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->o = *o;
    m->o.stop_metric[PS_RM_NAME_MAX - 1] = '\0';
    if (m->o.stop_metric[0])  /* reserved: never pushed out by other names */
        snprintf(m->names[m->nnames++], PS_RM_NAME_MAX, "%s", m->o.stop_metric);
    return m;
}

const char *const *ps_rmetrics_shipped_names(void) {
    static const char *const names[] = {"reward", "loss", NULL};
    return names;
}

int ps_rmetrics_is_shipped_name(const char *name) {
    for (const char *const *n = ps_rmetrics_shipped_names(); *n; n++)
        if (!strcmp(*n, name)) return 1;
    return 0;
}

void ps_rmetrics_free(ps_rmetrics *m) {
    if (!m) return;
    for (int k = 0; k < PS_RM_MAX_NAMES; k++) free(m->owners[k]);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static int name_ok(const char *s) {
    size_t n = strnlen(s, PS_RM_NAME_MAX);
    if (n == 0 || n >= PS_RM_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}

ps_status ps_scalar_set_check(const ps_scalar_set *set, ps_err *err) {
    if (set->n < 0 || set->n > PS_RM_MAX_SCALARS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "scalars: %d given, at most %d", set->n, PS_RM_MAX_SCALARS);
    for (int i = 0; i < set->n; i++) {
        const ps_scalar *s = &set->s[i];
        if (!name_ok(s->name))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "scalars[%d].name '%.*s' must be 1..%d characters of "
                              "[A-Za-z0-9_.-]", i, PS_RM_NAME_MAX - 1, s->name, PS_RM_NAME_MAX - 1);
        if (!isfinite(s->value))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "scalars[%d] ('%s') is not finite (%g)", i, s->name,
                              s->value);
        for (int j = 0; j < i; j++)
            if (!strcmp(set->s[j].name, s->name))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "scalars[%d]: '%s' is given twice", i, s->name);
    }
    return PS_OK;
}

static int find_locked(ps_rmetrics *m, const char *name) {
    for (int i = 0; i < m->nnames; i++)
        if (!strcmp(m->names[i], name)) return i;
    return -1;
}

ps_status ps_rmetrics_admit(ps_rmetrics *m, const ps_scalar_set *set, const char *owner, ps_err *err) {
    if (!owner) owner = "";
    ps_status st = PS_OK;
    pthread_mutex_lock(&m->mu);
    int mine = 0, fresh = 0;
    for (int k = 0; k < m->nnames; k++) mine += m->owners[k] && !strcmp(m->owners[k], owner);
    for (int i = 0; set && i < set->n && !st; i++) {
        if (find_locked(m, set->s[i].name) >= 0) continue;
        char names[PS_RM_MAX_NAMES * (PS_RM_NAME_MAX + 2)] = "";
        for (int k = 0, o = 0; k < m->nnames; k++)
            o += snprintf(names + o, sizeof names - (size_t)o, "%s%s", k ? ", " : "", m->names[k]);
        if (m->nnames + fresh >= PS_RM_MAX_NAMES)
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "scalars[%d]: '%s' is a new name and psd tracks %d names "
                            "at most, all taken (%s); send those names only", i, set->s[i].name, PS_RM_MAX_NAMES,
                            names);
        else if (mine + fresh >= PS_RM_NAMES_PER_CLIENT)
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "scalars[%d]: '%s' is a new name and this client brought "
                            "%d names already (at most %d per client; tracked: %s)", i, set->s[i].name, mine + fresh,
                            PS_RM_NAMES_PER_CLIENT, names);
        fresh++;
    }
    for (int i = 0; set && i < set->n && !st; i++) {
        if (find_locked(m, set->s[i].name) >= 0) continue;
        char *o = strdup(owner);
        if (!o) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
            break;
        }
        m->owners[m->nnames] = o;
        snprintf(m->names[m->nnames++], PS_RM_NAME_MAX, "%s", set->s[i].name);
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* Index of name; a name not admitted (a caller that skips
 * ps_rmetrics_admit) is added while there is room; -1 when full. */
static int slot_locked(ps_rmetrics *m, const char *name) {
    int k = find_locked(m, name);
    if (k >= 0) return k;
    if (m->nnames == PS_RM_MAX_NAMES) {
        if (!m->warned) {
            ps_log(PS_LOG_WARN, "round metrics: scalar '%s' ignored: psd tracks %d names at most", name,
                   PS_RM_MAX_NAMES);
            m->warned = 1;
        }
        return -1;
    }
    snprintf(m->names[m->nnames], PS_RM_NAME_MAX, "%s", name);
    return m->nnames++;
}

static void add_locked(ps_rmetrics *m, acc *a, const ps_scalar_set *set) {
    for (int i = 0; set && i < set->n; i++) {
        int k = slot_locked(m, set->s[i].name);
        if (k < 0) continue;
        double v = set->s[i].value;
        acc *x = &a[k];
        if (!x->count || v < x->min) x->min = v;
        if (!x->count || v > x->max) x->max = v;
        x->sum += v;
        x->count++;
    }
}

/* Close the round gathered in a: update the EMAs, the solved flag and
 * m->latest. */
static void close_locked(ps_rmetrics *m, const acc *a) {
    ps_round_report *r = &m->latest;
    r->round++;
    r->n = 0;
    for (int k = 0; k < m->nnames; k++) {
        if (!a[k].count) continue;
        double mean = a[k].sum / a[k].count;
        double x = m->o.ema_of == PS_RM_EMA_MIN ? a[k].min : m->o.ema_of == PS_RM_EMA_MAX ? a[k].max : mean;
        m->ema[k] = m->has_ema[k] ? m->o.alpha * x + (1 - m->o.alpha) * m->ema[k] : x;
        m->has_ema[k] = 1;
        ps_round_stat *s = &r->s[r->n++];
        snprintf(s->name, sizeof s->name, "%s", m->names[k]);
        s->count = a[k].count;
        s->min = a[k].min;
        s->mean = mean;
        s->max = a[k].max;
        s->ema = m->ema[k];
        if (!m->solved && m->o.stop_metric[0] && !strcmp(m->names[k], m->o.stop_metric) &&
            m->ema[k] > m->o.stop_threshold) {
            m->solved = 1;
            ps_log(PS_LOG_INFO, "Solved! Running %s is now %g (> %g) after %llu rounds", m->o.stop_metric, m->ema[k],
                   m->o.stop_threshold, (unsigned long long)r->round);
        }
    }
    r->solved = m->solved;
}

void ps_rmetrics_close_round(ps_rmetrics *m, const ps_scalar_set *const *sets, int n, ps_round_report *out) {
    acc a[PS_RM_MAX_NAMES];
    memset(a, 0, sizeof a);
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < n; i++) add_locked(m, a, sets[i]);
    close_locked(m, a);
    if (out) *out = m->latest;
    pthread_mutex_unlock(&m->mu);
}

void ps_rmetrics_add_step(ps_rmetrics *m, const ps_scalar_set *set, ps_round_report *out) {
    pthread_mutex_lock(&m->mu);
    add_locked(m, m->open, set);
    if (++m->open_steps >= m->o.round_steps) {
        close_locked(m, m->open);
        memset(m->open, 0, sizeof m->open);
        m->open_steps = 0;
    }
    if (out) *out = m->latest;
    pthread_mutex_unlock(&m->mu);
}

void ps_rmetrics_latest(ps_rmetrics *m, ps_round_report *out) {
    pthread_mutex_lock(&m->mu);
    *out = m->latest;
    pthread_mutex_unlock(&m->mu);
}
