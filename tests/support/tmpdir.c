/* tmpdir.c - removing a test's temporary directory tree (tmpdir.h): the one
 * helper every test that writes files into a mkdtemp directory ends with. */
#include "tmpdir.h"

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    if (remove(path) == 0) return 0;
    fprintf(stderr, "could not remove %s%s: %s\n", path, flag == FTW_DP ? "/" : "", strerror(errno));
    return -1;
}

int test_rmtree(const char *dir) {
    if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0) return 0;
    if (errno) fprintf(stderr, "could not remove %s: %s\n", dir, strerror(errno));
    return -1;
}
