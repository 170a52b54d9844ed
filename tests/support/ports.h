/* ports.h - a block of TCP ports for a psd a test starts itself, reserved as
 * tests/lib.sh's free_port and check_resnet.free_port reserve theirs: a
 * symlink ${TMPDIR:-/tmp}/ps-test-ports/BLOCK naming the owner's pid (a dead
 * owner's block taken over), so that tests running side by side never pick
 * the same port. */
#ifndef PS_TEST_PORTS_H
#define PS_TEST_PORTS_H

/* The first of 16 consecutive ports in 20000..32767 (below Linux's ephemeral
 * range) that nothing listens on, reserved until this process exits; -1 after
 * printing why on stderr. */
int test_free_port(void);

#endif
