/* zip.c - members of a zip archive, stored or deflated (zip.h): what numpy's
 * savez and savez_compressed write. */
#include "zip.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define END_LEN 22
#define LOC64_LEN 20
#define END64_LEN 56
#define CENTRAL_LEN 46
#define LOCAL_LEN 30
#define MAX_MEMBERS 65536
#define DEFLATE_MAX_RATIO 1032

typedef struct zip_entry {
    char *name;
    int method, flags;
    uint32_t crc;
    uint64_t csize, usize, offset;
} zip_entry;

struct ps_zip {
    char path[512];
    unsigned char *buf;
    size_t len;
    zip_entry *e;
    int n;
};

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static ps_status bad(const ps_zip *z, ps_err *err, const char *what) {
    return ps_err_set(err, PS_ERR_FORMAT, "%s: not a valid zip archive (.npz): %s", z->path, what);
}

/* The method's name for messages. */
static const char *method_name(int m) {
    static const struct { int m; const char *name; } t[] = {
        {0, "stored"}, {8, "deflate"}, {9, "deflate64"}, {12, "bzip2"}, {14, "lzma"}, {93, "zstd"}, {95, "xz"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (t[i].m == m) return t[i].name;
    return "unknown";
}

/* Read the whole file. */
static ps_status read_file(ps_zip *z, size_t max_bytes, ps_err *err) {
    FILE *f = fopen(z->path, "rb");
    if (!f)
        return ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", z->path,
                          strerror(errno));
    struct stat sb;
    ps_status st = PS_OK;
    if (fstat(fileno(f), &sb) || !S_ISREG(sb.st_mode)) {
        st = ps_err_set(err, PS_ERR_IO, "%s: not a regular file", z->path);
    } else if ((uint64_t)sb.st_size > max_bytes) {
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: %lld bytes exceed the %zu MiB data limit "
                        "(--max-data-mb)", z->path, (long long)sb.st_size, max_bytes >> 20);
    } else if (!(z->buf = malloc(sb.st_size ? (size_t)sb.st_size : 1))) {
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for %lld bytes", z->path,
                        (long long)sb.st_size);
    } else {
        z->len = fread(z->buf, 1, (size_t)sb.st_size, f);
        if (z->len != (size_t)sb.st_size)
            st = ps_err_set(err, PS_ERR_IO, "%s: read %zu of %lld bytes", z->path, z->len, (long long)sb.st_size);
    }
    fclose(f);
    return st;
}

/* The zip64 extra field's values for the saturated fields, in order. */
static ps_status zip64_extra(ps_zip *z, const unsigned char *x, size_t xlen, zip_entry *e, int need_u, int need_c,
                             int need_o, ps_err *err) {
    size_t i = 0;
    while (i + 4 <= xlen) {
        unsigned id = rd16(x + i), sz = rd16(x + i + 2);
        if (i + 4 + sz > xlen) break;
        if (id == 1) {
            const unsigned char *p = x + i + 4;
            size_t need = 8u * (size_t)(need_u + need_c + need_o);
            if (sz < need) return bad(z, err, "zip64 extra field too short");
            if (need_u) e->usize = rd64(p), p += 8;
            if (need_c) e->csize = rd64(p), p += 8;
            if (need_o) e->offset = rd64(p);
            return PS_OK;
        }
        i += 4 + sz;
    }
    return need_u || need_c || need_o ? bad(z, err, "a saturated size or offset without its zip64 extra field") : PS_OK;
}

static ps_status read_directory(ps_zip *z, ps_err *err) {
    if (z->len < END_LEN) return bad(z, err, "shorter than an end-of-central-directory record");
    size_t end = SIZE_MAX;
    size_t lo = z->len > END_LEN + 65535 ? z->len - END_LEN - 65535 : 0;
    for (size_t i = z->len - END_LEN + 1; i-- > lo;)
        if (rd32(z->buf + i) == SIG_END && i + END_LEN + rd16(z->buf + i + 20) == z->len) { end = i; break; }
    if (end == SIZE_MAX) return bad(z, err, "no end-of-central-directory record");
    const unsigned char *p = z->buf + end;
    uint64_t entries = rd16(p + 10), cd_size = rd32(p + 12), cd_off = rd32(p + 16);
    if (rd16(p + 4) || rd16(p + 6)) return bad(z, err, "multi-disk archives are not supported");
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        if (end < LOC64_LEN || rd32(z->buf + end - LOC64_LEN) != SIG_LOC64)
            return bad(z, err, "saturated end record without a zip64 locator");
        uint64_t off64 = rd64(z->buf + end - LOC64_LEN + 8);
        /* the zip64 end record lies whole before the locator (a file shorter
         * than it leaves no room: z->len - END64_LEN would wrap) */
        if (end - LOC64_LEN < END64_LEN || off64 > end - LOC64_LEN - END64_LEN || rd32(z->buf + off64) != SIG_END64)
            return bad(z, err, "no zip64 end record where its locator points");
        const unsigned char *q = z->buf + off64;
        entries = rd64(q + 32);
        cd_size = rd64(q + 40);
        cd_off = rd64(q + 48);
    }
    if (cd_off > z->len || cd_size > z->len - cd_off) return bad(z, err, "central directory outside the file");
    if (entries > MAX_MEMBERS) return bad(z, err, "more than 65536 members");
    z->e = calloc(entries ? entries : 1, sizeof *z->e);
    if (!z->e) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", z->path);
    size_t o = (size_t)cd_off, cd_end = (size_t)(cd_off + cd_size);
    for (uint64_t k = 0; k < entries; k++) {
        if (o + CENTRAL_LEN > cd_end || rd32(z->buf + o) != SIG_CENTRAL) return bad(z, err, "truncated central directory");
        const unsigned char *c = z->buf + o;
        size_t nl = rd16(c + 28), xl = rd16(c + 30), cl = rd16(c + 32);
        if (o + CENTRAL_LEN + nl + xl + cl > cd_end) return bad(z, err, "central directory entry overruns it");
        zip_entry *e = &z->e[z->n];
        e->flags = rd16(c + 8);
        e->method = rd16(c + 10);
        e->crc = rd32(c + 16);
        e->csize = rd32(c + 20);
        e->usize = rd32(c + 24);
        e->offset = rd32(c + 42);
        if (!(e->name = malloc(nl + 1))) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", z->path);
        memcpy(e->name, c + CENTRAL_LEN, nl);
        e->name[nl] = 0;
        z->n++;
        ps_status st = zip64_extra(z, c + CENTRAL_LEN + nl, xl, e, e->usize == 0xFFFFFFFFu, e->csize == 0xFFFFFFFFu,
                                   e->offset == 0xFFFFFFFFu, err);
        if (st) return st;
        o += CENTRAL_LEN + nl + xl + cl;
    }
    return PS_OK;
}

ps_status ps_zip_open(const char *path, size_t max_bytes, ps_zip **out, ps_err *err) {
    *out = NULL;
    ps_zip *z = calloc(1, sizeof *z);
    if (!z) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    snprintf(z->path, sizeof z->path, "%s", path);
    ps_status st = read_file(z, max_bytes, err);
    if (!st) st = read_directory(z, err);
    if (st) {
        ps_zip_free(z);
        return st;
    }
    *out = z;
    return PS_OK;
}

void ps_zip_free(ps_zip *z) {
    if (!z) return;
    for (int i = 0; i < z->n; i++) free(z->e[i].name);
    free(z->e);
    free(z->buf);
    free(z);
}

int ps_zip_count(const ps_zip *z) { return z->n; }
const char *ps_zip_name(const ps_zip *z, int i) { return i >= 0 && i < z->n ? z->e[i].name : NULL; }

const char *ps_zip_names(const ps_zip *z, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < z->n; i++) {
        size_t need = strlen(z->e[i].name) + 2;
        if (o + need + 4 >= len) {
            snprintf(buf + o, len - o, "...");
            break;
        }
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", z->e[i].name);
    }
    return buf;
}

/* Raw deflate of src into exactly usize bytes of dst. */
static ps_status inflate_all(const ps_zip *z, const zip_entry *e, const unsigned char *src, unsigned char *dst,
                             ps_err *err) {
    z_stream s;
    memset(&s, 0, sizeof s);
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK)
        return ps_err_set(err, PS_ERR_INTERNAL, "%s: zlib inflateInit2 failed", z->path);
    uint64_t in_left = e->csize, out_left = e->usize;
    s.next_in = (unsigned char *)src;
    s.next_out = dst;
    int r;
    for (;;) {
        if (!s.avail_in && in_left) {
            s.avail_in = in_left > (1u << 30) ? 1u << 30 : (uInt)in_left;
            in_left -= s.avail_in;
        }
        if (!s.avail_out && out_left) {
            s.avail_out = out_left > (1u << 30) ? 1u << 30 : (uInt)out_left;
            out_left -= s.avail_out;
        }
        r = inflate(&s, Z_NO_FLUSH);
        if (r != Z_OK) break;
    }
    uint64_t got = e->usize - out_left - s.avail_out;
    const char *zmsg = s.msg ? s.msg : zError(r);
    int full = !s.avail_out && !out_left, starved = !s.avail_in && !in_left;
    inflateEnd(&s);
    if (r == Z_STREAM_END && full) return PS_OK;
    if (r == Z_STREAM_END)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s' inflates to %llu bytes, its header says %llu", z->path,
                          e->name, (unsigned long long)got, (unsigned long long)e->usize);
    if (r == Z_BUF_ERROR && full && !starved)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s' inflates to more than its declared %llu bytes",
                          z->path, e->name, (unsigned long long)e->usize);
    return ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s': %s deflate data (zlib: %s; %llu of %llu bytes out)",
                      z->path, e->name, r == Z_BUF_ERROR ? "truncated" : "corrupt", zmsg, (unsigned long long)got,
                      (unsigned long long)e->usize);
}

ps_status ps_zip_extract(const ps_zip *z, const char *name, size_t max_bytes, void **data, size_t *len,
                         ps_err *err) {
    *data = NULL;
    *len = 0;
    const zip_entry *e = NULL;
    for (int i = 0; i < z->n && !e; i++)
        if (!strcmp(z->e[i].name, name)) e = &z->e[i];
    if (!e) {
        char names[256];
        return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: no member '%s' (members: %s)", z->path, name,
                          ps_zip_names(z, names, sizeof names));
    }
    if (e->flags & 1) return ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: member '%s' is encrypted", z->path, name);
    if (e->method != 0 && e->method != 8)
        return ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: member '%s' uses compression method %d (%s); only stored "
                          "(0) and deflate (8) are supported", z->path, name, e->method, method_name(e->method));
    if (e->usize > max_bytes)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: member '%s' is %llu bytes, over the %zu MiB data "
                          "limit (--max-data-mb)", z->path, name, (unsigned long long)e->usize, max_bytes >> 20);
    /* deflate makes at most 1032 bytes of each input byte (zlib's FAQ): a
     * larger declared size is a corrupt or hostile header, refused before
     * allocating it */
    if (e->method == 8 && e->usize / DEFLATE_MAX_RATIO > e->csize)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s' declares %llu bytes from %llu compressed bytes, more "
                          "than deflate can produce (corrupt?)", z->path, name, (unsigned long long)e->usize,
                          (unsigned long long)e->csize);
    if (e->method == 0 && e->csize != e->usize)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: stored member '%s' has compressed size %llu != size %llu", z->path,
                          name, (unsigned long long)e->csize, (unsigned long long)e->usize);
    if (e->offset > z->len || z->len - e->offset < LOCAL_LEN || rd32(z->buf + e->offset) != SIG_LOCAL)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s': no local header at offset %llu", z->path, name,
                          (unsigned long long)e->offset);
    const unsigned char *l = z->buf + e->offset;
    uint64_t start = e->offset + LOCAL_LEN + rd16(l + 26) + rd16(l + 28);
    if (start > z->len || e->csize > z->len - start)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s' is truncated: %llu bytes declared, %llu in the file",
                          z->path, name, (unsigned long long)e->csize,
                          (unsigned long long)(start > z->len ? 0 : z->len - start));
    unsigned char *out = malloc(e->usize ? (size_t)e->usize : 1);
    if (!out) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for member '%s'", z->path, name);
    ps_status st = PS_OK;
    if (e->method == 0) memcpy(out, z->buf + start, (size_t)e->usize);
    else st = inflate_all(z, e, z->buf + start, out, err);
    if (!st) {
        uLong crc = crc32(0L, Z_NULL, 0);
        for (uint64_t o = 0; o < e->usize;) {
            uInt chunk = e->usize - o > (1u << 30) ? 1u << 30 : (uInt)(e->usize - o);
            crc = crc32(crc, out + o, chunk);
            o += chunk;
        }
        if ((uint32_t)crc != e->crc)
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: member '%s': CRC-32 %08x, the archive says %08x (corrupt)",
                            z->path, name, (unsigned)crc, (unsigned)e->crc);
    }
    if (st) {
        free(out);
        return st;
    }
    *data = out;
    *len = (size_t)e->usize;
    return PS_OK;
}
