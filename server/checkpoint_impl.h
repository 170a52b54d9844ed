/* checkpoint_impl.h - what psd's checkpoint files share, private to them:
 * checkpoint.c (save, load, init-from), checkpoint_dir.c (the directory: its
 * lock, names, retention, the newest good checkpoint), checkpoint_optim.c
 * (the optimizer state file) and checkpoint_settle.c (psd.settle). */
#ifndef PS_CHECKPOINT_IMPL_H
#define PS_CHECKPOINT_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#include "checkpoint.h"
#include "safetensors.h"

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"
#define OPTIM_SUFFIX ".optim.safetensors"

/* checkpoint_dir.c: buf = dir/ckpt-<version, at least 12 digits><suffix>. */
void ckpt_file_path(char *buf, size_t cap, const char *dir, uint64_t version, const char *suffix);
/* checkpoint_dir.c: delete all but the keep newest checkpoints, and
 * optimizer files older than the oldest one kept that lost their weights
 * file. */
void ckpt_retain(const char *dir, int keep);

/* checkpoint_settle.c: psd.settle's text of n records (malloc'ed, NULL when
 * out of memory), and the records of such a text (strictly that format;
 * every version <= max_version; at most PS_CKPT_SETTLE_MAX records). */
char *ckpt_settle_encode(const ps_ctx_finished *r, size_t n);
ps_status ckpt_settle_decode(const char *path, const char *s, uint64_t max_version, ps_ckpt_settle *out,
                             ps_err *err);

/* checkpoint.c: a strict decimal uint64 from a metadata value (-1 if not);
 * tensor t must be parameter pi (dtype F32, or F64 when allow_f64; shape;
 * finite values); crc32 over any length. */
int ckpt_parse_u64(const char *s, uint64_t *out);
ps_status ckpt_check_tensor(const char *path, const ps_st_tensor *t, const ps_param_info *pi, int allow_f64,
                            ps_err *err);
uLong ckpt_crc_bytes(uLong crc, const void *data, size_t left);

#endif
