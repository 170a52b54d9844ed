/* test_security - TLS, mutual TLS, bearer tokens and the plaintext rule,
 * over real gRPC on loopback, with throw-away certificates made by
 * scripts/gen-test-certs.sh (openssl). Also the tokens-file parser and the
 * config -> security checks.
 *
 * The server here is a tiny echo service whose handlers answer the caller's
 * token name (call_info.principal) and count how often they ran, so the
 * tests can see that refused calls never reach a handler. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "config.h"
#include "rpc_server.h"
#include "security.h"
#include "support/tmpdir.h"

#define M_FORWARD "/ps.ParameterServer/Forward"
#define M_STATUS "/ps.ParameterServer/Status"
#define M_HEALTH "/grpc.health.v1.Health/Check"

static int handler_calls;  /* test-only counter; handlers run on server threads */

static void echo(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *req, grpc_byte_buffer **resp,
                 grpc_status_code *code, char *details, size_t dlen) {
    (void)user; (void)req; (void)code; (void)details; (void)dlen;
    __atomic_add_fetch(&handler_calls, 1, __ATOMIC_RELAXED);
    char who[128];
    snprintf(who, sizeof who, "principal=%s", info->principal ? info->principal : "(null)");
    grpc_slice s = grpc_slice_from_copied_string(who);
    *resp = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
}

static const ps_rpc_method methods[] = {{M_FORWARD, echo}, {M_STATUS, echo}, {M_HEALTH, echo}};

static char dir[256];

static const char *path(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", dir, name);
    return p;
}

/* One call; returns the status, the reply text in out (if any). */
static grpc_status_code call_with(ps_rpc_client *c, const char *method, size_t payload, char *out, size_t olen,
                                  char *det, size_t dlen) {
    grpc_byte_buffer *rq = NULL, *rs = NULL;
    if (payload) {
        char *big = calloc(1, payload);
        grpc_slice s = grpc_slice_from_copied_buffer(big, payload);
        rq = grpc_raw_byte_buffer_create(&s, 1);
        grpc_slice_unref(s);
        free(big);
    }
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    ps_err err = {0};
    CHECK(ps_rpc_client_call(c, method, rq, &rs, 10000, &code, det, dlen, &err) == PS_OK);
    if (out) out[0] = 0;
    if (rs && out) {
        grpc_byte_buffer_reader r;
        grpc_byte_buffer_reader_init(&r, rs);
        grpc_slice all = grpc_byte_buffer_reader_readall(&r);
        size_t n = GRPC_SLICE_LENGTH(all) < olen - 1 ? GRPC_SLICE_LENGTH(all) : olen - 1;
        memcpy(out, GRPC_SLICE_START_PTR(all), n);
        out[n] = 0;
        grpc_slice_unref(all);
        grpc_byte_buffer_reader_destroy(&r);
    }
    if (rs) grpc_byte_buffer_destroy(rs);
    if (rq) grpc_byte_buffer_destroy(rq);
    return code;
}

static grpc_status_code call(const char *target, const ps_rpc_security *sec, const char *method, char *out,
                             size_t olen, char *det, size_t dlen) {
    ps_err err = {0};
    ps_rpc_client *c = ps_rpc_client_create_secure(target, 16 << 20, sec, &err);
    CHECK_MSG(c, "%s", err.msg);
    if (!c) return GRPC_STATUS_UNKNOWN;
    grpc_status_code code = call_with(c, method, 0, out, olen, det, dlen);
    ps_rpc_client_free(c);
    return code;
}

static ps_rpc_server *start(const ps_rpc_security *sec, char *target, size_t tlen) {
    ps_err err = {0};
    ps_rpc_server *s = ps_rpc_server_create_secure("127.0.0.1:0", 2, 16 << 20, methods, 3, NULL, sec, &err);
    CHECK_MSG(s, "%s", err.msg);
    if (!s) return NULL;
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    snprintf(target, tlen, "127.0.0.1:%d", ps_rpc_server_port(s));
    return s;
}

static void write_file(const char *p, const char *text, int mode) {
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    chmod(p, (mode_t)mode);
}

static void test_loopback_rule(void) {
    CHECK(ps_rpc_addr_is_loopback("127.0.0.1:50051"));
    CHECK(ps_rpc_addr_is_loopback("127.1.2.3:1"));
    CHECK(ps_rpc_addr_is_loopback("[::1]:5"));
    CHECK(ps_rpc_addr_is_loopback("localhost:5"));
    CHECK(ps_rpc_addr_is_loopback("dns:///localhost:5"));
    CHECK(ps_rpc_addr_is_loopback("ipv4:127.0.0.1:5"));
    CHECK(ps_rpc_addr_is_loopback("unix:/tmp/psd.sock"));
    CHECK(!ps_rpc_addr_is_loopback("0.0.0.0:50051"));
    CHECK(!ps_rpc_addr_is_loopback("[::]:50051"));
    CHECK(!ps_rpc_addr_is_loopback("10.200.1.1:50051"));
    CHECK(!ps_rpc_addr_is_loopback("127.example.com:50051"));
    CHECK(!ps_rpc_addr_is_loopback("localhost.example.com:1"));
    CHECK(!ps_rpc_addr_is_loopback("ps.example:6000"));

    ps_err err = {0};
    ps_rpc_server *s = ps_rpc_server_create_secure("0.0.0.0:0", 1, 0, methods, 2, NULL, NULL, &err);
    CHECK(s == NULL && err.code == PS_ERR_PERMISSION_DENIED);
    CHECK_MSG(strstr(err.msg, "0.0.0.0:0") && strstr(err.msg, "security.allow_insecure"), "%s", err.msg);
    ps_rpc_security insecure = {.allow_insecure = 1};
    s = ps_rpc_server_create_secure("0.0.0.0:0", 1, 0, methods, 2, NULL, &insecure, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    ps_rpc_server_free(s);
    ps_rpc_client *c = ps_rpc_client_create_secure("10.200.9.9:1", 0, NULL, &err);
    CHECK(c == NULL && err.code == PS_ERR_PERMISSION_DENIED && strstr(err.msg, "10.200.9.9:1"));
    c = ps_rpc_client_create_secure("10.200.9.9:1", 0, &insecure, &err);
    CHECK(c != NULL);
    ps_rpc_client_free(c);
    /* TLS is fine anywhere (the file is not read until creation). */
    ps_rpc_security tls = {.tls = 1, .ca_file = path("ca.pem")};
    c = ps_rpc_client_create_secure("10.200.9.9:1", 0, &tls, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    ps_rpc_client_free(c);
}

static void test_tls(void) {
    char target[64], out[128], det[PS_RPC_DETAILS_MAX];
    ps_rpc_security srv = {.tls = 1, .cert_file = path("server.pem"), .key_file = path("server.key")};
    ps_rpc_server *s = start(&srv, target, sizeof target);
    if (!s) return;
    ps_rpc_security good = {.tls = 1, .ca_file = path("ca.pem")};
    CHECK(call(target, &good, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK);
    CHECK_MSG(!strcmp(out, "principal="), "%s", out);
    /* Name checked in the certificate: psd.test is listed, other.test is not. */
    ps_rpc_security named = good;
    named.server_name = "psd.test";
    CHECK(call(target, &named, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK);
    named.server_name = "other.test";
    CHECK(call(target, &named, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAVAILABLE);
    /* A client trusting another CA, and a plaintext client: no connection. */
    ps_rpc_security rogue = {.tls = 1, .ca_file = path("rogue-ca.pem")};
    int before = handler_calls;
    CHECK(call(target, &rogue, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAVAILABLE);
    CHECK(call(target, NULL, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAVAILABLE);
    CHECK(handler_calls == before);
    ps_rpc_server_free(s);

    /* A server presenting a certificate of the rogue CA is refused by a good client. */
    ps_rpc_security fake = {.tls = 1, .cert_file = path("rogue-server.pem"), .key_file = path("rogue-server.key")};
    s = start(&fake, target, sizeof target);
    CHECK(call(target, &good, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAVAILABLE);
    ps_rpc_server_free(s);

    /* Bad files: named in the error, nothing listens. */
    ps_err err = {0};
    ps_rpc_security bad = {.tls = 1, .cert_file = path("nope.pem"), .key_file = path("server.key")};
    CHECK(ps_rpc_server_create_secure("127.0.0.1:0", 1, 0, methods, 2, NULL, &bad, &err) == NULL);
    CHECK_MSG(err.code == PS_ERR_NOT_FOUND && strstr(err.msg, "nope.pem"), "%s", err.msg);
    bad.cert_file = path("server.key");  /* a key where a certificate belongs */
    CHECK(ps_rpc_server_create_secure("127.0.0.1:0", 1, 0, methods, 2, NULL, &bad, &err) == NULL);
    CHECK_MSG(err.code == PS_ERR_INVALID_ARGUMENT && strstr(err.msg, "not a PEM file with a CERTIFICATE"),
              "%s", err.msg);
    ps_rpc_security badc = {.tls = 1, .ca_file = path("server.key")};
    CHECK(ps_rpc_client_create_secure("127.0.0.1:1", 0, &badc, &err) == NULL);
    CHECK_MSG(strstr(err.msg, "server.key"), "%s", err.msg);
    ps_rpc_security half = {.tls = 1, .ca_file = path("ca.pem"), .cert_file = path("client.pem")};
    CHECK(ps_rpc_client_create_secure("127.0.0.1:1", 0, &half, &err) == NULL);
    CHECK_MSG(strstr(err.msg, "both"), "%s", err.msg);
}

static void test_mutual_tls(void) {
    char target[64], out[128], det[PS_RPC_DETAILS_MAX];
    ps_rpc_security srv = {.tls = 1, .cert_file = path("server.pem"), .key_file = path("server.key"),
                           .ca_file = path("ca.pem"), .mutual_tls = 1};
    ps_rpc_server *s = start(&srv, target, sizeof target);
    if (!s) return;
    ps_rpc_security with = {.tls = 1, .ca_file = path("ca.pem"), .cert_file = path("client.pem"),
                            .key_file = path("client.key")};
    CHECK(call(target, &with, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK);
    int before = handler_calls;
    ps_rpc_security without = {.tls = 1, .ca_file = path("ca.pem")};
    CHECK(call(target, &without, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAVAILABLE);
    ps_rpc_security rogue = with;
    rogue.cert_file = path("rogue-client.pem");
    rogue.key_file = path("rogue-client.key");
    CHECK(call(target, &rogue, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAVAILABLE);
    CHECK(handler_calls == before);
    ps_rpc_server_free(s);
}

static const char *TRAINER_TOKEN = "0123456789abcdef0123456789abcdef";
static const char *READER_TOKEN = "fedcba9876543210fedcba9876543210";

static void test_tokens(void) {
    char tokens[512];
    snprintf(tokens, sizeof tokens, "# name role token\n\ntrainer1 trainer %s\n  monitor\treader %s  # ro\n",
             TRAINER_TOKEN, READER_TOKEN);
    write_file(path("tokens"), tokens, 0600);
    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    CHECK(ps_config_set(&cfg, "security.tls", "true", "t", &err) == PS_OK);
    CHECK(ps_config_set(&cfg, "security.cert", path("server.pem"), "t", &err) == PS_OK);
    CHECK(ps_config_set(&cfg, "security.key", path("server.key"), "t", &err) == PS_OK);
    CHECK(ps_config_set(&cfg, "security.tokens_file", path("tokens"), "t", &err) == PS_OK);
    ps_security ss;
    CHECK_MSG(ps_security_server(&cfg, &ss, &err) == PS_OK, "%s", err.msg);
    CHECK(ss.ntokens == 2);
    char target[64], out[128], det[PS_RPC_DETAILS_MAX];
    ps_rpc_server *s = start(&ss.rpc, target, sizeof target);
    ps_security_free(&ss);  /* the server keeps its own copies */
    if (!s) return;

    ps_rpc_security cl = {.tls = 1, .ca_file = path("ca.pem")};
    int before = handler_calls;
    CHECK(call(target, &cl, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAUTHENTICATED);
    CHECK_MSG(strstr(det, "authorization: Bearer"), "%s", det);
    cl.token = "0123456789abcdef0123456789abcdeX";  /* same length, one byte off */
    CHECK(call(target, &cl, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAUTHENTICATED);
    CHECK(!strcmp(det, "invalid token"));
    cl.token = "0123456789abcdef";  /* a prefix of the real one */
    CHECK(call(target, &cl, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAUTHENTICATED);
    cl.token = READER_TOKEN;
    CHECK(call(target, &cl, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_PERMISSION_DENIED);
    CHECK_MSG(strstr(det, "'monitor' may not call /ps.ParameterServer/Forward"), "%s", det);
    CHECK(handler_calls == before);  /* refused calls never reach a handler */
    CHECK(call(target, &cl, M_STATUS, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK);
    CHECK_MSG(!strcmp(out, "principal=monitor"), "%s", out);
    /* the health check is for anyone who may connect: readers too */
    CHECK_MSG(call(target, &cl, M_HEALTH, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK, "%s", det);
    cl.token = TRAINER_TOKEN;
    CHECK(call(target, &cl, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK);
    CHECK_MSG(!strcmp(out, "principal=trainer1"), "%s", out);
    CHECK(call(target, &cl, "/ps.ParameterServer/Nope", out, sizeof out, det, sizeof det) ==
          GRPC_STATUS_UNIMPLEMENTED);
    /* A large message without a token is refused before it is read. */
    ps_rpc_security anon = {.tls = 1, .ca_file = path("ca.pem")};
    ps_rpc_client *c = ps_rpc_client_create_secure(target, 16 << 20, &anon, &err);
    before = handler_calls;
    for (int i = 0; i < 3; i++)
        CHECK(call_with(c, M_FORWARD, 8 << 20, NULL, 0, det, sizeof det) == GRPC_STATUS_UNAUTHENTICATED);
    CHECK(handler_calls == before);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);

    /* Tokens work over plaintext loopback too (the client side via ps_security_client). */
    write_file(path("token"), "  0123456789abcdef0123456789abcdef\nignored\n", 0600);
    ps_config tc;
    ps_config_defaults(&tc);
    CHECK(ps_config_set(&tc, "security.token_file", path("token"), "t", &err) == PS_OK);
    ps_security cs;
    CHECK_MSG(ps_security_client(&tc, &cs, &err) == PS_OK, "%s", err.msg);
    CHECK(cs.rpc.token && !strcmp(cs.rpc.token, TRAINER_TOKEN));
    ps_rpc_token t = {TRAINER_TOKEN, "solo", NULL};
    ps_rpc_security plain = {.tokens = &t, .ntokens = 1};
    s = start(&plain, target, sizeof target);
    CHECK(call(target, &cs.rpc, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_OK);
    CHECK(!strcmp(out, "principal=solo"));
    CHECK(call(target, NULL, M_FORWARD, out, sizeof out, det, sizeof det) == GRPC_STATUS_UNAUTHENTICATED);
    ps_rpc_server_free(s);
    ps_security_free(&cs);
}

static void expect_parse_error(const char *text, const char *needle) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    ps_rpc_token *t = NULL;
    int n = 0;
    ps_err err = {0};
    CHECK(ps_security_parse_tokens(buf, "tok", &t, &n, &err) == PS_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, needle), "'%s' not in '%s'", needle, err.msg);
    CHECK(t == NULL && n == 0);
}

static void test_config_checks(void) {
    expect_parse_error("a trainer 0123456789abcdef0123\nb admin 0123456789abcdef9999\n",
                       "tok:2: role 'admin' of 'b' is not 'trainer' or 'reader'");
    expect_parse_error("a trainer short\n", "tok:1: the token of 'a' must be 16..256");
    /* over-long names are refused at load (identities are compared whole):
     * 63 characters pass, 64 do not */
    {
        char text[256], buf[256];
        snprintf(text, sizeof text, "%063d trainer 0123456789abcdef0123\n", 7);
        snprintf(buf, sizeof buf, "%s", text);
        ps_rpc_token *t = NULL;
        int n = 0;
        ps_err err = {0};
        CHECK(ps_security_parse_tokens(buf, "tok", &t, &n, &err) == PS_OK && n == 1 && strlen(t[0].name) == 63);
        free(t);
        snprintf(text, sizeof text, "%064d trainer 0123456789abcdef0123\n", 7);
        expect_parse_error(text, "must be 1..63");
    }
    expect_parse_error("a trainer\n", "tok:1: expected '<name> <role> <token>', got 2 fields");
    expect_parse_error("a trainer 0123456789abcdef0123 extra\n", "got 4 fields");
    expect_parse_error("a trainer 0123456789abcdef0123\nb reader 0123456789abcdef0123\n",
                       "tok:2: duplicate token");
    expect_parse_error("a trainer 0123456789abcdef0123\na reader 0123456789abcdef4567\n",
                       "tok:2: duplicate name");
    expect_parse_error("# only comments\n\n", "tok: no tokens");
    expect_parse_error("b@d trainer 0123456789abcdef0123\n", "name 'b@d'");

    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    ps_security ss;
    cfg.security.tls = true;
    CHECK(ps_security_server(&cfg, &ss, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "security.cert"), "%s", err.msg);
    snprintf(cfg.security.cert, sizeof cfg.security.cert, "%s", path("server.pem"));
    snprintf(cfg.security.key, sizeof cfg.security.key, "%s", path("server.key"));
    cfg.security.mutual_tls = true;
    CHECK(ps_security_server(&cfg, &ss, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "security.ca"), "%s", err.msg);
    cfg.security.mutual_tls = false;
    write_file(path("open-tokens"), "a trainer 0123456789abcdef0123\n", 0644);
    snprintf(cfg.security.tokens_file, sizeof cfg.security.tokens_file, "%s", path("open-tokens"));
    CHECK(ps_security_server(&cfg, &ss, &err) == PS_ERR_PERMISSION_DENIED);
    CHECK_MSG(strstr(err.msg, "chmod 600"), "%s", err.msg);
    snprintf(cfg.security.tokens_file, sizeof cfg.security.tokens_file, "%s", path("missing"));
    CHECK(ps_security_server(&cfg, &ss, &err) == PS_ERR_NOT_FOUND);
    ps_config tc;
    ps_config_defaults(&tc);
    snprintf(tc.security.client_cert, sizeof tc.security.client_cert, "%s", path("client.pem"));
    CHECK(ps_security_client(&tc, &ss, &err) == PS_ERR_INVALID_ARGUMENT);
    write_file(path("bad-token"), "short\n", 0600);
    ps_config_defaults(&tc);
    snprintf(tc.security.token_file, sizeof tc.security.token_file, "%s", path("bad-token"));
    CHECK(ps_security_client(&tc, &ss, &err) == PS_ERR_FORMAT);
    /* "~/..." is taken literally (no shell here): the error says so */
    ps_config_defaults(&tc);
    snprintf(tc.security.token_file, sizeof tc.security.token_file, "~/.psd-token-of-test_security");
    CHECK(ps_security_client(&tc, &ss, &err) == PS_ERR_NOT_FOUND);
    CHECK_MSG(strstr(err.msg, "a leading ~ is not expanded"), "%s", err.msg);
}

int main(void) {
    if (system("command -v openssl >/dev/null 2>&1") != 0)
        return check_skip("test_security", "openssl not installed (scripts/install-deps.sh installs it)");
    snprintf(dir, sizeof dir, "/tmp/test_security.XXXXXX");
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "scripts/gen-test-certs.sh %s >/dev/null", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_security: scripts/gen-test-certs.sh failed (run from the repository root)\n");
        return 1;
    }
    grpc_init();
    test_loopback_rule();
    test_tls();
    test_mutual_tls();
    test_tokens();
    test_config_checks();
    grpc_shutdown();
    test_rmtree(dir);
    return check_summary("test_security");
}
