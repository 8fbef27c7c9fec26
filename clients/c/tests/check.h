/* Tiny test harness shared by the C client's tests. */
#ifndef CVD_CHECK_H
#define CVD_CHECK_H

#include <stdio.h>

extern int checks_passed, checks_failed;

/* Counts a failure and prints it in one write, so that lines of concurrent
 * trainer processes do not interleave. */
void check_fail(const char *file, int line, const char *fmt, ...);

#define CHECK(cond, ...) do { \
	if (cond) checks_passed++; else check_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)

int run_vector_tests(const char *path);
void run_scripted_tests(void);
/* Returns 0 if the daemon tests ran (see the counters), 1 if skipped. */
int run_daemon_tests(const char *bin);

#endif
