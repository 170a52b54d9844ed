/* security.h - from the config's security.* keys to the rpc layer's
 * ps_rpc_security: which certificates, which tokens.
 *
 * Tokens file (psd, security.tokens_file): one token per line,
 *     <name> <role> <token>
 * '#' starts a comment; blank lines are ignored. name: 1..PS_TOKEN_NAME_MAX (63) letters,
 * digits, '_', '-', '.'; role: "trainer" (every method) or "reader"
 * (ListParameters, GetParameters, Status, Health/Check only); token: 16..256 printable
 * characters without spaces (e.g. `openssl rand -hex 32`). Names and tokens
 * must be unique. The file must not be readable by other users (like ssh
 * keys): a mode with o+r is refused. A shared secret is one line that every
 * trainer uses.
 *
 * Token file (trainer, security.token_file): the token on its first line.
 *
 * Every error names the file, the line and what is wrong.
 */
#ifndef PS_SECURITY_H
#define PS_SECURITY_H

#include "config.h"
#include "rpc.h"
#include "status.h"

#define PS_TOKEN_NAME_MAX 63   /* longer names are refused at load: identities are compared whole */

typedef struct ps_security {
    ps_rpc_security rpc;   /* hand &rpc to ps_rpc_*_create_secure */
    ps_rpc_token *tokens;  /* owned */
    int ntokens;
    char *text;            /* owned: the tokens file, tokens point into it */
} ps_security;

/* psd's side: TLS files, mutual TLS, tokens file, allow_insecure.
 * tls without cert/key, mutual_tls without tls or ca -> INVALID_ARGUMENT. */
ps_status ps_security_server(const ps_config *c, ps_security *out, ps_err *err);

/* The trainer's side: CA, client certificate, server name, token file. */
ps_status ps_security_client(const ps_config *c, ps_security *out, ps_err *err);

/* Parse tokens-file text (modified in place; tokens point into it) into a
 * new array *tokens of *n entries; origin names the file in errors. */
ps_status ps_security_parse_tokens(char *text, const char *origin, ps_rpc_token **tokens, int *n,
                                   ps_err *err);

void ps_security_free(ps_security *s);  /* NULL ok; zeroes *s */

#endif
