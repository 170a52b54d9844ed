/* isa_child.h - run this test program again in a child process with oneDNN
 * capped to one instruction set. oneDNN fixes its ISA at first use, from
 * ONEDNN_MAX_CPU_ISA, so a test that checks the kernels of several ISAs
 * runs one child per ISA (test_isa, test_kinds, test_conv_wgrad, test_pool_bwd,
 * test_nn_ops), on the ISAs of isa_rows this CPU has. */
#ifndef PS_TEST_ISA_CHILD_H
#define PS_TEST_ISA_CHILD_H

/* Runs /proc/self/exe with argv (argv[0] the program's name, NULL-ended)
 * and ONEDNN_MAX_CPU_ISA=isa (NULL: unset, the host's own ISA), waits for
 * it and records two checks: the child was started and waited for, and it
 * exited 0 (the message names `what` and the wait status). stdout is
 * flushed first, so the child's lines follow the parent's. */
void check_isa_child(const char *what, const char *isa, char *const argv[]);

/* The main of a test whose child(isa) checks one ISA's kernels: with
 * argv {prog, "--child", ISA} it returns child(ISA); otherwise it runs a
 * child for SSE41, AVX2 (where the host has it) and DEFAULT (the host's
 * own ISA, oneDNN uncapped) and returns check_summary(name). Exit 77
 * (skipped) where oneDNN is not x86-64 with SSE4.1. */
int isa_children_main(const char *name, int argc, char **argv, int (*child)(const char *isa));

/* The instruction sets the tests cap oneDNN to, highest first. */
typedef struct isa_row {
    const char *env;          /* ONEDNN_MAX_CPU_ISA value */
    const char *effective;    /* ps_backend_cpu_isa() expected under it */
    const char *flags[4];     /* /proc/cpuinfo flags the ISA needs */
} isa_row;

#define ISA_ROWS 3
extern const isa_row isa_rows[ISA_ROWS];

/* 1 when every flag of row is in /proc/cpuinfo's first "flags" line. */
int isa_host_has(const isa_row *row);

#endif
