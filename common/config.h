/* config.h - the cluster configuration: one YAML file per cluster, plus
 * command-line overrides.
 *
 * Every key lives in ONE declarative table in config.c (key, type, range,
 * default, field); docs/config.md describes the same keys. A key's field is
 * in the options struct of the module that uses it (server.sync_workers in
 * consistency's ps_cons_opts, server.recv_timeout_s in the rpc server's
 * ps_rpc_server_opts, optimizer.* in optim.h's ps_optim_spec, ...): those
 * structs are members of ps_config, filled by the table, and handed to
 * their modules as they are. psd's modules' structs are defined in
 * common/server_opts.h, so this header (and ps-train, which uses it)
 * depends on nothing in server/. Enum keys take their names from the owning
 * module's list. Both the YAML
 * loader and command-line flags go through ps_config_set, so a value is
 * checked the same way wherever it comes from, and every error names where
 * it came from, the key and the value:
 *     configs/x.yaml:7: optimizer.lr: '-1' is out of range (0, 100]
 *     command line: server.threads: 'four' is not an integer
 *
 * Keys are dotted paths ("server.listen"); in YAML they are nested
 * mappings (server: {listen: ...}). Unknown keys, a mapping where a value
 * is expected, a value where a mapping is expected and duplicate keys are
 * errors; so is a second YAML document in the file. Numbers are parsed
 * strictly (the whole value must be a finite decimal number); booleans
 * accept true/false, yes/no, on/off (also Capitalised or UPPER case, as
 * YAML 1.1).
 *
 * model.placement.<stage> maps a model stage to a device ("cpu" or
 * "cuda:N", N in 0..63). Setting a stage that is already present replaces
 * its device; a new stage is appended (up to PS_CONFIG_MAX_STAGES), so a
 * stage not named runs on "cpu". model.sizes.<key> sets one of the model's
 * sizes (e.g. model.sizes.ntoken for rnn_lm). model.arch names a shipped
 * model file, model.file a model file of one's own (docs/models.md). Stage
 * and size names and ranges against the chosen model are checked by
 * ps_config_check_model (after every override), and again by the model
 * itself.
 *
 * Setting a string clears the rest of its buffer, so two configs built from
 * the defaults by the same settings compare equal with memcmp.
 *
 * ps_config is a plain value: no allocation, copy it freely.
 */
#ifndef PS_CONFIG_H
#define PS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "log.h"
#include "optim.h"
#include "server_opts.h"
#include "status.h"

#define PS_CONFIG_ADDR_MAX 256   /* buffer size for addresses, incl. NUL */
#define PS_CONFIG_PATH_MAX 1024  /* buffer size for paths, incl. NUL */
#define PS_CONFIG_STAGE_MAX 32   /* buffer size for a stage name, incl. NUL */
#define PS_CONFIG_DEVICE_MAX 16  /* buffer size for a device, incl. NUL */
#define PS_CONFIG_MAX_STAGES 8
#define PS_CONFIG_MAX_SIZES 8
#define PS_CONFIG_SIZE_KEY_MAX 32 /* buffer size for a size key, incl. NUL */
#define PS_CONFIG_NAME_MAX 32     /* buffer size for a server or cluster name, incl. NUL */
#define PS_CONFIG_MAX_SERVERS 8   /* servers.<name> entries */
#define PS_CONFIG_MAX_SHARDS 8    /* model.placement.<stage>.shards entries */


/* model.placement.<stage>: "DEVICE", "SERVER/DEVICE" or "SERVER" (device
 * cpu), or model.placement.<stage>.shards: a list of "SERVER[/DEVICE]"
 * (YAML sequence, or comma-separated in one string from --set) that splits
 * the stage's embedding table into contiguous row ranges, shard k holding
 * rows [rows*k/n, rows*(k+1)/n) (common/placement.h) - or, with
 * model.placement.<stage>.rows: [B1, ..., B(n-1)] (the inner boundaries,
 * strictly increasing, each in 1..R-1), rows [B_k, B_{k+1}) with B_0 = 0 and
 * B_n = R. Setting .shards keeps .rows; setting the stage itself (a device
 * or SERVER/DEVICE) replaces both; an empty .rows means the equal split.
 * The count (n-1) and the range (R) are checked when the placement is
 * resolved (ps_placement_build), since the keys may come in either order. */
typedef struct ps_stage_placement {
    char stage[PS_CONFIG_STAGE_MAX];   /* e.g. "conv" */
    char device[PS_CONFIG_DEVICE_MAX]; /* "cpu" or "cuda:N" (unsharded) */
    char server[PS_CONFIG_NAME_MAX];   /* "" = the single-server form (no servers.*) */
    int n_shards;                      /* 0 = not sharded */
    char shard_server[PS_CONFIG_MAX_SHARDS][PS_CONFIG_NAME_MAX];
    char shard_device[PS_CONFIG_MAX_SHARDS][PS_CONFIG_DEVICE_MAX];
    int n_rows;                        /* entries of rows[]; 0 = the equal split */
    int64_t rows[PS_CONFIG_MAX_SHARDS - 1]; /* inner boundaries, strictly increasing, >= 1 */
} ps_stage_placement;

/* servers.<name>: one psd of a cluster with several PS nodes. psd --name
 * <name> hosts the stages placed on it (ps_config_select_server copies this
 * entry over server.listen/address/metrics_listen/checkpoint_dir and
 * security.cert/key). */
typedef struct ps_server_def {
    char name[PS_CONFIG_NAME_MAX];          /* "ps0": letters, digits, '_' or '-' */
    char address[PS_CONFIG_ADDR_MAX];       /* where trainers dial it (required) */
    char listen[PS_CONFIG_ADDR_MAX];        /* where it binds; "" = address */
    char cert[PS_CONFIG_PATH_MAX];          /* TLS certificate chain; "" = security.cert */
    char key[PS_CONFIG_PATH_MAX];           /* TLS private key; "" = security.key */
    char server_name[PS_CONFIG_ADDR_MAX];   /* name trainers expect in its cert; "" = security.server_name */
    char metrics_listen[PS_CONFIG_ADDR_MAX];/* "" = server.metrics_listen */
    char checkpoint_dir[PS_CONFIG_PATH_MAX];/* "" = server.checkpoint_dir/<name> (or none) */
} ps_server_def;

typedef struct ps_model_size {
    char key[PS_CONFIG_SIZE_KEY_MAX];  /* e.g. "ntoken" */
    double value;
} ps_model_size;

typedef struct ps_config {
    struct {
        char name[PS_CONFIG_NAME_MAX];    /* cluster.name: written into every checkpoint part */
    } cluster;
    int n_servers;                        /* 0 = the single-server form */
    ps_server_def servers[PS_CONFIG_MAX_SERVERS];
    int self;                             /* psd --name: index into servers[]; -1 = none */
    struct {
        /* psd's own */
        char listen[PS_CONFIG_ADDR_MAX];  /* address psd binds, host:port */
        char address[PS_CONFIG_ADDR_MAX]; /* address trainers dial */
        int compute_threads;              /* 0..256, 0 = auto */
        bool pin_compute;                 /* a one-thread call holds a CPU while it computes */
        ps_log_level log_level;
        char log_file[PS_CONFIG_PATH_MAX];       /* "" = stderr */
        double grace_s;                   /* drain time for in-flight calls on stop */
        char metrics_listen[PS_CONFIG_ADDR_MAX]; /* "" = no metrics endpoint */
        bool metrics_tls;                 /* HTTPS on metrics_listen with security.cert/key */
        /* the modules' own (their headers say which key is which field) */
        ps_rpc_server_opts rpc;           /* threads, call limits, timeouts, message size */
        ps_service_opts service;          /* contexts, non-finite policy, consistency, round metrics */
        ps_ckpt_opts checkpoint;          /* server.checkpoint_* (server_opts.h) */
    } server;
    struct {
        char arch[PS_CONFIG_NAME_MAX * 2]; /* model.arch (alias model.name): a shipped model file */
        char file[PS_CONFIG_PATH_MAX];    /* model.file: a model file; "" = model.arch's */
        uint64_t seed;                    /* weight initialisation */
        bool snapshot_steps;              /* steps publish a copy of the weights (model.h) */
        int backend;                      /* index in ps_backend_cpu_names() */
        int n_placement;                  /* entries used in placement[] */
        ps_stage_placement placement[PS_CONFIG_MAX_STAGES];
        int n_sizes;                      /* entries used in sizes[] */
        ps_model_size sizes[PS_CONFIG_MAX_SIZES]; /* the rest take the model file's defaults */
    } model;
    ps_optim_spec optimizer;              /* optimizer.* (optim.h) */
    struct {
        int world_size;                   /* the PS plus the trainers */
        int batch_size;
        int epochs;
        char data[PS_CONFIG_PATH_MAX];    /* directory of the IDX files */
        int log_every;                    /* batches between log lines */
        double progress_every_s;          /* not on a terminal: seconds between progress lines; 0 = none */
        uint64_t seed;                    /* data shuffling */
        double rpc_timeout_s;
        bool check_gradients;
        double retry_max_s;               /* retry budget per batch; 0 = none */
        double retry_backoff_s;           /* first backoff */
        double retry_backoff_max_s;       /* backoff cap */
    } trainer;
    struct {
        bool tls;                         /* TLS on the gRPC port */
        char cert[PS_CONFIG_PATH_MAX];    /* psd: PEM certificate chain */
        char key[PS_CONFIG_PATH_MAX];     /* psd: PEM private key */
        char ca[PS_CONFIG_PATH_MAX];      /* trainer: CA of psd's cert; psd: CA of client certs */
        bool mutual_tls;                  /* psd requires client certificates */
        char client_cert[PS_CONFIG_PATH_MAX]; /* trainer: its certificate (mutual TLS) */
        char client_key[PS_CONFIG_PATH_MAX];  /* trainer: its key (mutual TLS) */
        char server_name[PS_CONFIG_ADDR_MAX]; /* trainer: name expected in psd's cert */
        char tokens_file[PS_CONFIG_PATH_MAX]; /* psd: "name role token" lines */
        char token_file[PS_CONFIG_PATH_MAX];  /* trainer: its bearer token */
        bool allow_insecure;              /* plaintext beyond loopback */
    } security;
} ps_config;

/* Check model.placement.<stage> and model.sizes.<key> against the stages
 * and sizes (names and ranges) of the model file model.file, or model.arch's
 * shipped one (common/nn/modeldef.h). Call once every override is applied;
 * INVALID_ARGUMENT naming the key and what the model has; the model file's
 * own errors name file:line. */
ps_status ps_config_check_model(const ps_config *c, ps_err *err);

/* The model file the config names, loaded (free with ps_model_def_free);
 * NULL with the error, prefixed by ps_config_model_origin(c, NULL). */
struct ps_model_def *ps_config_load_model(const ps_config *c, ps_err *err);

/* What led to the model file, the prefix of every model-file error (its
 * parse, the shapes and dtypes psd infers, an init file checked against
 * it), so that psd, --check-config and ps-train print them alike:
 * "WHERE: model.file" (or model.arch when no model.file is set); where is
 * the config file (or "command line"), NULL for the key alone. The error
 * then goes on "MODEL-FILE:LINE: node 'NAME' (KIND): ...". Returns buf. */
const char *ps_config_model_origin(const ps_config *c, const char *where, char *buf, size_t cap);

/* A cluster (n_servers > 0): everything --check-config checks beyond
 * single keys - every stage of the model placed exactly once (on a named
 * server, or sharded), every server named in a placement defined, shards
 * only for embedding stages and no more shards than rows, addresses (and
 * listen addresses) distinct, consistency sync/ssp refused when the stages
 * span more than one server. Calls ps_config_check_model. Also for the
 * single-server form: a server's metrics port is not its gRPC port, and
 * trainer.retry_backoff_s is at most trainer.retry_backoff_max_s.
 * INVALID_ARGUMENT naming the key. */
ps_status ps_config_check_cluster(const ps_config *c, ps_err *err);

/* psd --name NAME: make servers.<NAME> this process's server (c->self) and
 * copy its address, listen, cert, key, metrics_listen and checkpoint_dir
 * over server.* / security.* (checkpoint_dir defaulting to
 * server.checkpoint_dir/NAME). INVALID_ARGUMENT when NAME is not a server of
 * the config (listing them), or when the config has no servers. */
ps_status ps_config_select_server(ps_config *c, const char *name, ps_err *err);

/* Fill every field with its default (the table's). */
void ps_config_defaults(ps_config *c);

/* Set one key from its text form. key is dotted ("server.listen",
 * "model.placement.conv"); origin says where the value came from and
 * starts every error message ("command line", "configs/local.yaml:12").
 * On error the config is unchanged. */
ps_status ps_config_set(ps_config *c, const char *key, const char *value, const char *origin,
                        ps_err *err);

/* Apply the YAML file at path on top of *c (call ps_config_defaults first).
 * Stops at the first error; *c may then hold some of the file's values. */
ps_status ps_config_load(ps_config *c, const char *path, ps_err *err);

/* Write the effective configuration as YAML that ps_config_load reads
 * back to the same values. */
void ps_config_print(const ps_config *c, FILE *f);

/* Name of an enum field's value, e.g. ps_config_enum_name("model.backend",
 * c.model.backend) == "dnnl"; NULL for a key that is not an enum or a value
 * out of range. */
const char *ps_config_enum_name(const char *key, int value);

/* Checked numbers, by the config's own rules (what a flag takes goes
 * through these too): the whole text a decimal number, finite, in [lo, hi]
 * (ps_parse_double: a bound in open is excluded). what names the value in
 * the message: INVALID_ARGUMENT "WHAT: '12x' is not an integer", "WHAT:
 * '0' is out of range [1, 1000]". */
#define PS_PARSE_OPEN_LO 1u
#define PS_PARSE_OPEN_HI 2u
ps_status ps_parse_long(const char *what, const char *text, long lo, long hi, long *out, ps_err *err);
ps_status ps_parse_double(const char *what, const char *text, double lo, double hi, unsigned open, double *out,
                          ps_err *err);

/* Split "HOST:PORT" as server.metrics_listen takes it: HOST is an IPv4
 * literal, an IPv6 literal in brackets or "localhost" (-> 127.0.0.1); PORT
 * is 1..65535. Writes the numeric host (no brackets) and the port; returns
 * false when v is not of that form. */
bool ps_config_parse_hostport(const char *v, char *host, size_t host_cap, int *port);

#endif
