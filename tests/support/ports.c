/* ports.c - see ports.h. */
#include "ports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

enum { BLOCKS = 798, BLOCK = 16, FIRST = 20000 };

static char reserved[16][PATH_MAX];   /* the blocks this process holds */
static int nreserved;

static void release(void) {   /* at exit: the blocks still naming this process */
    char target[32], mine[32];
    snprintf(mine, sizeof mine, "%d", (int)getpid());
    for (int k = 0; k < nreserved; k++) {
        ssize_t n = readlink(reserved[k], target, sizeof target - 1);
        if (n > 0 && (target[n] = 0, !strcmp(target, mine))) unlink(reserved[k]);
    }
}

static int listening(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int up = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return up;
}

int test_free_port(void) {
    const char *tmp = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
    char dir[PATH_MAX - 16], path[PATH_MAX], pid[32];
    snprintf(dir, sizeof dir, "%s/ps-test-ports", tmp);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "test_free_port: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    for (int tries = 0; tries < 200; tries++) {
        int b = rand() % BLOCKS;
        snprintf(path, sizeof path, "%s/%d", dir, b);
        if (symlink(pid, path) != 0) {
            char owner[32];
            ssize_t n = readlink(path, owner, sizeof owner - 1);
            if (n <= 0) continue;
            owner[n] = 0;
            if (kill((pid_t)atoi(owner), 0) == 0 || errno != ESRCH) continue;   /* its owner runs */
            unlink(path);   /* a killed test's block */
            if (symlink(pid, path) != 0) continue;
        }
        if (nreserved == 0) atexit(release);
        if (nreserved < 16) snprintf(reserved[nreserved++], PATH_MAX, "%s", path);
        int port = FIRST + BLOCK * b, busy = 0;
        for (int i = 0; i < BLOCK && !busy; i++) busy = listening(port + i);
        if (busy) continue;   /* held by something else: kept reserved until exit, another tried */
        return port;
    }
    fprintf(stderr, "test_free_port: no free block of %d ports in %s\n", BLOCK, dir);
    return -1;
}
