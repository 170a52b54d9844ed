/* cli.h - command-line parsing shared by psd, ps-train and its subcommands.
 *
 * Flags take their value as "--name VALUE", "--name=VALUE" or "-n VALUE".
 * Values are then applied through ps_config_set, so a flag is checked
 * exactly like the config key it overrides.
 */
#ifndef PS_CLI_H
#define PS_CLI_H

#include <stddef.h>

/* If argv[*i] is the flag lng (or its short form shrt, may be NULL), return
 * its value, advancing *i past a separate value argument; *missing = 1 when
 * the value is absent. Returns NULL when argv[*i] is another flag. */
const char *ps_cli_value(int argc, char **argv, int *i, const char *lng, const char *shrt, int *missing);

/* Split "KEY=VALUE": copies KEY into key (key_len bytes) and returns VALUE,
 * or NULL when there is no '=', the key is empty or too long. */
const char *ps_cli_split_kv(const char *kv, char *key, size_t key_len);

/* A flag's number, checked by the config's parsers (config.h
 * ps_parse_long / ps_parse_double, closed range): 0, or -1 after printing
 * "PROG: FLAG: 'x' is out of range [lo, hi]" to stderr. */
int ps_cli_long(const char *prog, const char *flag, const char *v, long lo, long hi, long *out);
int ps_cli_double(const char *prog, const char *flag, const char *v, double lo, double hi, double *out);

#endif
