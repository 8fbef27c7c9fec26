/* The C client's tests: codec against the shared vectors, then the client
 * against real daemons. Usage: test_collectived VECTORS.txt [DAEMON_BIN|-] [SKIP_REASON]
 * Ends with the line "N passed, N failed". */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

int checks_passed, checks_failed;

void check_fail(const char *file, int line, const char *fmt, ...)
{
	char buf[2048];
	int n;
	va_list ap;
	checks_failed++;
	n = snprintf(buf, sizeof buf, "FAIL %s:%d: ", file, line);
	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", buf);
}

int main(int argc, char **argv)
{
	const char *vectors = argc > 1 ? argv[1] : "../testdata/vectors.txt";
	const char *bin = argc > 2 ? argv[2] : "";
	const char *why = argc > 3 ? argv[3] : "no daemon binary given";
	int skipped = 0;
	run_vector_tests(vectors);
	run_scripted_tests();
	if (bin[0] && strcmp(bin, "-") != 0)
		skipped = run_daemon_tests(bin);
	else {
		printf("daemon tests skipped: %s\n", why);
		skipped = 1;
	}
	if (skipped)
		printf("%d passed, %d failed, 1 skipped\n", checks_passed, checks_failed);
	else
		printf("%d passed, %d failed\n", checks_passed, checks_failed);
	return checks_failed ? 1 : 0;
}
