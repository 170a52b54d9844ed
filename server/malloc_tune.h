/* malloc_tune.h - glibc malloc settings for psd's steady state.
 *
 * A training call allocates and frees the same few MB (tapes, activations,
 * decoded tensors, oneDNN buffers; buffers crossing a stage boundary leave
 * one stage's buffer pool for the other's) every batch. With glibc's
 * defaults, blocks above the (dynamic) mmap threshold are fresh mmaps and
 * the free top of each arena goes back to the kernel past the trim
 * threshold, so the next batch takes a page fault per 4 KiB page it writes
 * (~100 a batch in psd at MNIST batch 32, most of them inside oneDNN's
 * kernels). ps_malloc_tune() fixes the mmap threshold at 32 MiB and the
 * trim threshold at 64 MiB, so that working memory stays mapped while psd
 * serves; psd still hands freed memory back with malloc_trim when it has
 * been idle a while or expires contexts (ps_service_expire). When
 * GLIBC_TUNABLES names any glibc.malloc tunable, the user's settings win
 * and nothing is changed. No-op without glibc. Call it once, first thing,
 * before any thread starts.
 */
#ifndef PS_MALLOC_TUNE_H
#define PS_MALLOC_TUNE_H

/* 1 if the settings were applied, 0 if left alone (GLIBC_TUNABLES, not
 * glibc, or mallopt refused). */
int ps_malloc_tune(void);

#endif
