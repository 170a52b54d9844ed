#include "../check.h"

int check_count_ = 0, check_failed_ = 0;

int check_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_count_, check_failed_);
    return check_failed_ ? 1 : 0;
}

int check_skip(const char *name, const char *why) {
    printf("%s: skipped: %s\n", name, why);
    return 77;
}
