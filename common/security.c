/* security.c - the config's security.* keys made into the rpc layer's
 * ps_rpc_security for either side, and the tokens-file parser (security.h). */
#include "security.h"

#include "methods.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


#define TOKENS_FILE_MAX (1 << 20)

/* Whole file as a string (at most 1 MiB); private: refuse o+r. */
static char *read_secret_file(const char *what, const char *path, ps_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        /* A config file is not a shell: "~/.psd-token" names a directory "~". */
        ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s %s: %s%s", what, path,
                   strerror(errno), path[0] == '~' ? " (a leading ~ is not expanded: give the full path)" : "");
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & S_IROTH)) {
        fclose(f);
        ps_err_set(err, PS_ERR_PERMISSION_DENIED, "%s %s: readable by every user (mode %03o); "
                   "it holds secrets: chmod 600 %s", what, path, (unsigned)(st.st_mode & 0777), path);
        return NULL;
    }
    char *buf = malloc(TOKENS_FILE_MAX + 1);
    size_t n = buf ? fread(buf, 1, TOKENS_FILE_MAX + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!buf) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s %s: out of memory", what, path); return NULL; }
    if (bad || n > TOKENS_FILE_MAX) {
        ps_err_set(err, bad ? PS_ERR_IO : PS_ERR_INVALID_ARGUMENT, "%s %s: %s", what, path,
                   bad ? "read error" : "larger than 1 MiB");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (strlen(buf) != n) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s %s: contains a NUL byte; not a text file", what, path);
        free(buf);
        return NULL;
    }
    return buf;
}

static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > PS_TOKEN_NAME_MAX) return 0;
    return s[strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")] == '\0';
}

/* 16..256 printable ASCII characters, no spaces. */
static int token_ok(const char *s) {
    size_t n = strlen(s);
    if (n < 16 || n > 256) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~') return 0;
    return 1;
}

ps_status ps_security_parse_tokens(char *text, const char *origin, ps_rpc_token **tokens, int *n,
                                   ps_err *err) {
    *tokens = NULL;
    *n = 0;
    int cnt = 0;
    int cap = 0, line = 0;
    ps_rpc_token *t = NULL;
    char *save = NULL;
    for (char *l = text; l; l = save) {
        line++;
        save = strchr(l, '\n');
        if (save) *save++ = '\0';
        char *hash = strchr(l, '#');
        if (hash) *hash = '\0';
        char *f[4];
        int nf = 0;
        char *sp = NULL;
        for (char *w = strtok_r(l, " \t\r", &sp); w; w = strtok_r(NULL, " \t\r", &sp)) {
            if (nf == 4) break;
            f[nf++] = w;
        }
        if (nf == 0) continue;
        if (nf != 3) {
            free(t);
            return ps_err_set(err, PS_ERR_FORMAT, "%s:%d: expected '<name> <role> <token>', got %d "
                              "field%s", origin, line, nf == 4 ? 4 : nf, nf == 1 ? "" : "s");
        }
        if (!name_ok(f[0])) {
            free(t);
            return ps_err_set(err, PS_ERR_FORMAT, "%s:%d: name '%.64s' must be 1..63 letters, digits, "
                              "'_', '-' or '.'", origin, line, f[0]);
        }
        const char *const *methods;
        if (!strcmp(f[1], "trainer")) methods = NULL;
        else if (!strcmp(f[1], "reader")) methods = ps_method_reader_paths();
        else {
            free(t);
            return ps_err_set(err, PS_ERR_FORMAT, "%s:%d: role '%.32s' of '%s' is not 'trainer' or "
                              "'reader'", origin, line, f[1], f[0]);
        }
        if (!token_ok(f[2])) {
            free(t);
            return ps_err_set(err, PS_ERR_FORMAT, "%s:%d: the token of '%s' must be 16..256 printable "
                              "characters without spaces (e.g. openssl rand -hex 32)", origin, line, f[0]);
        }
        for (int i = 0; i < cnt; i++) {
            if (!strcmp(t[i].name, f[0]) || !strcmp(t[i].token, f[2])) {
                const char *what = !strcmp(t[i].name, f[0]) ? "name" : "token";
                const char *nm = t[i].name;
                free(t);
                return ps_err_set(err, PS_ERR_FORMAT, "%s:%d: duplicate %s (of '%s', also used by '%s')",
                                  origin, line, what, f[0], nm);
            }
        }
        if (cnt == cap) {
            cap = cap ? cap * 2 : 8;
            ps_rpc_token *nt = realloc(t, (size_t)cap * sizeof *t);
            if (!nt) { free(t); return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", origin); }
            t = nt;
        }
        t[cnt].name = f[0];
        t[cnt].token = f[2];
        t[cnt].methods = methods;
        (cnt)++;
    }
    if (cnt == 0) {
        free(t);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: no tokens (lines '<name> <role> <token>')", origin);
    }
    *tokens = t;
    *n = cnt;
    return PS_OK;
}

static void tls_common(const ps_config *c, ps_security *out) {
    memset(out, 0, sizeof *out);
    out->rpc.tls = c->security.tls;
    out->rpc.allow_insecure = c->security.allow_insecure;
}

ps_status ps_security_server(const ps_config *c, ps_security *out, ps_err *err) {
    tls_common(c, out);
    const char *k = NULL;
    if (c->security.tls && !c->security.cert[0]) k = "security.cert";
    else if (c->security.tls && !c->security.key[0]) k = "security.key";
    if (k)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "security.tls is true but %s (a PEM file) "
                          "is not set", k);
    if (c->server.metrics_tls && (!c->security.cert[0] || !c->security.key[0]))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.metrics_tls is true but %s (a PEM file) is not set: "
                          "the metrics port serves HTTPS with the gRPC port's certificate",
                          !c->security.cert[0] ? "security.cert" : "security.key");
    if (c->security.mutual_tls && (!c->security.tls || !c->security.ca[0]))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "security.mutual_tls needs security.tls: true "
                          "and security.ca (the CA that signs the trainers' certificates)");
    out->rpc.cert_file = c->security.cert;
    out->rpc.key_file = c->security.key;
    out->rpc.ca_file = c->security.mutual_tls ? c->security.ca : NULL;
    out->rpc.mutual_tls = c->security.mutual_tls;
    if (c->security.tokens_file[0]) {
        out->text = read_secret_file("tokens file", c->security.tokens_file, err);
        if (!out->text) return err ? err->code : PS_ERR_IO;
        ps_status st = ps_security_parse_tokens(out->text, c->security.tokens_file, &out->tokens,
                                                &out->ntokens, err);
        if (st) { ps_security_free(out); return st; }
        out->rpc.tokens = out->tokens;
        out->rpc.ntokens = out->ntokens;
    }
    return PS_OK;
}

ps_status ps_security_client(const ps_config *c, ps_security *out, ps_err *err) {
    tls_common(c, out);
    if (!c->security.tls && c->security.client_cert[0])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "security.client_cert is set but security.tls "
                          "is false");
    out->rpc.ca_file = c->security.ca;
    out->rpc.cert_file = c->security.client_cert;
    out->rpc.key_file = c->security.client_key;
    out->rpc.server_name = c->security.server_name;
    if (c->security.token_file[0]) {
        out->text = read_secret_file("token file", c->security.token_file, err);
        if (!out->text) return err ? err->code : PS_ERR_IO;
        char *tok = out->text + strspn(out->text, " \t\r\n");
        tok[strcspn(tok, " \t\r\n")] = '\0';
        if (!token_ok(tok)) {
            ps_err_set(err, PS_ERR_FORMAT, "token file %s: the first line must hold a token of 16..256 "
                       "printable characters", c->security.token_file);
            ps_security_free(out);
            return PS_ERR_FORMAT;
        }
        out->rpc.token = tok;
    }
    return PS_OK;
}

void ps_security_free(ps_security *s) {
    if (!s) return;
    free(s->tokens);
    free(s->text);
    memset(s, 0, sizeof *s);
}
