/* cli.c - the command-line parsing psd, ps-train and its subcommands share
 * (cli.h): a flag's value in any of its spellings, KEY=VALUE pairs. */
#include "cli.h"

#include <stdio.h>

#include "config.h"

#include <stdio.h>
#include <string.h>

const char *ps_cli_value(int argc, char **argv, int *i, const char *lng, const char *shrt, int *missing) {
    const char *a = argv[*i];
    size_t n = strlen(lng);
    if (!strncmp(a, lng, n) && a[n] == '=') return a + n + 1;
    if (!strcmp(a, lng) || (shrt && !strcmp(a, shrt))) {
        if (*i + 1 >= argc) {
            *missing = 1;
            return NULL;
        }
        return argv[++*i];
    }
    return NULL;
}

const char *ps_cli_split_kv(const char *kv, char *key, size_t key_len) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv || (size_t)(eq - kv) >= key_len) return NULL;
    snprintf(key, key_len, "%.*s", (int)(eq - kv), kv);
    return eq + 1;
}

int ps_cli_long(const char *prog, const char *flag, const char *v, long lo, long hi, long *out) {
    ps_err err = {0};
    if (ps_parse_long(flag, v, lo, hi, out, &err) == PS_OK) return 0;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return -1;
}

int ps_cli_double(const char *prog, const char *flag, const char *v, double lo, double hi, double *out) {
    ps_err err = {0};
    if (ps_parse_double(flag, v, lo, hi, 0, out, &err) == PS_OK) return 0;
    fprintf(stderr, "%s: %s\n", prog, err.msg);
    return -1;
}
