/* dataset.c - an array from an IDX, .npy, .npz or safetensors file, the
 * format recognised by content (dataset.h). */
#include "dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "gzfile.h"
#include "idx.h"
#include "npy.h"
#include "safetensors.h"
#include "stream.h"

typedef ps_status (*load_fn)(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err);

/* ---- IDX ----------------------------------------------------------------- */

static const struct { int idx; int dtype; } g_idx_map[] = {
    {0x08, PS_ARRAY_U8}, {0x09, PS_ARRAY_I8}, {0x0B, PS_ARRAY_I16},
    {0x0C, PS_ARRAY_I32}, {0x0D, PS_ARRAY_F32}, {0x0E, PS_ARRAY_F64},
};

static ps_status load_idx(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err) {
    (void)name;
    ps_idx x;
    ps_status st = ps_idx_load_any(path, max_bytes, &x, err);
    if (st) return st;
    out->dtype = -1;
    for (size_t i = 0; i < sizeof g_idx_map / sizeof g_idx_map[0]; i++)
        if (g_idx_map[i].idx == x.dtype) out->dtype = g_idx_map[i].dtype;
    PS_ASSERT(out->dtype >= 0); /* ps_idx_load_any takes only these */
    out->ndim = x.ndim;
    for (int i = 0; i < x.ndim; i++) out->dims[i] = x.dims[i];
    out->data = x.data;
    out->bytes = x.bytes;
    return PS_OK;
}

/* ---- npy / npz ------------------------------------------------------------ */

static ps_status load_npy(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err) {
    (void)name;
    return ps_npy_load(path, max_bytes, out, err);
}

static ps_status load_npz(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err) {
    return ps_npz_load(path, name, max_bytes, out, err);
}

/* ---- safetensors ---------------------------------------------------------- */

static const struct { int st; int dtype; } g_st_map[] = {
    {PS_ST_F32, PS_ARRAY_F32}, {PS_ST_F64, PS_ARRAY_F64}, {PS_ST_I64, PS_ARRAY_I64}, {PS_ST_I32, PS_ARRAY_I32},
    {PS_ST_I16, PS_ARRAY_I16}, {PS_ST_I8, PS_ARRAY_I8},   {PS_ST_U8, PS_ARRAY_U8},   {PS_ST_U16, PS_ARRAY_U16},
    {PS_ST_U32, PS_ARRAY_U32}, {PS_ST_U64, PS_ARRAY_U64}, {PS_ST_BOOL, PS_ARRAY_BOOL},
};

static const char *st_names(const ps_st_file *f, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (size_t i = 0; i < ps_st_count(f); i++) {
        const char *n = ps_st_get(f, i)->name;
        if (o + strlen(n) + 6 >= len) { snprintf(buf + o, len - o, "..."); break; }
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", n);
    }
    return buf;
}

static ps_status load_st(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err) {
    struct stat sb;
    if (!stat(path, &sb) && (uint64_t)sb.st_size > max_bytes + ((uint64_t)1 << 20))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: %lld bytes exceed the %zu MiB data limit "
                          "(--max-data-mb)", path, (long long)sb.st_size, max_bytes >> 20);
    ps_st_file *f = ps_st_read(path, err);
    if (!f) return err->code;
    char names[256];
    const ps_st_tensor *t = NULL;
    ps_status st = PS_OK;
    if (name) {
        if (!(t = ps_st_find(f, name)))
            st = ps_err_set(err, PS_ERR_NOT_FOUND, "%s: no tensor '%s' (tensors: %s)", path, name,
                            st_names(f, names, sizeof names));
    } else if (ps_st_count(f) != 1) {
        st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s holds %zu tensors (%s): name one as %s:NAME", path,
                        ps_st_count(f), st_names(f, names, sizeof names), path);
    } else {
        t = ps_st_get(f, 0);
    }
    if (!st && t->ndim > PS_ARRAY_MAX_DIMS)
        st = ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: tensor '%s' has %d dims (at most %d)", path, t->name, t->ndim,
                        PS_ARRAY_MAX_DIMS);
    if (!st) { /* the limit, and the rules every loader's shapes follow (array.h) */
        char what[1200];
        size_t bytes;
        snprintf(what, sizeof what, "%s: tensor '%s'", path, t->name);
        st = ps_array_check_size(t->dims, t->ndim, ps_st_dtype_size(t->dtype), max_bytes, what, &bytes, err);
    }
    if (!st) {
        out->dtype = -1;
        for (size_t i = 0; i < sizeof g_st_map / sizeof g_st_map[0]; i++)
            if (g_st_map[i].st == t->dtype) out->dtype = g_st_map[i].dtype;
        if (out->dtype < 0)
            st = ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: tensor '%s' has dtype %s, which data sets do not take", path,
                            t->name, ps_st_dtype_name(t->dtype));
    }
    if (!st && !(out->data = malloc(t->bytes ? t->bytes : 1)))
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for %zu bytes", path, t->bytes);
    if (!st) {
        out->ndim = t->ndim;
        for (int i = 0; i < t->ndim; i++) out->dims[i] = t->dims[i];
        if (t->bytes) memcpy(out->data, t->data, t->bytes);
        out->bytes = t->bytes;
    }
    ps_st_free(f);
    if (st) ps_array_free(out);
    return st;
}

/* ---- recognising the format ---------------------------------------------- */

typedef struct format_row {
    const char *name;
    int takes_name;           /* holds several arrays, picked by NAME */
    load_fn load;
} format_row;

static const format_row g_formats[] = {
    {"IDX", 0, load_idx},
    {"npy", 0, load_npy},
    {"npz", 1, load_npz},
    {"safetensors", 1, load_st},
};
enum { F_IDX, F_NPY, F_NPZ, F_ST };
/* A safetensors file starts with its header's length, then '{': a length
 * under this tells it from an IDX file whose first data byte is '{' (an
 * IDX length reads as at least 2^32). */
#define ST_SNIFF_MAX_HEADER ((uint64_t)100 << 20)

/* The format of path from its first bytes; -1 with err set. A FIFO or
 * other stream is refused (reading its start would consume it; ps_data_load
 * reads streams into memory first) and never waited on. */
static int sniff(const char *path, ps_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "rb");
    if (!f) {
        ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb)) {
        ps_err_set(err, PS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        fclose(f);
        return -1;
    }
    if (S_ISDIR(sb.st_mode)) {
        fclose(f);
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: a directory, not a data file", path);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        fclose(f);
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: not a regular file (a pipe, FIFO or device): its format can "
                   "only be told by reading it", path);
        return -1;
    }
    unsigned char raw[16] = {0};
    size_t nraw = fread(raw, 1, sizeof raw, f);
    fclose(f);
    /* a zip's first member, or the end record of one without members */
    if (nraw >= 4 && (!memcmp(raw, "PK\x03\x04", 4) || !memcmp(raw, "PK\x05\x06", 4))) return F_NPZ;
    if (nraw >= 9 && raw[8] == '{') {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
        if (hl >= 2 && hl < ST_SNIFF_MAX_HEADER) return F_ST;
    }
    /* IDX and .npy, raw or gzip'ed: look at the decompressed start. */
    unsigned char b[8] = {0};
    int nb = 0;
    gzFile gz = gzopen(path, "rb");
    if (gz) {
        nb = gzread(gz, b, sizeof b);
        if (nb < (int)sizeof b && nraw >= 2 && raw[0] == 0x1f && raw[1] == 0x8b) {
            /* zlib inflates a small file whole before answering: a corrupt
             * or cut stream gives no bytes at all, so say that, not "not a
             * data file" */
            int zerr;
            const char *zmsg = gzerror(gz, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END) {
                ps_err_set(err, PS_ERR_FORMAT, "%s: a gzip file that does not decompress (zlib: %s): corrupt or "
                           "truncated", path, ps_gz_strip_path(path, zmsg));
                gzclose(gz);
                return -1;
            }
        }
        gzclose(gz);
    }
    if (nb >= 6 && !memcmp(b, "\x93NUMPY", 6)) return F_NPY;
    if (nb >= 4 && b[0] == 0 && b[1] == 0 && ps_idx_dtype_size(b[2]) && b[3] >= 1) return F_IDX;
    char hex[64] = "", hint[128] = "";
    for (size_t i = 0, o = 0; i < nraw && i < 8; i++) o += (size_t)snprintf(hex + o, sizeof hex - o, " %02x", raw[i]);
    if (nraw >= 9 && raw[8] == '{') {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | raw[i];
        snprintf(hint, sizeof hint, " (a safetensors header of %llu bytes? at most %llu MiB are read)",
                 (unsigned long long)hl, (unsigned long long)(ST_SNIFF_MAX_HEADER >> 20));
    } else if (nb >= 4 && b[0] == 0 && b[1] == 0) {
        snprintf(hint, sizeof hint, " (an IDX magic with an unknown type or 0 dims?)");
    }
    ps_err_set(err, PS_ERR_FORMAT, "%s: not a data file ps-train reads (IDX, .npy, .npz or safetensors; raw IDX and "
               ".npy may be gzip'ed): it starts with%s%s", path, nraw ? hex : " nothing (empty file)", hint);
    return -1;
}

const char *ps_data_format(const char *path, ps_err *err) {
    int f = sniff(path, err);
    return f < 0 ? NULL : g_formats[f].name;
}

/* ---- streams: pipes, FIFOs, /dev/stdin ------------------------------------ */

ps_status ps_data_load(const char *spec, size_t max_bytes, ps_array *out, ps_err *err) {
    return ps_data_load_wait(spec, max_bytes, PS_DATA_STREAM_WAIT_MS, out, err);
}

static ps_status load_path(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err);

typedef struct load_args {
    const char *name;
    size_t max_bytes;
    ps_array *out;
} load_args;

static ps_status load_path_cb(const char *path, void *arg, ps_err *err) {
    load_args *a = arg;
    return load_path(path, a->name, a->max_bytes, a->out, err);
}

ps_status ps_data_load_wait(const char *spec, size_t max_bytes, int wait_ms, ps_array *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    char path[1024];
    const char *name = NULL;
    struct stat sb;
    if (strlen(spec) >= sizeof path) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "data path too long: %.64s...", spec);
    snprintf(path, sizeof path, "%s", spec);
    /* The whole spec when a file has that name (run-12:00.npy), else
     * FILE:NAME split at the last ':' (data:v2.npz:x_train); when neither
     * names a file, say both readings. */
    if (stat(spec, &sb) && (errno == ENOENT || errno == ENOTDIR)) {
        char *colon = strrchr(path, ':');
        if (colon && colon != path && colon[1]) {
            *colon = 0;
            name = colon + 1;
            if (stat(path, &sb) && (errno == ENOENT || errno == ENOTDIR))
                return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: no such file, and read as FILE:NAME (split at the last "
                                  "':') neither is %s, the file to take '%s' from", spec, path, name);
        }
    }
    /* A pipe (<(zcat x.npy.gz)), FIFO, socket or device: read once, whole,
     * into memory within the limit, then loaded as a file would be. */
    size_t limit = max_bytes > SIZE_MAX - PS_DATA_STREAM_SLACK ? SIZE_MAX : max_bytes + PS_DATA_STREAM_SLACK;
    load_args a = {name, max_bytes, out};
    return ps_stream_load(path, limit, wait_ms, load_path_cb, &a, err);
}

/* A regular file (or directory, refused by sniff). */
static ps_status load_path(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err) {
    int f = sniff(path, err);
    if (f < 0) return err->code;
    if (name && !g_formats[f].takes_name)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s is an %s file holding one array: ':%s' names nothing in it",
                          path, g_formats[f].name, name);
    ps_status st = g_formats[f].load(path, name, max_bytes, out, err);
    if (st) ps_array_free(out);
    return st;
}
