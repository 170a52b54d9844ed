/* checkpoint.h - psd's checkpoints: the model and optimizer state on disk in
 * the safetensors format, readable by PyTorch without conversion.
 *
 * A checkpoint of model version (= optimizer steps applied) N in directory D
 * is two files, each written atomically by ps_st_write (temporary file,
 * fsync, rename, fsync of D):
 *   D/ckpt-<N, 12 digits>.optim.safetensors  written first: the SGD momentum
 *       buffers as "<param>.momentum_buffer" (F32, the parameter's shape),
 *       only for parameters whose buffer exists (PyTorch creates it at the
 *       first step); metadata psd.model_version, psd.arch, psd.crc32.
 *   D/ckpt-<N>.safetensors  written last, so its presence means the pair is
 *       complete: every parameter under its state_dict name ("conv1.weight",
 *       F32, PyTorch's shape), so
 *           model.load_state_dict(safetensors.torch.load_file(path))
 *       works as is; metadata format=pt, psd.arch, psd.model_version,
 *       psd.global_step, psd.samples, psd.time (Unix seconds), psd.version,
 *       psd.optimizer_file, psd.crc32 (CRC-32 of the tensor data in
 *       parameter order).
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

#include "model.h"
#include "status.h"

#define PS_CKPT_PATH_MAX 1100

typedef struct ps_ckpt_info {
    uint64_t version;            /* model version = global step */
    uint64_t samples;            /* training samples seen when written */
    double time;                 /* Unix time written */
    char path[PS_CKPT_PATH_MAX]; /* the weights file */
} ps_ckpt_info;

/* Create dir if it does not exist (one level, mode 0750) and check that it
 * is a writable directory. */
ps_status ps_ckpt_prepare_dir(const char *dir, ps_err *err);

/* Write a checkpoint of m's current state into dir, then delete all but the
 * keep (>= 1) newest checkpoints. *out (may be NULL) describes what was
 * written. */
ps_status ps_ckpt_save(ps_model *m, const char *dir, uint64_t samples, int keep,
                       ps_ckpt_info *out, ps_err *err);

/* Load the checkpoint whose weights file is path (the optimizer sibling is
 * found from its metadata) into m: weights, momentum buffers, version. */
ps_status ps_ckpt_load(ps_model *m, const char *path, ps_ckpt_info *out, ps_err *err);

/* Restore the newest checkpoint in dir that loads; each refused one is
 * logged (warn) with the reason. *found = 0 and PS_OK when dir holds no
 * checkpoint; an error when it holds some but none loads (err lists why). */
ps_status ps_ckpt_restore_latest(ps_model *m, const char *dir, int *found, ps_ckpt_info *out,
                                 ps_err *err);

/* Set m's weights from any safetensors file with the model's state_dict
 * names and shapes (e.g. saved from PyTorch with safetensors.torch.save_file,
 * F32 or F64): version and momentum stay as they are. A missing, extra or
 * mis-shaped tensor is refused with its name. */
ps_status ps_ckpt_init_from(ps_model *m, const char *path, ps_err *err);

#endif
