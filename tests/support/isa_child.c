/* isa_child.c - a test program run again under ONEDNN_MAX_CPU_ISA, in a
 * child process, its exit status checked (isa_child.h). */
#include "isa_child.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../check.h"

void check_isa_child(const char *what, const char *isa, char *const argv[]) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (isa) setenv("ONEDNN_MAX_CPU_ISA", isa, 1);
        else unsetenv("ONEDNN_MAX_CPU_ISA");
        execv("/proc/self/exe", argv);
        perror("exec /proc/self/exe");
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s under ONEDNN_MAX_CPU_ISA=%s: child failed (status 0x%x)",
              what, isa ? isa : "(unset)", status);
}
