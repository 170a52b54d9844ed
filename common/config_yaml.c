/* config_yaml.c - the configuration as a file: the YAML loader (one
 * document, nested mappings of sections, lists for shards and rows, every
 * value through ps_config_set with file:line as its origin) and
 * ps_config_print, whose output loads back into the same values.
 * (config.h, docs/config.md) */
#include "config_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>
#include <sys/stat.h>

/* ---- YAML --------------------------------------------------------------- */

#define KEY_MAX 128

typedef struct loader {
    yaml_document_t *doc;
    const char *path;
    ps_config *c;
    ps_err *err;
} loader;

static const char *node_kind(const yaml_node_t *n) {
    switch (n->type) {
    case YAML_SCALAR_NODE: return "a single value";
    case YAML_SEQUENCE_NODE: return "a list";
    case YAML_MAPPING_NODE: return "a mapping";
    default: return "nothing";
    }
}

/* A plain (unquoted) YAML null: "", "~", "null". */
static bool is_null_scalar(const yaml_node_t *n) {
    if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return false;
    const char *v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
           !strcmp(v, "NULL");
}

/* Depth below a map-type entry's key: "servers.ps0" 1, "servers.ps0.listen" 2. */
static int depth_below(const cfg_entry *e, const char *key) {
    int d = 0;
    for (const char *p = key + strlen(e->key); *p; p++) d += *p == '.';
    return d;
}

/* A key whose YAML value may be a mapping of further keys:
 * servers.<name> and model.placement.<stage> ({shards: [...]}). */
static bool nests(const cfg_entry *e, const char *key) {
    return e && (e->type == CT_SERVERS || e->type == CT_PLACEMENT) && depth_below(e, key) == 1;
}

/* A key whose YAML value may be a sequence: model.placement.<stage>.shards
 * and model.placement.<stage>.rows. */
static bool is_list_key(const cfg_entry *e, const char *key) {
    size_t n = strlen(key);
    return e->type == CT_PLACEMENT && depth_below(e, key) == 2 &&
           ((n > 7 && !strcmp(key + n - 7, ".shards")) || (n > 5 && !strcmp(key + n - 5, ".rows")));
}

/* A sequence of single values as the comma-separated text the setter takes. */
static ps_status join_sequence(loader *L, yaml_node_t *seq, const char *key, const char *origin, char *out,
                               size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (yaml_node_item_t *it = seq->data.sequence.items.start; it < seq->data.sequence.items.top; it++) {
        yaml_node_t *n = yaml_document_get_node(L->doc, *it);
        PS_ASSERT(n);
        if (n->type != YAML_SCALAR_NODE || is_null_scalar(n))
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: %s: entry %d: expected a single value, got %s",
                              origin, key, (int)(it - seq->data.sequence.items.start) + 1,
                              n->type == YAML_SCALAR_NODE ? "nothing" : node_kind(n));
        const char *v = (const char *)n->data.scalar.value;
        if (strchr(v, ','))
            return ps_err_set(L->err, PS_ERR_INVALID_ARGUMENT, "%s: %s: entry %d '%.64s' holds a ','; "
                              "write one value per entry", origin, key,
                              (int)(it - seq->data.sequence.items.start) + 1, v);
        int w = snprintf(out + o, cap - o, "%s%s", o ? "," : "", v);
        if (w < 0 || (size_t)w >= cap - o)
            return ps_err_set(L->err, PS_ERR_INVALID_ARGUMENT, "%s: %s: too many or too long entries", origin,
                              key);
        o += (size_t)w;
    }
    return PS_OK;
}

static ps_status walk_mapping(loader *L, yaml_node_t *map, const char *prefix) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
         p++) {
        yaml_node_t *kn = yaml_document_get_node(L->doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(L->doc, p->value);
        PS_ASSERT(kn && vn);
        size_t line = kn->start_mark.line + 1;
        char origin[PS_CONFIG_PATH_MAX + 32];
        snprintf(origin, sizeof origin, "%s:%zu", L->path, line);
        if (kn->type != YAML_SCALAR_NODE)
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: a key must be a name, not %s",
                              origin, node_kind(kn));
        const char *name = (const char *)kn->data.scalar.value;
        char key[KEY_MAX];
        int kl = snprintf(key, sizeof key, "%s%s%s", prefix, *prefix ? "." : "", name);
        if (kl < 0 || (size_t)kl >= sizeof key)
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: key '%.64s...' is too long",
                              origin, name);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *qk = yaml_document_get_node(L->doc, q->key);
            if (qk->type == YAML_SCALAR_NODE && !strcmp((const char *)qk->data.scalar.value, name))
                return ps_err_set(L->err, PS_ERR_FORMAT,
                                  "%s: duplicate key '%s' (first given on line %zu)", origin,
                                  key, qk->start_mark.line + 1);
        }

        bool section = cfg_is_section(key);
        const cfg_entry *e = cfg_find_entry(key);
        if (vn->type == YAML_MAPPING_NODE && (section || nests(e, key))) {
            ps_status st = walk_mapping(L, vn, key);
            if (st != PS_OK) return st;
            continue;
        }
        if (vn->type == YAML_SEQUENCE_NODE && e && is_list_key(e, key)) {
            char joined[PS_CONFIG_MAX_SHARDS * (PS_CONFIG_NAME_MAX + PS_CONFIG_DEVICE_MAX + 2) + 64];
            ps_status st = join_sequence(L, vn, key, origin, joined, sizeof joined);
            if (st == PS_OK) st = ps_config_set(L->c, key, joined, origin, L->err);
            if (st != PS_OK) return st;
            continue;
        }
        if (!section && !e) return cfg_unknown_key(key, origin, L->err);
        if (section && !(vn->type == YAML_SCALAR_NODE && is_null_scalar(vn)))
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: %s: expected a mapping of keys, got %s",
                              origin, key, node_kind(vn));
        if (section) continue; /* "server:" with nothing under it */
        if (vn->type != YAML_SCALAR_NODE)
            return ps_err_set(L->err, PS_ERR_FORMAT, "%s: %s: expected a single value, got %s",
                              origin, key, node_kind(vn));
        if (is_null_scalar(vn))
            return ps_err_set(L->err, PS_ERR_INVALID_ARGUMENT, "%s: %s: no value given",
                              origin, key);
        ps_status st = ps_config_set(L->c, key, (const char *)vn->data.scalar.value, origin,
                                     L->err);
        if (st != PS_OK) return st;
    }
    return PS_OK;
}

static ps_status yaml_error(const yaml_parser_t *p, const char *path, ps_err *err) {
    if (p->error == YAML_MEMORY_ERROR)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory parsing YAML", path);
    if (p->error == YAML_READER_ERROR)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: byte %zu: %s", path, p->problem_offset,
                          p->problem ? p->problem : "cannot read");
    return ps_err_set(err, PS_ERR_FORMAT, "%s:%zu:%zu: YAML syntax error: %s%s%s", path,
                      p->problem_mark.line + 1, p->problem_mark.column + 1,
                      p->problem ? p->problem : "unknown problem", p->context ? " " : "",
                      p->context ? p->context : "");
}

/* A relative model.file this config file set is relative to its directory. */
static ps_status file_relative_to(ps_config *c, const char *before, const char *path, ps_err *err) {
    const char *slash = strrchr(path, '/');
    if (!c->model.file[0] || c->model.file[0] == '/' || !strcmp(before, c->model.file) || !slash) return PS_OK;
    char joined[PS_CONFIG_PATH_MAX];
    int n = snprintf(joined, sizeof joined, "%.*s/%s", (int)(slash - path), path, c->model.file);
    if (n < 0 || (size_t)n >= sizeof joined)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: model.file: '%s' relative to the config's directory "
                          "is too long", path, c->model.file);
    memset(c->model.file, 0, sizeof c->model.file);
    memcpy(c->model.file, joined, (size_t)n + 1);
    return PS_OK;
}

ps_status ps_config_load(ps_config *c, const char *path, ps_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO,
                          "%s: cannot open config: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {  /* fopen takes a directory; reading it fails */
        fclose(f);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: cannot read config: it is a directory", path);
    }
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: cannot initialise libyaml", path);
    }
    yaml_parser_set_input_file(&parser, f);

    ps_status st = PS_OK;
    yaml_document_t doc;
    char file_before[PS_CONFIG_PATH_MAX];
    memcpy(file_before, c->model.file, sizeof file_before);
    if (!yaml_parser_load(&parser, &doc)) {
        st = yaml_error(&parser, path, err);
        goto out;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        if (root->type == YAML_MAPPING_NODE) {
            loader L = {.doc = &doc, .path = path, .c = c, .err = err};
            st = walk_mapping(&L, root, "");
            if (st == PS_OK) st = file_relative_to(c, file_before, path, err);
        } else if (!(root->type == YAML_SCALAR_NODE && is_null_scalar(root))) {
            st = ps_err_set(err, PS_ERR_FORMAT,
                            "%s:%zu: expected a mapping of sections (server:, model:, ...) at "
                            "the top level, got %s", path, root->start_mark.line + 1,
                            node_kind(root));
        }
        yaml_document_delete(&doc);
        if (st != PS_OK) goto out;
        /* Exactly one document per file. */
        if (!yaml_parser_load(&parser, &doc)) {
            st = yaml_error(&parser, path, err);
            goto out;
        }
        root = yaml_document_get_root_node(&doc);
        if (root && !(root->type == YAML_SCALAR_NODE && is_null_scalar(root)))
            st = ps_err_set(err, PS_ERR_FORMAT,
                            "%s:%zu: a second YAML document; a config file holds one",
                            path, root->start_mark.line + 1);
    }
    yaml_document_delete(&doc);
out:
    yaml_parser_delete(&parser);
    fclose(f);
    return st;
}


/* ---- printing ----------------------------------------------------------- */

void cfg_print_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) fprintf(f, "\\x%02x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* Shortest %g form (6 digits at least, so 120 is not 1.2e+02) that reads
 * back as the same double. */
static void print_double(FILE *f, double x) {
    char buf[64];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    fputs(buf, f);
}

void ps_config_print(const ps_config *c, FILE *f) {
    fputs("# effective configuration (see docs/config.md)\n", f);
    const char *sect = NULL;
    size_t sect_len = 0, n;
    const cfg_entry *table = cfg_table(&n);
    for (size_t i = 0; i < n; i++) {
        const cfg_entry *e = &table[i];
        if (e->flags & F_ALIAS) continue;
        if (e->type == CT_SERVERS) { /* a top-level map: servers.<name>.<field> */
            fputs(sect ? "\n" : "", f);
            cfg_print_servers(c, f);
            sect = e->key;
            sect_len = strlen(e->key);
            continue;
        }
        const char *dot = strchr(e->key, '.');
        PS_ASSERT(dot);
        size_t sl = (size_t)(dot - e->key);
        if (!sect || sl != sect_len || strncmp(sect, e->key, sl)) {
            fprintf(f, "%s%.*s:\n", sect ? "\n" : "", (int)sl, e->key);
            sect = e->key;
            sect_len = sl;
        }
        const char *field = (const char *)c + e->off;
        fprintf(f, "  %s:", dot + 1);
        switch (e->type) {
        case CT_STRING: fputc(' ', f); cfg_print_string(f, field); break;
        case CT_INT: fprintf(f, " %d", *(const int *)field / (e->scale ? e->scale : 1)); break;
        case CT_U64: fprintf(f, " %" PRIu64, *(const uint64_t *)field); break;
        case CT_DOUBLE: fputc(' ', f); print_double(f, *(const double *)field); break;
        case CT_BOOL: fputs(*(const bool *)field ? " true" : " false", f); break;
        case CT_ENUM: {
            const char *name = ps_config_enum_name(e->key, *(const int *)field);
            fprintf(f, " %s", name ? name : "?");
            break;
        }
        case CT_PLACEMENT: cfg_print_placement(c, f); break;
        case CT_SIZE:
            if (c->model.n_sizes == 0) fputs(" {}", f);
            for (int k = 0; k < c->model.n_sizes; k++) {
                fprintf(f, "\n    %s: ", c->model.sizes[k].key);
                print_double(f, c->model.sizes[k].value);
            }
            break;
        case CT_SERVERS: PS_ASSERT(!"handled above"); break;
        }
        fputc('\n', f);
    }
}

