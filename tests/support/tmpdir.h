/* tmpdir.h - removing a test's temporary directory (made with mkdtemp)
 * when the test is done. */
#ifndef PS_TEST_TMPDIR_H
#define PS_TEST_TMPDIR_H

/* Removes dir and everything below it, without a shell (links are removed,
 * never followed). Returns 0, or -1 after printing on stderr what could not
 * be removed and why. */
int test_rmtree(const char *dir);

#endif
