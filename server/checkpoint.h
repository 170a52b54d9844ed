/* checkpoint.h - psd's checkpoints: the model and optimizer state on disk in
 * the safetensors format, readable by PyTorch without conversion.
 *
 * A checkpoint of model version (= optimizer steps applied) N in directory D
 * is two files, each written atomically by ps_st_write (temporary file,
 * fsync, rename, fsync of D):
 *   D/ckpt-<N, 12 digits>.optim.safetensors  written first: the optimizer
 *       state (ps_ckpt_optim_write below), generic over the kinds of
 *       common/nn/optim.h: "<param>.<state name>" (F32, the parameter's
 *       shape; e.g. "fc1.weight.momentum_buffer", "fc1.weight.exp_avg")
 *       for parameters whose state exists (PyTorch creates it at the first
 *       step), "<param>.step" (I64 scalar: updates applied to it);
 *       metadata psd.optimizer (kind name), psd.optim_state (the kind's
 *       state names), psd.model_version, psd.arch, psd.crc32.
 *   D/ckpt-<N>.safetensors  written last, so its presence means the pair is
 *       complete: every parameter under its state_dict name ("conv1.weight",
 *       F32, PyTorch's shape) and every buffer ("bn1.running_mean" F32,
 *       "bn1.num_batches_tracked" I64 scalar), so
 *           model.load_state_dict(safetensors.torch.load_file(path))
 *       works as is; metadata format=pt, psd.arch, psd.model_version,
 *       psd.global_step, psd.samples, psd.time (Unix seconds), psd.version,
 *       psd.optimizer_file, psd.crc32 (CRC-32 of the tensor data in
 *       parameter order, then the buffers'); and which part of a cluster's model it is
 *       (several PS nodes, ps_ckpt_ident): psd.cluster (cluster.name),
 *       psd.server (servers.<name>; "" in the single-server form),
 *       psd.hosted (the hosted stages, comma-separated, model order) and,
 *       for a shard's table, psd.rows.<param> = "lo,hi,R" (global rows
 *       [lo, hi) of R; the tensor holds hi - lo rows). tools/ps_ckpt.c
 *       (ps-ckpt merge) joins the parts of a cluster into one state_dict.
 *       psd.params lists every parameter of the model's definition (hosted
 *       here or not): "<name>@<stage>:<d0>,<d1>,..." (":shard" for a table
 *       that may be split by rows), ';'-separated - ps-ckpt merge checks the
 *       parts' tensors against it.
 *       Written by psd (ps_ckpt_save_with with its context table), also the
 *       records of the finished contexts whose steps this snapshot holds,
 *       so a restarted psd answers a retried Step of them instead of
 *       inviting a re-run (ctx_table.h): psd.contexts_applied (decimal: the
 *       contexts whose steps reached these weights) and psd.settle (space-
 *       separated "<context id, 16 hex digits>:<version>" + "s" for a
 *       skipped step, "d" for one dropped from its sync round; oldest
 *       first, at most PS_CKPT_SETTLE_MAX). Metadata, not tensors: strict
 *       PyTorch loads and ps-ckpt merge see the same tensors as before.
 *
 * Loading validates everything (file structure, names, dtypes, shapes,
 * metadata, CRC, the sibling's version) before it changes the model, and
 * every refusal names the file and what is wrong. Restore walks the
 * checkpoints newest first and takes the first that loads; newer ones that
 * were refused are renamed to "<name>.refused" so they no longer shadow it
 * (when none loads, nothing is renamed and restore fails).
 *
 * Thread-safety: save may run while the model trains (it takes a consistent
 * snapshot); load/restore/init are for start-up, before serving.
 */
#ifndef PS_CHECKPOINT_H
#define PS_CHECKPOINT_H

#include <stdint.h>

#include "ctx_table.h"
#include "model.h"
#include "optim.h"
#include "status.h"

#define PS_CKPT_PATH_MAX 1100

/* Whose part a checkpoint is: cluster.name and servers.<name> ("" = the
 * single-server form). NULL where a function takes one = {"psd", ""}. The
 * hosted stages and shard rows come from the model. */
typedef struct ps_ckpt_ident {
    const char *cluster;
    const char *server;
} ps_ckpt_ident;

typedef struct ps_ckpt_info {
    uint64_t version;            /* model version = global step */
    uint64_t samples;            /* training samples seen when written */
    double time;                 /* Unix time written */
    char path[PS_CKPT_PATH_MAX]; /* the weights file */
} ps_ckpt_info;

/* ---- optimizer state, generic over optimizer kinds ----
 *
 * The checkpoint's view of an optimizer: host-memory copies of every
 * parameter's state, filled by the model executor under the same lock as
 * its weights snapshot (save) or applied by it after a successful read
 * (load). This is the whole interface the model side needs:
 *   save: for each parameter, name/shape, step, and state[j] pointing at a
 *         host copy of state buffer j (the kind's order, optim.h), NULL
 *         for a buffer that does not exist (e.g. no momentum);
 *   load: the same descriptors with state[j] pointing at host buffers to
 *         fill for each buffer the running optimizer needs; on success
 *         step and has_state say what to apply.
 *
 * Resume rules (ps_ckpt_optim_read):
 *  - the file's psd.optimizer must be the running kind, else
 *    PS_ERR_FAILED_PRECONDITION naming both: the state of one optimizer
 *    is never reinterpreted as another's (SGD momentum is not Adam's
 *    exp_avg). Files written before psd.optimizer existed are SGD's.
 *  - adam: a parameter with step > 0 must have exp_avg and exp_avg_sq,
 *    one with step 0 neither (a half state would not resume exactly).
 *  - sgd: a missing momentum_buffer restarts that parameter's momentum
 *    (has_state 0: PyTorch's first-step rule); buffers the running
 *    optimizer does not want (momentum 0 now) are skipped with a warning.
 *  - hyper-parameters are not part of the state: a restart may change lr.
 */
typedef struct ps_ckpt_optim_param {
    const char *name;               /* state_dict name, e.g. "fc1.weight" */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    int64_t step;                   /* save: in; load: out (0 when absent) */
    float *state[PS_OPTIM_MAX_STATE]; /* host, numel floats each, or NULL */
    int has_state;                  /* load: 1 when the file held this parameter's buffers */
} ps_ckpt_optim_param;

typedef struct ps_ckpt_optim {
    ps_optim_kind kind;
    int nparams;
    ps_ckpt_optim_param *params;
} ps_ckpt_optim;

/* Write o to path atomically (ps_st_write) with metadata psd.arch = arch
 * and psd.model_version = version. */
ps_status ps_ckpt_optim_write(const char *path, const ps_ckpt_optim *o, const char *arch, uint64_t version,
                              ps_err *err);

/* Read path into o (see the rules above). Checks everything - arch,
 * version, kind, names, dtypes, shapes, finiteness, CRC - before writing
 * into o's buffers; buffers of parameters without state are zero-filled. */
ps_status ps_ckpt_optim_read(const char *path, ps_ckpt_optim *o, const char *arch, uint64_t version,
                             ps_err *err);

/* Create dir if it does not exist (with its missing parents, mode 0750)
 * and check that it is a writable directory. */
ps_status ps_ckpt_prepare_dir(const char *dir, ps_err *err);

/* For a dir that does not exist yet: what ps_ckpt_prepare_dir would refuse,
 * leaving nothing behind - its nearest existing ancestor must be a directory
 * this user may create entries in (a read-only file system counts as not),
 * and one is created there and removed again to be sure: access() says yes
 * where mkdir still fails (root under /proc or /sys). */
ps_status ps_ckpt_check_create(const char *dir, ps_err *err);

/* For an existing dir: a file can be created in it (as the lock file and
 * checkpoints are), tried by creating one and removing it again. */
ps_status ps_ckpt_check_writable(const char *dir, ps_err *err);

/* One server per checkpoint directory: dir/psd.lock names the cluster and
 * server whose checkpoints the directory holds (and the host and pid that
 * last took it), and a running psd holds an exclusive flock on it (on a
 * network filesystem too, where its flock reaches the server; the names
 * catch another server even where it does not). ps_ckpt_lock_dir takes it
 * for id (NULL = {"psd", ""}) and keeps *fd open for the process's life:
 * FAILED_PRECONDITION when the file names another server, UNAVAILABLE when
 * a running psd holds it. ps_ckpt_check_lock makes the same checks without
 * taking it (--check-config; no lock file is fine). */
ps_status ps_ckpt_lock_dir(const char *dir, const ps_ckpt_ident *id, int *fd, ps_err *err);
ps_status ps_ckpt_check_lock(const char *dir, const ps_ckpt_ident *id, ps_err *err);
void ps_ckpt_unlock_dir(int fd);   /* -1 ok */

/* Records of finished contexts kept in a checkpoint (psd.settle, above). */
#define PS_CKPT_SETTLE_MAX (1 << 20)   /* ~36 MB of metadata at most; the newest are kept */
typedef struct ps_ckpt_settle {
    ps_ctx_finished *rec;   /* malloc'ed, oldest first */
    size_t n;
    uint64_t applied;       /* psd.contexts_applied */
    int present;            /* the checkpoint had them (written by a psd that keeps them) */
} ps_ckpt_settle;
void ps_ckpt_settle_free(ps_ckpt_settle *s);  /* NULL ok */

typedef struct ps_ckpt_save_opts {
    const ps_ckpt_ident *id;     /* NULL = {"psd", ""} */
    uint64_t samples;
    int keep;                    /* >= 1 */
    ps_ctx_table *contexts;      /* NULL: no settle records; else the snapshot is taken frozen (ctx_table.h) */
} ps_ckpt_save_opts;

/* Write a checkpoint of m's current state into dir, then delete all but the
 * keep (>= 1) newest checkpoints: weights, each parameter's optimizer step
 * and state (ps_model_snapshot, one shared weights lock: consistent) in the
 * kind of ps_model_optim(m). *out (may be NULL) describes what was
 * written. */
ps_status ps_ckpt_save(ps_model *m, const char *dir, uint64_t samples, int keep,
                       ps_ckpt_info *out, ps_err *err);
/* ps_ckpt_save with the part's identity id (NULL = {"psd", ""}). */
ps_status ps_ckpt_save_part(ps_model *m, const char *dir, const ps_ckpt_ident *id, uint64_t samples, int keep,
                            ps_ckpt_info *out, ps_err *err);
/* ps_ckpt_save with every option, the settle records among them. */
ps_status ps_ckpt_save_with(ps_model *m, const char *dir, const ps_ckpt_save_opts *o, ps_ckpt_info *out,
                            ps_err *err);

/* Load the checkpoint whose weights file is path (the optimizer sibling is
 * found from its metadata) into m: weights, each parameter's optimizer step
 * and state (ps_model_set_optim_state; the file's kind must be m's, see the
 * resume rules above), version. */
ps_status ps_ckpt_load(ps_model *m, const char *path, ps_ckpt_info *out, ps_err *err);
/* ps_ckpt_load of this psd's own part: a checkpoint whose psd.cluster or
 * psd.server differs from id's (NULL = {"psd", ""}), or whose
 * psd.rows.<param> differ from the model's shard rows, is refused
 * (FAILED_PRECONDITION naming both). A checkpoint without psd.cluster
 * (written before clusters existed) is accepted only in the single-server
 * form (id->server ""). ps_ckpt_load is ps_ckpt_load_part with NULL. */
ps_status ps_ckpt_load_part(ps_model *m, const char *path, const ps_ckpt_ident *id, ps_ckpt_info *out,
                            ps_err *err);
/* ... and its settle records into *settle (may be NULL; present = 0 when the
 * file has none; free with ps_ckpt_settle_free). Malformed records, or one
 * of a version the weights do not hold, refuse the checkpoint (FORMAT). */
ps_status ps_ckpt_load_with(ps_model *m, const char *path, const ps_ckpt_ident *id, ps_ckpt_info *out,
                            ps_ckpt_settle *settle, ps_err *err);

/* Restore the newest checkpoint in dir that loads; each refused one is
 * logged (warn) with the reason. *found = 0 and PS_OK when dir holds no
 * checkpoint; an error when it holds some but none loads (err lists why). */
ps_status ps_ckpt_restore_latest(ps_model *m, const char *dir, int *found, ps_ckpt_info *out,
                                 ps_err *err);
/* ... with ps_ckpt_load_part's identity checks. */
ps_status ps_ckpt_restore_latest_part(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found,
                                      ps_ckpt_info *out, ps_err *err);
/* ... and the restored checkpoint's settle records (ps_ckpt_load_with). */
ps_status ps_ckpt_restore_latest_with(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found,
                                      ps_ckpt_info *out, ps_ckpt_settle *settle, ps_err *err);
/* What ps_ckpt_restore_latest_with would do, changing nothing on disk (no
 * temporary files cleaned, no refused checkpoint renamed): loads into m the
 * newest checkpoint that loads (*found = 1, *refused = how many newer ones
 * were refused), or the same error when some exist and none loads. For
 * psd --check-config. */
ps_status ps_ckpt_check_restore(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found, int *refused,
                                ps_ckpt_info *out, ps_err *err);

/* Set m's weights from any safetensors file with the model's state_dict
 * names and shapes (e.g. saved from PyTorch with safetensors.torch.save_file,
 * F32 or F64): the version stays; the optimizer state restarts (as
 * ps_model_set_param: step 0, buffers zero). A missing, extra or
 * mis-shaped tensor is refused with its name. A model hosting part of a
 * cluster's model (model.h n_hosted, shard_*) takes the whole state_dict
 * too: it loads the tensors of its hosted stages (a shard: its rows of the
 * whole table) and skips, after checking their shapes, the tensors of
 * stages hosted elsewhere (logged with their count); *skipped (may be
 * NULL) receives that count. Names the model's definition lacks are still
 * refused. */
ps_status ps_ckpt_init_from_part(ps_model *m, const char *path, int *skipped, ps_err *err);
ps_status ps_ckpt_init_from(ps_model *m, const char *path, ps_err *err);

#endif
