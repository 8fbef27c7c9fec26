/* mixed_trainer.c - the C trainer of the mixed-language world test
 * (clients/python/tests/test_languages.py): per size, the same calls as
 * `collectived bench-trainer` makes (cmd/collectived/benchtrainer.go,
 * measure): float32 sums of x[i] = (rank + 1) * (i % 7 + 1), one checked
 * call, warmup + iters more, the last on fresh values and checked again.
 *
 *   mixed_trainer SOCKET JOB LOCAL_RANK SIZES WARMUP ITERS NO_LANE
 *
 * Prints "ok <lane>" and exits 0 when every check passed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../collectived.h"

static void fill(float *x, size_t n, int rank)
{
	size_t i;
	for (i = 0; i < n; i++)
		x[i] = (float)((rank + 1) * (int)(i % 7 + 1));
}

static int check(const float *x, size_t n, int size, size_t bytes)
{
	size_t i;
	for (i = 0; i < n; i++) {
		float want = (float)((int)(i % 7 + 1) * size * (size + 1) / 2);
		if (x[i] != want) {
			fprintf(stderr, "mixed_trainer: %lu bytes: element %lu = %g, want %g\n",
				(unsigned long)bytes, (unsigned long)i, x[i], want);
			return -1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	cvd_options o;
	cvd_error err;
	cvd_client *c;
	char *sizes, *tok;
	int warmup, iters, k;
	if (argc != 8) {
		fprintf(stderr, "usage: mixed_trainer SOCKET JOB LOCAL_RANK SIZES WARMUP ITERS NO_LANE\n");
		return 2;
	}
	cvd_options_init(&o);
	o.job = argv[2];
	o.local_rank = atoi(argv[3]);
	o.label = "mixed_trainer (C)";
	o.rank_retry_ms = 5000;
	o.no_lane = atoi(argv[7]);
	warmup = atoi(argv[5]);
	iters = atoi(argv[6]);
	c = cvd_connect(argv[1], &o, &err);
	if (!c) {
		fprintf(stderr, "mixed_trainer: %s\n", err.message);
		return 1;
	}
	sizes = strdup(argv[4]);
	for (tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
		size_t bytes = strtoul(tok, NULL, 10), n = bytes / 4 ? bytes / 4 : 1;
		float *x = (float *)malloc(n * sizeof *x);
		int calls = 1 + warmup + iters;
		fill(x, n, cvd_rank(c));
		for (k = 0; k < calls; k++) {
			if (k == calls - 1)
				fill(x, n, cvd_rank(c));
			if (cvd_allreduce(c, x, n, CVD_FLOAT32, CVD_SUM, &err) != 0) {
				fprintf(stderr, "mixed_trainer: %lu bytes, call %d: %s\n", (unsigned long)bytes, k,
					err.message);
				return 1;
			}
			if ((k == 0 || k == calls - 1) && check(x, n, cvd_size(c), bytes) != 0)
				return 1;
		}
		free(x);
	}
	printf("ok %d\n", cvd_has_lane(c));
	free(sizes);
	cvd_close(c);
	return 0;
}
