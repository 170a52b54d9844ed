/* config_impl.h - what the configuration's files share (config.c: the
 * table, the setter and the checks on single values; config_cluster.c: the
 * keys of servers, placements and sizes, and the checks across keys;
 * config_yaml.c: the file format, loading and printing). Not for use
 * outside common/config*.c. */
#ifndef PS_CONFIG_IMPL_H
#define PS_CONFIG_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "config.h"

#define CFG_PLACEMENT_PREFIX "model.placement."
#define CFG_SIZES_PREFIX "model.sizes."

typedef enum {
    CT_STRING,    /* char[size]; F_NONEMPTY: "" is an error */
    CT_INT,       /* int in [lo, hi] */
    CT_U64,       /* uint64_t, any value */
    CT_DOUBLE,    /* double in lo..hi, each bound open or closed */
    CT_BOOL,      /* bool */
    CT_ENUM,      /* an enum stored as int; names[i] is value i */
    CT_PLACEMENT, /* model.placement.<stage>: device */
    CT_SIZE,      /* model.sizes.<key>: a number (the model's range for key: ps_config_check_model) */
    CT_SERVERS,   /* servers.<name>.<field>: one psd of a cluster (ps_server_def) */
} cfg_type;

enum { F_NONEMPTY = 1, F_ALSO = 2, F_ALIAS = 4 /* another name of the entry before it: not printed */ };

typedef struct cfg_entry cfg_entry;
struct cfg_entry {
    const char *key;
    cfg_type type;
    size_t off, size;          /* field in ps_config */
    double lo, hi;             /* CT_INT, CT_DOUBLE */
    bool lo_open, hi_open;     /* CT_DOUBLE: bound excluded */
    const char *const *names;  /* CT_ENUM, NULL-terminated */
    const char *const *(*names_fn)(void); /* CT_ENUM: names its owning module gives */
    const char *def;           /* default, in the text form ps_config_set takes */
    unsigned flags;            /* F_NONEMPTY, F_ALSO */
    int scale;                 /* CT_INT: the field holds value * scale (0 = 1), e.g. MiB -> bytes */
    size_t also;               /* F_ALSO: a second field that takes the same value (same type) */
    const char *why;           /* CT_INT: appended to an out-of-range error */
    /* Extra check on the parsed value (after type and range checks). */
    ps_status (*check)(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
};

/* ---- config.c ---- */
/* The table, in print order (entries of one section are adjacent). */
const cfg_entry *cfg_table(size_t *n);
const char *const *cfg_entry_names(const cfg_entry *e);
/* The entry of a key (a map-type entry for "model.placement.x"), NULL when none. */
const cfg_entry *cfg_find_entry(const char *key);
/* A section is a key that has keys below it: "server", "model.placement". */
bool cfg_is_section(const char *key);
/* Entries whose keys are a section of free names ("model.placement.<stage>"). */
bool cfg_is_map_type(cfg_type t);
/* NOT_FOUND "origin: unknown key 'k' (did you mean 'x'?)" */
ps_status cfg_unknown_key(const char *key, const char *origin, ps_err *err);
/* "origin: key: message" into err; returns code. */
ps_status cfg_fail(ps_err *err, ps_status code, const char *origin, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A value for an error message: quoted, cut to 64 characters. */
const char *cfg_shown(const char *v, char *buf, size_t cap);
bool cfg_only_chars(const char *s, const char *allowed);
/* The first n characters of s are all in allowed. */
bool cfg_only_chars_n(const char *s, size_t n, const char *allowed);
/* A CT_DOUBLE entry's value, range-checked. */
ps_status cfg_parse_double(const cfg_entry *e, const char *v, const char *origin, double *out, ps_err *err);

/* ---- config_cluster.c ---- */
ps_status cfg_set_placement(ps_config *c, const cfg_entry *e, const char *key, const char *v, const char *origin,
                            ps_err *err);
ps_status cfg_set_server(ps_config *c, const char *key, const char *v, const char *origin, ps_err *err);
ps_status cfg_set_size(ps_config *c, const cfg_entry *e, const char *key, const char *v, const char *origin,
                       ps_err *err);
ps_status cfg_check_cluster_name(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
ps_status cfg_check_arch(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
/* server.address: HOST:PORT as servers.<name>.address, or unix:PATH (what a trainer can dial). */
ps_status cfg_check_dial_address(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
ps_status cfg_check_local_socket(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
/* server.stop_metric: "" or a scalar name as psd's round metrics take it. */
ps_status cfg_check_scalar_name(const cfg_entry *e, const void *val, const char *origin, ps_err *err);
void cfg_print_servers(const ps_config *c, FILE *f);
void cfg_print_placement(const ps_config *c, FILE *f);

/* ---- config_yaml.c ---- */
/* A string as a double-quoted YAML scalar. */
void cfg_print_string(FILE *f, const char *s);

#endif
