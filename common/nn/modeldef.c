/* modeldef.c - the model-file loader (see modeldef.h): YAML (libyaml's
 * event parser, into a small tree that keeps line numbers; anchors and
 * aliases are refused) -> a checked ps_model_def, and the model search
 * path behind model.arch. */
#include "modeldef.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "arena.h"
#include "layers.h"
#include "onnx_model.h"

#ifndef PS_MODELS_DIR
#define PS_MODELS_DIR "/usr/local/share/psd/models"
#endif

/* Bounds that keep a hostile file cheap (the parser is a fuzz target). */
#define MAX_FILE_BYTES (4 << 20)
#define MAX_TREE_NODES 200000
#define MAX_DEPTH 32
#define MAX_NODES 4096
#define NODE_NAME_MAX 100      /* leaves room for ".num_batches_tracked" in a 128-byte parameter name */
#define STAGE_NAME_MAX 31
#define MODEL_NAME_MAX 63

/* ------------------------------------------------------------- YAML tree */

enum { Y_SCALAR, Y_SEQ, Y_MAP };

typedef struct ynode {
    int type;
    int line;
    int plain;               /* scalar written without quotes */
    const char *s;           /* scalar text */
    int n;                   /* Y_SEQ: items; Y_MAP: pairs (kids holds 2n) */
    struct ynode **kids;
} ynode;

typedef struct parse {
    ps_arena *a;
    const char *path;
    ps_err *err;
    int tree_nodes;
} parse;

static ps_status perr(parse *P, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static ps_status perr(parse *P, int line, const char *fmt, ...) {
    char msg[PS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) return ps_err_set(P->err, PS_ERR_INVALID_ARGUMENT, "%s:%d: %s", P->path, line, msg);
    return ps_err_set(P->err, PS_ERR_INVALID_ARGUMENT, "%s: %s", P->path, msg);
}

static ps_status yaml_fail(parse *P, const yaml_parser_t *y) {
    if (y->error == YAML_MEMORY_ERROR)
        return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory parsing YAML", P->path);
    if (y->error == YAML_READER_ERROR)
        return ps_err_set(P->err, PS_ERR_FORMAT, "%s: byte %zu: %s", P->path, y->problem_offset,
                          y->problem ? y->problem : "cannot read");
    return ps_err_set(P->err, PS_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", P->path,
                      y->problem_mark.line + 1, y->problem_mark.column + 1, y->problem ? y->problem : "unknown problem",
                      y->context ? " " : "", y->context ? y->context : "");
}

/* Growable child list while a collection is open. */
typedef struct kidvec {
    ynode **v;
    int n, cap;
} kidvec;

static int kid_push(kidvec *k, ynode *c) {
    if (k->n == k->cap) {
        int cap = k->cap ? 2 * k->cap : 8;
        ynode **v = realloc(k->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        k->v = v;
        k->cap = cap;
    }
    k->v[k->n++] = c;
    return 0;
}

/* Reads one node whose first event is ev (already taken) into *out. */
static ps_status read_node(parse *P, yaml_parser_t *y, yaml_event_t *ev, int depth, ynode **out) {
    if (++P->tree_nodes > MAX_TREE_NODES) return perr(P, (int)ev->start_mark.line + 1, "too many YAML nodes");
    if (depth > MAX_DEPTH) return perr(P, (int)ev->start_mark.line + 1, "nested deeper than %d levels", MAX_DEPTH);
    ynode *n = ps_arena_alloc(P->a, sizeof *n);
    if (!n) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
    n->line = (int)ev->start_mark.line + 1;
    const yaml_char_t *anchor = NULL;
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        return perr(P, n->line, "YAML aliases (*%s) are not supported in model files: write the value out",
                    (const char *)ev->data.alias.anchor);
    case YAML_SCALAR_EVENT:
        anchor = ev->data.scalar.anchor;
        if (anchor) break;
        n->type = Y_SCALAR;
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        n->s = ps_arena_strndup(P->a, (const char *)ev->data.scalar.value, ev->data.scalar.length);
        if (!n->s) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
        if (strlen(n->s) != ev->data.scalar.length) return perr(P, n->line, "a value holds a NUL byte");
        *out = n;
        return PS_OK;
    case YAML_SEQUENCE_START_EVENT:
        anchor = ev->data.sequence_start.anchor;
        n->type = Y_SEQ;
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = ev->data.mapping_start.anchor;
        n->type = Y_MAP;
        break;
    default:
        return perr(P, n->line, "unexpected YAML event");
    }
    if (anchor) return perr(P, n->line, "YAML anchors (&%s) are not supported in model files", (const char *)anchor);
    yaml_event_type_t end = n->type == Y_SEQ ? YAML_SEQUENCE_END_EVENT : YAML_MAPPING_END_EVENT;
    kidvec k = {0};
    ps_status st = PS_OK;
    for (;;) {
        yaml_event_t e;
        if (!yaml_parser_parse(y, &e)) { st = yaml_fail(P, y); break; }
        if (e.type == end) { yaml_event_delete(&e); break; }
        ynode *c = NULL;
        st = read_node(P, y, &e, depth + 1, &c);
        yaml_event_delete(&e);
        if (st != PS_OK) break;
        if (kid_push(&k, c)) { st = ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path); break; }
    }
    if (st == PS_OK) {
        n->kids = ps_arena_alloc(P->a, (size_t)(k.n ? k.n : 1) * sizeof *n->kids);
        if (!n->kids) st = ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
        else if (k.n) memcpy(n->kids, k.v, (size_t)k.n * sizeof *n->kids);
        n->n = n->type == Y_MAP ? k.n / 2 : k.n;
    }
    free(k.v);
    *out = n;
    return st;
}

/* The document's root node (NULL for an empty file). */
static ps_status read_tree(parse *P, const char *text, size_t len, ynode **root) {
    yaml_parser_t y;
    *root = NULL;
    if (!yaml_parser_initialize(&y))
        return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: cannot initialise libyaml", P->path);
    yaml_parser_set_input_string(&y, (const unsigned char *)text, len);
    ps_status st = PS_OK;
    int docs = 0;
    for (int done = 0; !done && st == PS_OK;) {
        yaml_event_t e;
        if (!yaml_parser_parse(&y, &e)) { st = yaml_fail(P, &y); break; }
        switch (e.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1) st = perr(P, (int)e.start_mark.line + 1, "a second YAML document: one model per file");
            break;
        case YAML_STREAM_START_EVENT:
        case YAML_DOCUMENT_END_EVENT: break;
        default: st = read_node(P, &y, &e, 0, root); break;
        }
        yaml_event_delete(&e);
    }
    yaml_parser_delete(&y);
    return st;
}

static const char *kind_word(const ynode *n) {
    return n->type == Y_MAP ? "a mapping" : n->type == Y_SEQ ? "a list" : "a value";
}

static int is_null(const ynode *n) {
    return n->type == Y_SCALAR && n->plain &&
           (!n->s[0] || !strcmp(n->s, "~") || !strcmp(n->s, "null") || !strcmp(n->s, "Null") || !strcmp(n->s, "NULL"));
}

/* A mapping's value for key (NULL if absent). */
static const ynode *map_get(const ynode *m, const char *key) {
    for (int i = 0; i < m->n; i++)
        if (m->kids[2 * i]->type == Y_SCALAR && !strcmp(m->kids[2 * i]->s, key)) return m->kids[2 * i + 1];
    return NULL;
}

/* Keys are scalars, distinct, and among allowed (NULL-terminated; NULL:
 * any); what names the mapping in errors. */
static ps_status check_keys(parse *P, const ynode *m, const char *what, const char *const *allowed) {
    for (int i = 0; i < m->n; i++) {
        const ynode *k = m->kids[2 * i];
        if (k->type != Y_SCALAR) return perr(P, k->line, "%s: a key must be a name, not %s", what, kind_word(k));
        for (int j = 0; j < i; j++)
            if (!strcmp(m->kids[2 * j]->s, k->s))
                return perr(P, k->line, "%s: duplicate key '%s' (first given on line %d)", what, k->s,
                            m->kids[2 * j]->line);
        if (!allowed) continue;
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++) ok = !strcmp(*a, k->s);
        if (!ok) {
            char list[256] = "";
            for (const char *const *a = allowed; *a; a++) {
                strncat(list, a == allowed ? "" : ", ", sizeof list - strlen(list) - 1);
                strncat(list, *a, sizeof list - strlen(list) - 1);
            }
            return perr(P, k->line, "%s: unknown key '%s' (keys: %s)", what, k->s, list);
        }
    }
    return PS_OK;
}

static ps_status need_scalar(parse *P, const ynode *v, const char *what) {
    if (!v || v->type != Y_SCALAR || is_null(v))
        return perr(P, v ? v->line : 0, "%s: expected a single value, got %s", what,
                    !v || is_null(v) ? "nothing" : kind_word(v));
    return PS_OK;
}

/* Strict number: the whole text a finite decimal. */
static int parse_number(const char *s, double *out) {
    if (!s || !*s) return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno || !isfinite(v)) return 0;
    for (const char *p = s; *p; p++)   /* no hex floats, inf or nan spellings */
        if (!strchr("0123456789+-.eE", *p)) return 0;
    *out = v;
    return 1;
}

static int parse_int(const char *s, int64_t *out) {
    double v;
    if (!parse_number(s, &v) || v != floor(v) || fabs(v) > 9.0e15) return 0;
    *out = (int64_t)v;
    return 1;
}

static int name_ok(const char *s, size_t max, int dots, int dash) {
    size_t n = strlen(s);
    if (!n || n > max) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                 (dash && c == '-') || (dots && c == '.');
        if (!ok) return 0;
        if (c == '.' && (i == 0 || i == n - 1 || s[i - 1] == '.')) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- sizes */

static const char *const SIZE_KEYS[] = {"default", "min", "max", "max_exclusive", "integer", "doc", NULL};

static ps_status bool_value(parse *P, const ynode *v, const char *what, int *out) {
    ps_status st = need_scalar(P, v, what);
    if (st) return st;
    const char *t[] = {"true", "True", "TRUE", "yes", "on", NULL}, *f[] = {"false", "False", "FALSE", "no", "off", NULL};
    for (int i = 0; t[i]; i++) if (!strcmp(v->s, t[i])) { *out = 1; return PS_OK; }
    for (int i = 0; f[i]; i++) if (!strcmp(v->s, f[i])) { *out = 0; return PS_OK; }
    return perr(P, v->line, "%s: '%s' is not true or false", what, v->s);
}

static ps_status num_value(parse *P, const ynode *v, const char *what, double *out) {
    ps_status st = need_scalar(P, v, what);
    if (st) return st;
    if (!parse_number(v->s, out)) return perr(P, v->line, "%s: '%s' is not a number", what, v->s);
    return PS_OK;
}

static ps_status read_sizes(parse *P, const ynode *m, ps_model_def *d) {
    if (m->type != Y_MAP) return perr(P, m->line, "sizes: expected a mapping of size names, got %s", kind_word(m));
    ps_status st = check_keys(P, m, "sizes", NULL);
    if (st) return st;
    if (m->n > PS_MODEL_MAX_SIZES) return perr(P, m->line, "sizes: %d sizes, at most %d", m->n, PS_MODEL_MAX_SIZES);
    for (int i = 0; i < m->n; i++) {
        const ynode *k = m->kids[2 * i], *v = m->kids[2 * i + 1];
        char what[96];
        snprintf(what, sizeof what, "sizes.%.40s", k->s);
        if (!name_ok(k->s, 31, 0, 0) || !strcmp(k->s, "input"))
            return perr(P, k->line, "%s: a size name is letters, digits and '_' (at most 31), not 'input'", what);
        ps_size_key *sk = &d->sizes[d->nsizes++];
        sk->key = k->s;
        sk->line = k->line;
        sk->lo = -1e300;
        sk->hi = 1e300;
        double x;
        if (v->type == Y_SCALAR) {   /* shorthand: ntoken: 10000 */
            if ((st = num_value(P, v, what, &x))) return st;
            sk->def = x;
            sk->integer = x == floor(x);
            continue;
        }
        if (v->type != Y_MAP) return perr(P, v->line, "%s: expected a number or {default: ...}, got %s", what, kind_word(v));
        if ((st = check_keys(P, v, what, SIZE_KEYS))) return st;
        const ynode *e;
        if (!(e = map_get(v, "default"))) return perr(P, v->line, "%s: no default", what);
        if ((st = num_value(P, e, what, &sk->def))) return st;
        if ((e = map_get(v, "min")) && (st = num_value(P, e, what, &sk->lo))) return st;
        if ((e = map_get(v, "max")) && (st = num_value(P, e, what, &sk->hi))) return st;
        if ((e = map_get(v, "max_exclusive")) && (st = bool_value(P, e, what, &sk->hi_open))) return st;
        if ((e = map_get(v, "integer")) && (st = bool_value(P, e, what, &sk->integer))) return st;
        if ((e = map_get(v, "doc"))) {
            if ((st = need_scalar(P, e, what))) return st;
            sk->doc = e->s;
        }
        if (!(sk->def >= sk->lo && (sk->hi_open ? sk->def < sk->hi : sk->def <= sk->hi)) ||
            (sk->integer && sk->def != floor(sk->def)))
            return perr(P, v->line, "%s: default %g is outside its range %g..%g%s%s", what, sk->def, sk->lo, sk->hi,
                        sk->hi_open ? " (excluded)" : "", sk->integer ? " or not a whole number" : "");
        for (int j = 0; j + 1 < d->nsizes; j++)
            if (!strcmp(d->sizes[j].key, sk->key)) return perr(P, k->line, "%s: given twice", what);
    }
    return PS_OK;
}

/* ---------------------------------------------------------------- nodes */

static const char *const STAGE_KEYS[] = {"name", "input", "output", "nodes", NULL};
static const char *const INPUT_KEYS[] = {"shape", "dtype", NULL};

/* A value of an attribute: a number, a size of the model, or (bool/enum
 * attributes) a word; checked here as far as it can be without sizes. */
static ps_status check_attr_value(parse *P, const ps_model_def *d, const ps_node_def *nd, const ps_attr_spec *sp,
                                  const ynode *v) {
    if (is_null(v)) {
        if (sp->type == PS_ATTR_FLOAT_OR_NULL || sp->type == PS_ATTR_PAIR_OR_NULL || sp->type == PS_ATTR_NAME ||
            sp->type == PS_ATTR_INT_OR_NULL ||
            sp->type == PS_ATTR_FLOAT_PAIR_OR_NULL)
            return PS_OK;
        return perr(P, v->line, "node '%s' (%s): %s: no value given", nd->name, nd->kind_name, sp->name);
    }
    double x;
    switch (sp->type) {
    case PS_ATTR_BOOL:
        if (strcmp(v->s, "true") && strcmp(v->s, "false") && strcmp(v->s, "True") && strcmp(v->s, "False"))
            return perr(P, v->line, "node '%s' (%s): %s: '%s' is not true or false", nd->name, nd->kind_name,
                        sp->name, v->s);
        return PS_OK;
    case PS_ATTR_ENUM:
        for (const char *const *e = sp->enums; *e; e++)
            if (!strcmp(*e, v->s)) return PS_OK;
        {
            char list[128] = "";
            for (const char *const *e = sp->enums; *e; e++) {
                strncat(list, e == sp->enums ? "'" : ", '", sizeof list - strlen(list) - 1);
                strncat(list, *e, sizeof list - strlen(list) - 1);
                strncat(list, "'", sizeof list - strlen(list) - 1);
            }
            return perr(P, v->line, "node '%s' (%s): %s: '%s' is not one of %s", nd->name, nd->kind_name, sp->name,
                        v->s, list);
        }
    case PS_ATTR_NAME: {
        size_t n = strlen(v->s);
        int ok = n > 0 && n <= 64;
        for (size_t i = 0; ok && i < n; i++) ok = isalnum((unsigned char)v->s[i]) || v->s[i] == '_';
        if (ok) return PS_OK;
        return perr(P, v->line, "node '%s' (%s): %s: '%s' is not a name of 1 to 64 letters, digits and _ (a "
                    "state_dict suffix)", nd->name, nd->kind_name, sp->name, v->s);
    }
    default:
        if ((sp->type == PS_ATTR_FLOAT_INF || sp->type == PS_ATTR_FLOAT_OR_NULL) && ps_attr_infinity(v->s, &x))
            return PS_OK;
        if (parse_number(v->s, &x) || ps_model_def_size(d, v->s)) return PS_OK;
        return perr(P, v->line, "node '%s' (%s): %s: '%s' is neither a number nor a size of the model%s", nd->name,
                    nd->kind_name, sp->name, v->s, d->nsizes ? " (sizes: see sizes:)" : " (it has no sizes)");
    }
}

static ps_status read_attr(parse *P, const ps_model_def *d, ps_node_def *nd, const ynode *k, const ynode *v,
                           ps_attr_def *ad) {
    const ps_attr_spec *sp = ps_layer_kind_attr(nd->kind, k->s);
    if (!sp) {
        char list[320];
        return perr(P, k->line, "node '%s' (%s): unknown attribute '%s' (%s takes: %s)", nd->name, nd->kind_name,
                    k->s, nd->kind_name, ps_layer_kind_attr_list(nd->kind, list, sizeof list));
    }
    ad->key = k->s;
    ad->line = k->line;
    if (v->type == Y_MAP)
        return perr(P, v->line, "node '%s' (%s): %s: expected a value or a list, got a mapping", nd->name,
                    nd->kind_name, k->s);
    if (v->type == Y_SEQ) {
        const int pair = sp->type == PS_ATTR_PAIR || sp->type == PS_ATTR_PAIR_OR_NULL ||
                         sp->type == PS_ATTR_FLOAT_PAIR_OR_NULL;
        if (!pair && sp->type != PS_ATTR_DIMS && sp->type != PS_ATTR_BATCH_DIMS && sp->type != PS_ATTR_PADS)
            return perr(P, v->line, "node '%s' (%s): %s takes one value, not a list", nd->name, nd->kind_name, k->s);
        int max = pair ? 2 : sp->type == PS_ATTR_BATCH_DIMS ? PS_SHAPE_MAX_DIMS + 1
                  : sp->type == PS_ATTR_PADS ? 2 * PS_SHAPE_MAX_DIMS : PS_SHAPE_MAX_DIMS;
        if (v->n == 0 && !sp->empty_ok)
            return perr(P, v->line, "node '%s' (%s): %s: an empty list (give at least one value)", nd->name,
                        nd->kind_name, k->s);
        if (v->n > max || (pair && v->n != 2))
            return perr(P, v->line, "node '%s' (%s): %s: a list of %d value%s%s, got %d", nd->name, nd->kind_name,
                        k->s, max, max == 1 ? "" : "s", !pair ? " at most" : "", v->n);
        ad->is_list = 1;
        ad->nvals = v->n;
        for (int i = 0; i < v->n; i++) {
            const ynode *e = v->kids[i];
            if (e->type != Y_SCALAR)
                return perr(P, e->line, "node '%s' (%s): %s: entry %d: expected a value, got %s", nd->name,
                            nd->kind_name, k->s, i + 1, kind_word(e));
            ps_status st = check_attr_value(P, d, nd, sp, e);
            if (st) return st;
            ad->vals[i] = is_null(e) ? NULL : e->s;
        }
        return PS_OK;
    }
    ps_status st = check_attr_value(P, d, nd, sp, v);
    if (st) return st;
    ad->nvals = 1;
    ad->vals[0] = is_null(v) ? NULL : v->s;
    return PS_OK;
}

static ps_status read_inits(parse *P, ps_node_def *nd, const ynode *v) {
    if (v->type != Y_MAP)
        return perr(P, v->line, "node '%s': init: expected a mapping {PARAMETER: SPEC}, got %s", nd->name,
                    kind_word(v));
    ps_status st = check_keys(P, v, "init", NULL);
    if (st) return st;
    ps_init_def *in = ps_arena_alloc(P->a, (size_t)(v->n ? v->n : 1) * sizeof *in);
    if (!in) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
    for (int i = 0; i < v->n; i++) {
        const ynode *k = v->kids[2 * i], *s = v->kids[2 * i + 1];
        char what[160];
        snprintf(what, sizeof what, "node '%s': init.%s", nd->name, k->s);
        if ((st = need_scalar(P, s, what))) return st;
        ps_init ig;
        ps_err e2 = {0};
        if (ps_init_parse(s->s, &ig, &e2)) return perr(P, s->line, "%s: %s", what, e2.msg);
        in[i] = (ps_init_def){k->s, s->s, k->line};
    }
    nd->inits = in;
    nd->ninit = v->n;
    return PS_OK;
}

/* share: NODE and tie: {SUFFIX: NODE.SUFFIX} as written (resolve_shares
 * finds the owners once every node is read). */
static ps_status read_share(parse *P, ps_node_def *nd, const ynode *v) {
    char what[160];
    snprintf(what, sizeof what, "node '%s': share", nd->name);
    ps_status st = need_scalar(P, v, what);
    if (st) return st;
    nd->share_name = v->s;
    nd->share_line = v->line;
    return PS_OK;
}

static ps_status read_ties(parse *P, ps_node_def *nd, const ynode *v) {
    if (v->type != Y_MAP)
        return perr(P, v->line, "node '%s': tie: expected a mapping {PARAMETER: NODE.PARAMETER}, got %s", nd->name,
                    kind_word(v));
    ps_status st = check_keys(P, v, "tie", NULL);
    if (st) return st;
    ps_tie_def *t = ps_arena_alloc(P->a, (size_t)(v->n ? v->n : 1) * sizeof *t);
    if (!t) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
    for (int i = 0; i < v->n; i++) {
        const ynode *k = v->kids[2 * i], *s = v->kids[2 * i + 1];
        char what[160];
        snprintf(what, sizeof what, "node '%s': tie.%s", nd->name, k->s);
        if ((st = need_scalar(P, s, what))) return st;
        t[i] = (ps_tie_def){.suffix = k->s, .target = s->s, .node = -1, .line = k->line};
    }
    nd->ties = t;
    nd->ntie = v->n;
    return PS_OK;
}

static ps_status read_node_def(parse *P, ps_model_def *d, const ynode *m, int stage, ps_node_def *nd) {
    if (m->type != Y_MAP)
        return perr(P, m->line, "stage '%s': a node is a mapping {name: ..., kind: ...}, got %s",
                    d->stages[stage].name, kind_word(m));
    ps_status st = check_keys(P, m, "node", NULL);
    if (st) return st;
    nd->line = m->line;
    nd->stage = stage;
    nd->share = -1;
    const ynode *v = map_get(m, "name");
    if (!v) return perr(P, m->line, "stage '%s': a node without a name", d->stages[stage].name);
    if ((st = need_scalar(P, v, "node name"))) return st;
    /* nn.Module names are any string without '.': '-' included (torchvision's regnet: 'block1-0') */
    if (!name_ok(v->s, NODE_NAME_MAX, 1, 1) || !strcmp(v->s, "input"))
        return perr(P, v->line, "node name '%.120s': a module path of letters, digits, '_' and '-' joined by '.' "
                    "(at most %d characters), not 'input'", v->s, NODE_NAME_MAX);
    nd->name = v->s;
    if (!(v = map_get(m, "kind"))) return perr(P, m->line, "node '%s': no kind", nd->name);
    char what[160];
    snprintf(what, sizeof what, "node '%s': kind", nd->name);
    if ((st = need_scalar(P, v, what))) return st;
    nd->kind_name = v->s;
    if (!(nd->kind = ps_layer_kind_find(v->s))) {
        char list[512];
        return perr(P, v->line, "node '%s': unknown kind '%.64s' (kinds: %s)", nd->name, v->s,
                    ps_layer_kind_list(list, sizeof list));
    }
    const ynode *in1 = map_get(m, "input"), *inn = map_get(m, "inputs");
    if (in1 && inn) return perr(P, inn->line, "node '%s': give input or inputs, not both", nd->name);
    if (inn && inn->type == Y_SEQ && (inn->n < 1 || inn->n > PS_NODE_MAX_INPUTS))
        return perr(P, inn->line, "node '%s': inputs: 1..%d names, got %d", nd->name, PS_NODE_MAX_INPUTS, inn->n);
    int cap = inn && inn->type == Y_SEQ ? inn->n : 1;   /* without input(s): the node before it (resolve_inputs) */
    nd->in_names = ps_arena_alloc(P->a, (size_t)cap * sizeof *nd->in_names);
    nd->in = ps_arena_alloc(P->a, (size_t)cap * sizeof *nd->in);
    if (!nd->in_names || !nd->in) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
    if (in1) {
        snprintf(what, sizeof what, "node '%s': input", nd->name);
        if ((st = need_scalar(P, in1, what))) return st;
        nd->nin = 1;
        nd->in_names[0] = in1->s;
    } else if (inn) {
        if (inn->type != Y_SEQ)
            return perr(P, inn->line, "node '%s': inputs: expected a list of node names, got %s", nd->name,
                        kind_word(inn));
        for (int i = 0; i < inn->n; i++) {
            snprintf(what, sizeof what, "node '%s': inputs entry %d", nd->name, i + 1);
            if ((st = need_scalar(P, inn->kids[i], what))) return st;
            nd->in_names[nd->nin++] = inn->kids[i]->s;
        }
    }
    ps_attr_def *attrs = ps_arena_alloc(P->a, (size_t)(m->n ? m->n : 1) * sizeof *attrs);
    if (!attrs) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
    for (int i = 0; i < m->n; i++) {
        const ynode *k = m->kids[2 * i], *val = m->kids[2 * i + 1];
        if (!strcmp(k->s, "name") || !strcmp(k->s, "kind") || !strcmp(k->s, "input") || !strcmp(k->s, "inputs"))
            continue;
        if (!strcmp(k->s, "init")) {
            if ((st = read_inits(P, nd, val))) return st;
            continue;
        }
        if (!strcmp(k->s, "share") || !strcmp(k->s, "tie")) {
            if ((st = k->s[0] == 's' ? read_share(P, nd, val) : read_ties(P, nd, val))) return st;
            continue;
        }
        if ((st = read_attr(P, d, nd, k, val, &attrs[nd->nattr]))) return st;
        nd->nattr++;
    }
    nd->attrs = attrs;
    /* required attributes */
    for (const ps_attr_spec *sp = nd->kind->attrs; sp && sp->name; sp++) {
        if (sp->def) continue;
        int given = 0;
        for (int i = 0; i < nd->nattr && !given; i++) given = !strcmp(nd->attrs[i].key, sp->name);
        if (!given) return perr(P, m->line, "node '%s' (%s): %s is required", nd->name, nd->kind_name, sp->name);
    }
    return PS_OK;
}

static ps_status read_stage_input(parse *P, ps_model_def *d, ps_stage_def *sd, const ynode *v) {
    char what[96];
    snprintf(what, sizeof what, "stage '%s': input", sd->name);
    if (v->type != Y_MAP) return perr(P, v->line, "%s: expected {shape: [...], dtype: ...}, got %s", what, kind_word(v));
    ps_status st = check_keys(P, v, what, INPUT_KEYS);
    if (st) return st;
    const ynode *sh = map_get(v, "shape"), *dt = map_get(v, "dtype");
    if (!sh) return perr(P, v->line, "%s: no shape (the per-sample shape; [] for one id per sample)", what);
    if (sh->type != Y_SEQ || sh->n > PS_SHAPE_MAX_DIMS)
        return perr(P, sh->line, "%s: shape: a list of at most %d dimensions", what, PS_SHAPE_MAX_DIMS);
    sd->in_ndim = sh->n;
    for (int i = 0; i < sh->n; i++) {
        const ynode *e = sh->kids[i];
        int64_t x;
        if (e->type == Y_SCALAR && parse_int(e->s, &x) && x >= 1) {
            sd->in_dims[i] = x;
        } else if (e->type == Y_SCALAR && ps_model_def_size(d, e->s)) {
            sd->in_keys[i] = e->s;
        } else {
            return perr(P, e->line, "%s: shape entry %d: '%s' is neither a whole number >= 1 nor a size of the model",
                        what, i + 1, e->type == Y_SCALAR ? e->s : kind_word(e));
        }
    }
    sd->in_dtype = PS_DTYPE_F32;
    if (dt) {
        if ((st = need_scalar(P, dt, what))) return st;
        if (!strcmp(dt->s, "int64")) sd->in_dtype = PS_DTYPE_I64;
        else if (strcmp(dt->s, "float32")) return perr(P, dt->line, "%s: dtype '%s' is not float32 or int64", what, dt->s);
    }
    return PS_OK;
}

/* ------------------------------------------------------- graph checks */

/* Resolve every node's inputs to node indices (-1 = the stage input). */
static ps_status resolve_inputs(parse *P, ps_model_def *d, ps_node_def *nodes) {
    for (int s = 0; s < d->nstages; s++) {
        ps_stage_def *sd = &d->stages[s];
        for (int i = sd->first; i < sd->first + sd->count; i++) {
            ps_node_def *nd = &nodes[i];
            if (!nd->nin) {   /* the node before it in the stage, or the stage input */
                nd->nin = 1;
                nd->in_names[0] = i == sd->first ? "input" : nodes[i - 1].name;
            }
            if (nd->nin < nd->kind->min_inputs || nd->nin > nd->kind->max_inputs)
                return perr(P, nd->line, "node '%s' (%s): %d input%s; %s takes %d%s%d", nd->name, nd->kind_name,
                            nd->nin, nd->nin == 1 ? "" : "s", nd->kind_name, nd->kind->min_inputs,
                            nd->kind->max_inputs > nd->kind->min_inputs ? ".." : "", nd->kind->max_inputs);
            for (int j = 0; j < nd->nin; j++) {
                const char *nm = nd->in_names[j];
                if (!strcmp(nm, "input")) { nd->in[j] = -1; continue; }
                int found = -1;
                for (int k = 0; k < d->nnodes && found < 0; k++)
                    if (!strcmp(nodes[k].name, nm)) found = k;
                if (found < 0)
                    return perr(P, nd->line, "node '%s': input '%s' is not a node of the model (nor 'input', the "
                                "stage's input)", nd->name, nm);
                if (found == i) return perr(P, nd->line, "node '%s' reads itself (a cycle)", nd->name);
                if (nodes[found].stage == s) { nd->in[j] = found; continue; }
                /* Another stage: only the previous stage's output, which is this stage's input. */
                if (nodes[found].stage == s - 1 && d->stages[s - 1].output == found && sd->inherit) {
                    nd->in[j] = -1;
                    continue;
                }
                /* name every tensor live across the cut (the carried one included) */
                int cut = nodes[found].stage < s ? s - 1 : s;   /* the boundary (cut, cut+1) */
                char live[384] = "";
                if (cut + 1 < d->nstages && cut >= 0 && d->stages[cut].output >= 0) {
                    snprintf(live, sizeof live, "%s (the output of stage '%s')", nodes[d->stages[cut].output].name,
                             d->stages[cut].name);
                }
                char *named = calloc((size_t)d->nnodes, 1);   /* already in the list */
                for (int a = 0; named && a < d->nnodes; a++) {   /* nodes after the cut reading nodes before it */
                    if (nodes[a].stage <= cut) continue;
                    for (int b = 0; b < nodes[a].nin; b++) {
                        const char *bn = nodes[a].in_names[b];
                        for (int c = 0; c < d->nnodes; c++) {
                            if (strcmp(nodes[c].name, bn) || nodes[c].stage > cut || c == d->stages[cut].output ||
                                named[c])
                                continue;
                            named[c] = 1;
                            size_t o = strlen(live);
                            snprintf(live + o, sizeof live - o, "%s%s", o ? ", " : "", nodes[c].name);
                        }
                    }
                }
                free(named);
                if (nodes[found].stage > s)
                    return perr(P, nd->line, "node '%s' of stage '%s' reads '%s' of the later stage '%s': a stage "
                                "reads only its own nodes and its input", nd->name, sd->name, nm,
                                d->stages[nodes[found].stage].name);
                return perr(P, nd->line, "node '%s' of stage '%s' reads '%s' of stage '%s': a stage boundary "
                            "carries one tensor (the previous stage's output, read as 'input'), but these are live "
                            "across the cut %s|%s: %s", nd->name, sd->name, nm, d->stages[nodes[found].stage].name,
                            d->stages[cut].name, cut + 1 < d->nstages ? d->stages[cut + 1].name : "?", live);
            }
        }
    }
    return PS_OK;
}

/* Topological order of each stage (Kahn's, taking the earliest node in
 * file order first, so a file already in order keeps it); a cycle is
 * reported with the nodes on it. */
static ps_status order_stages(parse *P, ps_model_def *d, ps_node_def *nodes) {
    for (int s = 0; s < d->nstages; s++) {
        ps_stage_def *sd = &d->stages[s];
        int n = sd->count, f = sd->first;
        int *order = ps_arena_alloc(P->a, (size_t)(n ? n : 1) * sizeof *order);
        int *indeg = calloc((size_t)(n ? n : 1), sizeof *indeg);
        char *done = calloc((size_t)(n ? n : 1), 1);
        if (!order || !indeg || !done) {
            free(indeg);
            free(done);
            return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < nodes[f + i].nin; j++) indeg[i] += nodes[f + i].in[j] >= 0;
        int k = 0;
        while (k < n) {
            int pick = -1;
            for (int i = 0; i < n && pick < 0; i++)
                if (!done[i] && indeg[i] == 0) pick = i;
            if (pick < 0) break;
            done[pick] = 1;
            order[k++] = f + pick;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < nodes[f + i].nin; j++)
                    if (nodes[f + i].in[j] == f + pick) indeg[i]--;
        }
        ps_status st = PS_OK;
        if (k < n) {   /* a cycle among the nodes left: walk inputs from one of them until a repeat */
            int start = -1;
            for (int i = 0; i < n && start < 0; i++)
                if (!done[i]) start = i;
            int *seen = calloc((size_t)n, sizeof *seen), cur = start, step = 1;
            while (seen && !seen[cur]) {
                seen[cur] = step++;
                int next = -1;
                for (int j = 0; j < nodes[f + cur].nin && next < 0; j++) {
                    int in = nodes[f + cur].in[j];
                    if (in >= 0 && !done[in - f]) next = in - f;
                }
                if (next < 0) break;
                cur = next;
            }
            char path[384] = "";
            if (seen) {   /* cur is on the cycle: list it */
                int c = cur;
                do {
                    size_t o = strlen(path);
                    snprintf(path + o, sizeof path - o, "%s%s", o ? " <- " : "", nodes[f + c].name);
                    int next = -1;
                    for (int j = 0; j < nodes[f + c].nin && next < 0; j++) {
                        int in = nodes[f + c].in[j];
                        if (in >= 0 && !done[in - f]) next = in - f;
                    }
                    c = next;
                } while (c >= 0 && c != cur && strlen(path) < sizeof path - 8);
                size_t o = strlen(path);
                snprintf(path + o, sizeof path - o, " <- %s", nodes[f + cur].name);
            }
            st = perr(P, nodes[f + cur].line, "stage '%s': node '%s' is on a cycle (%s): a stage is a DAG",
                      sd->name, nodes[f + cur].name, path);
            free(seen);
        }
        free(indeg);
        free(done);
        if (st) return st;
        sd->order = order;
    }
    return PS_OK;
}

/* ------------------------------------------------- shared parameters */

static int node_index(const ps_model_def *d, const ps_node_def *nodes, const char *name, size_t len) {
    for (int k = 0; k < d->nnodes; k++)
        if (strlen(nodes[k].name) == len && !strncmp(nodes[k].name, name, len)) return k;
    return -1;
}

/* The owner of a share or tie: a node of i's stage, not i, that owns what
 * it lends (no share, no tie of that parameter: one owner, no chains, no
 * cycles). what names the key in errors. */
static ps_status check_owner(parse *P, const ps_model_def *d, const ps_node_def *nodes, int i, int o, int line,
                             const char *what, const char *osuffix) {
    const ps_node_def *nd = &nodes[i], *on = &nodes[o];
    if (o == i) return perr(P, line, "node '%s': %s names the node itself", nd->name, what);
    if (on->stage != nd->stage)
        return perr(P, line, "node '%s' (stage '%s'): %s: '%s' (line %d) is in stage '%s'; parameters are shared "
                    "within a stage only", nd->name, d->stages[nd->stage].name, what, on->name, on->line,
                    d->stages[on->stage].name);
    if (on->share_name)
        return perr(P, line, "node '%s': %s: '%s' (line %d) uses the parameters of '%s' itself (share: on line %d): "
                    "name the owner '%s'", nd->name, what, on->name, on->line, on->share_name, on->share_line,
                    on->share_name);
    for (int t = 0; t < on->ntie; t++)
        if (!osuffix || !strcmp(on->ties[t].suffix, osuffix))
            return perr(P, line, "node '%s': %s: %s.%s is tied to %s itself (line %d): name the owner %s", nd->name,
                        what, on->name, on->ties[t].suffix, on->ties[t].target, on->ties[t].line, on->ties[t].target);
    return PS_OK;
}

/* Resolve share: NODE and tie: {SUFFIX: NODE.SUFFIX} to owner nodes.
 * Whether the parameters exist and their shapes agree is known once the
 * model is built (model_build.c). */
static ps_status resolve_shares(parse *P, ps_model_def *d, ps_node_def *nodes) {
    for (int i = 0; i < d->nnodes; i++) {
        ps_node_def *nd = &nodes[i];
        if (nd->share_name && nd->ntie)
            return perr(P, nd->ties[0].line, "node '%s': tie: with share: (line %d) every parameter is shared "
                        "already", nd->name, nd->share_line);
        if (nd->share_name) {
            int o = node_index(d, nodes, nd->share_name, strlen(nd->share_name));
            if (o < 0)
                return perr(P, nd->share_line, "node '%s': share: '%s' is not a node of the model", nd->name,
                            nd->share_name);
            ps_status st = check_owner(P, d, nodes, i, o, nd->share_line, "share", NULL);
            if (st) return st;
            if (nodes[o].kind != nd->kind)
                return perr(P, nd->share_line, "node '%s' (%s): share: '%s' (line %d) is a %s; share: takes a node "
                            "of the same kind (tie: {PARAMETER: NODE.PARAMETER} ties one parameter across kinds)",
                            nd->name, nd->kind_name, nodes[o].name, nodes[o].line, nodes[o].kind_name);
            nd->share = o;
        }
        ps_tie_def *ties = (ps_tie_def *)nd->ties;
        for (int t = 0; t < nd->ntie; t++) {
            ps_tie_def *td = &ties[t];
            for (int u = 0; u < t; u++)
                if (!strcmp(ties[u].suffix, td->suffix))
                    return perr(P, td->line, "node '%s': tie.%s is given twice", nd->name, td->suffix);
            /* NODE.SUFFIX: the longest node name that is a prefix followed by '.' (or the whole: suffix "") */
            int o = -1;
            size_t best = 0, tl = strlen(td->target);
            for (int k = 0; k < d->nnodes; k++) {
                size_t nl = strlen(nodes[k].name);
                if (nl > best && nl <= tl && !strncmp(td->target, nodes[k].name, nl) &&
                    (td->target[nl] == '.' || td->target[nl] == 0)) {
                    o = k;
                    best = nl;
                }
            }
            char what[160];
            snprintf(what, sizeof what, "tie.%s", td->suffix);
            if (o < 0)
                return perr(P, td->line, "node '%s': %s: '%s' names no node's parameter (NODE.PARAMETER, as "
                            "\"encoder.weight\")", nd->name, what, td->target);
            td->node = o;
            td->owner_suffix = td->target[best] ? td->target + best + 1 : "";
            ps_status st = check_owner(P, d, nodes, i, o, td->line, what, td->owner_suffix);
            if (st) return st;
        }
    }
    return PS_OK;
}

/* Node i of stage sd is held for a trainer (parameters only): a kind that
 * may be (LSTM) reading the stage's own input of one dimension, one step
 * (rnn_lm's "rnn"); an LSTM over (L, input_size) sequences psd runs. */
static int params_only(const ps_stage_def *sd, const ps_node_def *nodes, int i) {
    if (!(nodes[i].kind->flags & PS_KIND_PARAMS_ONLY) || sd->inherit || sd->in_ndim != 1) return 0;
    return nodes[i].nin == 0 ? i == sd->first : !strcmp(nodes[i].in_names[0], "input");
}

/* Every node but the stage's output is read by some node of its stage. */
static ps_status check_dangling(parse *P, ps_model_def *d, const ps_node_def *nodes) {
    for (int s = 0; s < d->nstages; s++) {
        const ps_stage_def *sd = &d->stages[s];
        for (int i = sd->first; i < sd->first + sd->count; i++) {
            if (i == sd->output || params_only(sd, nodes, i)) continue;
            int read = 0;
            for (int k = sd->first; k < sd->first + sd->count && !read; k++)
                for (int j = 0; j < nodes[k].nin && !read; j++) read = nodes[k].in[j] == i;
            if (!read)
                return perr(P, nodes[i].line, "stage '%s': nothing reads node '%s' and it is not the stage's output "
                            "('%s'): remove it, or give the stage output: %s", sd->name, nodes[i].name,
                            nodes[sd->output].name, nodes[i].name);
        }
    }
    return PS_OK;
}

/* ---------------------------------------------------------------- model */

static const char *const TOP_KEYS[] = {"name", "about", "max_batch", "sizes", "stages", NULL};

static ps_status read_model(parse *P, const ynode *root, ps_model_def *d) {
    if (!root || is_null(root)) return perr(P, 0, "empty model file");
    if (root->type != Y_MAP) return perr(P, root->line, "expected a mapping (name:, stages:, ...), got %s", kind_word(root));
    ps_status st = check_keys(P, root, "model", TOP_KEYS);
    if (st) return st;
    const ynode *v = map_get(root, "name");
    if (!v) return perr(P, root->line, "no name: (the model's name, e.g. name: my_resnet)");
    if ((st = need_scalar(P, v, "name"))) return st;
    if (!name_ok(v->s, MODEL_NAME_MAX, 0, 1))
        return perr(P, v->line, "name '%.80s': letters, digits, '_' and '-' (at most %d)", v->s, MODEL_NAME_MAX);
    d->name = v->s;
    d->about = "";
    if ((v = map_get(root, "about"))) {
        if ((st = need_scalar(P, v, "about"))) return st;
        d->about = v->s;
    }
    d->max_batch = 1024;
    if ((v = map_get(root, "max_batch"))) {
        int64_t x;
        if ((st = need_scalar(P, v, "max_batch"))) return st;
        if (!parse_int(v->s, &x) || x < 1 || x > 1000000)
            return perr(P, v->line, "max_batch: '%s' is not a whole number in 1..1000000", v->s);
        d->max_batch = (int)x;
    }
    if ((v = map_get(root, "sizes")) && !is_null(v) && (st = read_sizes(P, v, d))) return st;
    const ynode *stages = map_get(root, "stages");
    if (!stages) return perr(P, root->line, "no stages: (a list of stages, each {name, input, nodes})");
    if (stages->type != Y_SEQ || stages->n < 1)
        return perr(P, stages->line, "stages: expected a list of at least one stage, got %s", kind_word(stages));
    if (stages->n > PS_MODEL_MAX_STAGES)
        return perr(P, stages->line, "stages: %d stages, at most %d", stages->n, PS_MODEL_MAX_STAGES);
    /* count nodes first: one array for the model */
    int total = 0;
    for (int s = 0; s < stages->n; s++) {
        const ynode *sm = stages->kids[s], *nl = sm->type == Y_MAP ? map_get(sm, "nodes") : NULL;
        if (nl && nl->type == Y_SEQ) total += nl->n;
    }
    if (total > MAX_NODES) return perr(P, stages->line, "%d nodes, at most %d", total, MAX_NODES);
    ps_node_def *nodes = ps_arena_alloc(P->a, (size_t)(total ? total : 1) * sizeof *nodes);
    if (!nodes) return ps_err_set(P->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", P->path);
    d->nodes = nodes;
    for (int s = 0; s < stages->n; s++) {
        const ynode *sm = stages->kids[s];
        ps_stage_def *sd = &d->stages[d->nstages++];
        if (sm->type != Y_MAP) return perr(P, sm->line, "stages entry %d: expected a mapping {name, input, nodes}", s + 1);
        if ((st = check_keys(P, sm, "stage", STAGE_KEYS))) return st;
        sd->line = sm->line;
        if (!(v = map_get(sm, "name"))) return perr(P, sm->line, "stages entry %d: no name", s + 1);
        if ((st = need_scalar(P, v, "stage name"))) return st;
        if (!name_ok(v->s, STAGE_NAME_MAX, 0, 0))
            return perr(P, v->line, "stage name '%.64s': letters, digits and '_' (at most %d)", v->s, STAGE_NAME_MAX);
        sd->name = v->s;
        for (int t = 0; t < s; t++)
            if (!strcmp(d->stages[t].name, sd->name))
                return perr(P, v->line, "stage '%s' is defined twice (first on line %d)", sd->name, d->stages[t].line);
        if ((v = map_get(sm, "input")) && !is_null(v)) {
            if ((st = read_stage_input(P, d, sd, v))) return st;
        } else if (s == 0) {
            return perr(P, sm->line, "stage '%s': input: {shape: [...], dtype: ...} is required for the first stage",
                        sd->name);
        } else {
            sd->inherit = 1;
        }
        const ynode *nl = map_get(sm, "nodes");
        if (!nl || nl->type != Y_SEQ || nl->n < 1)
            return perr(P, nl ? nl->line : sm->line, "stage '%s': nodes: a list of at least one node", sd->name);
        sd->first = d->nnodes;
        for (int i = 0; i < nl->n; i++) {
            ps_node_def *nd = &nodes[d->nnodes];
            if ((st = read_node_def(P, d, nl->kids[i], s, nd))) return st;
            for (int k = 0; k < d->nnodes; k++)
                if (!strcmp(nodes[k].name, nd->name))
                    return perr(P, nd->line, "node '%s' is defined twice (first on line %d)", nd->name, nodes[k].line);
            d->nnodes++;
        }
        sd->count = nl->n;
        sd->output = sd->first + sd->count - 1;
        if ((v = map_get(sm, "output"))) {
            if ((st = need_scalar(P, v, "output"))) return st;
            int o = -1;
            for (int i = sd->first; i < sd->first + sd->count && o < 0; i++)
                if (!strcmp(nodes[i].name, v->s)) o = i;
            if (o < 0) return perr(P, v->line, "stage '%s': output '%s' is not a node of the stage", sd->name, v->s);
            sd->output = o;
        }
        /* parameter-only stages: all or nothing */
        int po = 0;
        for (int i = sd->first; i < sd->first + sd->count; i++) po += params_only(sd, nodes, i);
        if (po && po != sd->count)
            return perr(P, sd->line, "stage '%s' mixes parameter-only nodes (LSTM: held for a trainer that runs "
                        "them) with nodes psd runs: put them in a stage of their own", sd->name);
        if (po && sd->inherit)
            return perr(P, sd->line, "stage '%s' holds parameters only: give its input: {shape: [...]} (the size "
                        "the trainer's module reads)", sd->name);
    }
    for (int s = 1; s < d->nstages; s++)   /* a stage after a parameter-only one cannot inherit from it */
        if (d->stages[s].inherit && params_only(&d->stages[s - 1], nodes, d->stages[s - 1].first))
            return perr(P, d->stages[s].line, "stage '%s' has no input: the stage before it ('%s') holds parameters "
                        "only", d->stages[s].name, d->stages[s - 1].name);
    if ((st = resolve_inputs(P, d, nodes))) return st;
    if ((st = resolve_shares(P, d, nodes))) return st;
    if ((st = order_stages(P, d, nodes))) return st;
    return check_dangling(P, d, nodes);
}

ps_model_def *ps_model_def_parse(const char *text, size_t len, const char *path, ps_err *err) {
    ps_model_def *d = calloc(1, sizeof *d);
    ps_arena *a = ps_arena_create(0);
    if (!d || !a) {
        free(d);
        free(a);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    d->arena = a;
    parse P = {.a = a, .path = path ? path : "(model)", .err = err};
    d->path = ps_arena_strndup(a, P.path, strlen(P.path));
    ps_status st = d->path ? PS_OK : ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    if (st == PS_OK && len > MAX_FILE_BYTES)
        st = perr(&P, 0, "%zu bytes; a model file is at most %d", len, MAX_FILE_BYTES);
    ynode *root = NULL;
    if (st == PS_OK) st = read_tree(&P, text, len, &root);
    if (st == PS_OK) st = read_model(&P, root, d);
    if (st != PS_OK) {
        ps_model_def_free(d);
        return NULL;
    }
    return d;
}

ps_model_def *ps_model_def_load_file(const char *path, ps_err *err) {
    if (ps_onnx_is_onnx_file(path)) return ps_onnx_load_def(path, err);   /* model.onnx (onnx_model.h) */
    FILE *f = fopen(path, "rb");
    if (!f) {
        ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open model file: %s", path,
                   strerror(errno));
        return NULL;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (len < cap) break;
        if (cap > MAX_FILE_BYTES) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (!buf) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory reading it", path); return NULL; }
    if (bad) { free(buf); ps_err_set(err, PS_ERR_IO, "%s: read error", path); return NULL; }
    ps_model_def *d = ps_model_def_parse(buf, len, path, err);
    free(buf);
    return d;
}

void ps_model_def_free(ps_model_def *d) {
    if (!d) return;
    ps_arena_free(d->arena);
    free(d);
}

/* ---------------------------------------------------------- search path */

/* The directories searched for NAME.yaml, in order; returns how many. */
static int search_dirs(char dirs[][PATH_MAX], int cap) {
    int n = 0;
    const char *env = getenv("PSD_MODEL_PATH");
    while (env && *env && n < cap) {
        const char *c = strchr(env, ':');
        size_t l = c ? (size_t)(c - env) : strlen(env);
        if (l && l < PATH_MAX) { memcpy(dirs[n], env, l); dirs[n][l] = 0; n++; }
        env = c ? c + 1 : NULL;
    }
    char exe[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0) {
        exe[l] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        const char *rel[] = {"../share/psd/models", "../../configs/models"};
        for (int i = 0; i < 2 && n < cap; i++)
            if ((size_t)snprintf(dirs[n], PATH_MAX, "%s/%s", exe, rel[i]) < PATH_MAX) n++;
    }
    if (n < cap) { snprintf(dirs[n], PATH_MAX, "configs/models"); n++; }
    if (n < cap) { snprintf(dirs[n], PATH_MAX, "%s", PS_MODELS_DIR); n++; }
    return n;
}

const char *ps_model_def_search_path(char *buf, size_t cap) {
    char dirs[8][PATH_MAX];
    int n = search_dirs(dirs, 8);
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ":" : "", dirs[i]);
    return buf;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

const char *ps_model_def_list_shipped(char *buf, size_t cap) {
    char dirs[8][PATH_MAX];
    int n = search_dirs(dirs, 8);
    char *names[256];
    int nn = 0;
    for (int i = 0; i < n; i++) {
        DIR *dp = opendir(dirs[i]);
        if (!dp) continue;
        struct dirent *e;
        while ((e = readdir(dp)) && nn < 256) {
            size_t l = strlen(e->d_name);
            if (l < 6 || strcmp(e->d_name + l - 5, ".yaml") || e->d_name[0] == '.') continue;
            char nm[256];
            snprintf(nm, sizeof nm, "%.*s", (int)(l - 5), e->d_name);
            int dup = 0;
            for (int k = 0; k < nn && !dup; k++) dup = !strcmp(names[k], nm);
            if (!dup && (names[nn] = strdup(nm))) nn++;
        }
        closedir(dp);
    }
    qsort(names, (size_t)nn, sizeof *names, cmp_str);
    size_t o = 0;
    buf[0] = 0;
    for (int k = 0; k < nn; k++) {
        if (o < cap) o += (size_t)snprintf(buf + o, cap - o, "%s%s", k ? ", " : "", names[k]);
        free(names[k]);
    }
    if (!nn) snprintf(buf, cap, "none");
    return buf;
}

ps_status ps_model_def_find_arch(const char *arch, char *path, size_t cap, ps_err *err) {
    if (!arch || !name_ok(arch, MODEL_NAME_MAX, 0, 1))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model.arch '%.80s' is not a model name (letters, digits, "
                          "'_' and '-'; a file goes in model.file)", arch ? arch : "");
    char dirs[8][PATH_MAX];
    int n = search_dirs(dirs, 8);
    for (int i = 0; i < n; i++) {
        char p[PATH_MAX + 80];
        if ((size_t)snprintf(p, sizeof p, "%s/%s.yaml", dirs[i], arch) >= sizeof p) continue;
        if (access(p, R_OK) == 0) {
            char real[PATH_MAX];
            if ((size_t)snprintf(path, cap, "%s", realpath(p, real) ? real : p) >= cap)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model file path too long: %s", p);
            return PS_OK;
        }
    }
    char sp[2048], known[1024];
    return ps_err_set(err, PS_ERR_NOT_FOUND, "model.arch: no model '%s' (no %s.yaml in %s; models there: %s; a "
                      "file of your own goes in model.file)", arch, arch, ps_model_def_search_path(sp, sizeof sp),
                      ps_model_def_list_shipped(known, sizeof known));
}

ps_model_def *ps_model_def_load(const char *arch, const char *file, ps_err *err) {
    if (file && *file) return ps_model_def_load_file(file, err);
    char path[PATH_MAX + 80];
    if (ps_model_def_find_arch(arch, path, sizeof path, err)) return NULL;
    ps_model_def *d = ps_model_def_load_file(path, err);
    if (d && strcmp(d->name, arch)) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: the file of model.arch '%s' names the model '%s'", path, arch,
                   d->name);
        ps_model_def_free(d);
        return NULL;
    }
    return d;
}

/* -------------------------------------------------------------- queries */

const ps_size_key *ps_model_def_size(const ps_model_def *def, const char *key) {
    for (int i = 0; key && i < def->nsizes; i++)
        if (!strcmp(def->sizes[i].key, key)) return &def->sizes[i];
    return NULL;
}

int ps_model_def_stage(const ps_model_def *def, const char *name) {
    for (int s = 0; name && s < def->nstages; s++)
        if (!strcmp(def->stages[s].name, name)) return s;
    return -1;
}

const char *ps_model_def_stage_list(const ps_model_def *def, char *buf, size_t size) {
    size_t o = 0;
    buf[0] = 0;
    for (int s = 0; s < def->nstages && o < size; s++)
        o += (size_t)snprintf(buf + o, size - o, "%s%s", s ? ", " : "", def->stages[s].name);
    return buf;
}

double ps_model_def_size_value(const ps_model_def *def, const char *key, int n, const char *const *keys,
                               const double *values) {
    for (int i = 0; i < n; i++)
        if (!strcmp(keys[i], key)) return values[i];
    const ps_size_key *k = ps_model_def_size(def, key);
    PS_ASSERT(k && "a size the model does not declare");
    return k->def;
}
