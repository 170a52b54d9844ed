/* lm_corpus.h - a word-level language-modelling corpus in the form
 * PyTorch's word_language_model reads (WikiText-2, Penn Treebank): a
 * directory with train.txt, valid.txt and test.txt.
 *
 * Tokens are the whitespace-separated words of each line followed by
 * "<eos>"; blank lines give just "<eos>", as the example's tokenizer does.
 * The vocabulary is built from train.txt in order of first appearance (ids
 * 0..n-1, "<eos>" among them); "<unk>" is always in it (added after the
 * training words when train.txt has none) and every word of valid.txt or
 * test.txt that train.txt lacks becomes "<unk>". WikiText-2 and PTB have
 * closed vocabularies, so for them this equals the example's dictionary
 * (same words, same ids).
 *
 * Ownership: ps_lm_corpus_load() returns a corpus that owns its words and
 * token arrays; ps_lm_corpus_free(NULL) is a no-op.
 *
 * Errors (PS_ERR_NOT_FOUND / PS_ERR_IO / PS_ERR_FORMAT, the message names
 * the file and line): a missing or unreadable file, one that is not a
 * regular file (a FIFO, /dev/zero, a directory: never read), one larger
 * than PS_LM_FILE_MAX, a NUL byte (a binary file), bytes that are not
 * UTF-8, a word longer than PS_LM_WORD_MAX bytes, a train.txt without a
 * word, a valid.txt or test.txt without a token.
 */
#ifndef PS_LM_CORPUS_H
#define PS_LM_CORPUS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PS_LM_WORD_MAX 256 /* bytes of one word */
#define PS_LM_FILE_MAX (1LL << 30) /* bytes of one corpus file (WikiText-103's train.txt is ~540 MB) */

typedef struct ps_lm_corpus ps_lm_corpus;

enum { PS_LM_TRAIN = 0, PS_LM_VALID = 1, PS_LM_TEST = 2 };

ps_status ps_lm_corpus_load(const char *dir, ps_lm_corpus **out, ps_err *err);
void ps_lm_corpus_free(ps_lm_corpus *c);

/* Vocabulary size, the id of a word (-1 when absent) and the word of an id. */
int64_t ps_lm_vocab_size(const ps_lm_corpus *c);
int64_t ps_lm_word_id(const ps_lm_corpus *c, const char *word);
const char *ps_lm_word(const ps_lm_corpus *c, int64_t id);
int64_t ps_lm_eos_id(const ps_lm_corpus *c);
int64_t ps_lm_unk_id(const ps_lm_corpus *c);

/* Split `which` (PS_LM_TRAIN..PS_LM_TEST): its token ids and their number. */
const int64_t *ps_lm_tokens(const ps_lm_corpus *c, int which, size_t *n);
/* Occurrences of each id in train.txt (vocab_size counts): the unigram model. */
const int64_t *ps_lm_train_counts(const ps_lm_corpus *c);

/* word_language_model's batchify: the first nrows*bsz tokens of ids as a
 * (nrows, bsz) row-major matrix whose column j is the j-th contiguous
 * stretch of nrows tokens, nrows = n / bsz. Returns a malloc'd array
 * (caller frees) and sets *nrows; NULL when n < bsz or out of memory. */
int64_t *ps_lm_batchify(const int64_t *ids, size_t n, int bsz, size_t *nrows);

#endif
