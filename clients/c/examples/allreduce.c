/* allreduce.c - sum a vector across every trainer of the world.
 *
 * Run one copy per trainer, e.g. with a daemon serving job "demo":
 *   COLLECTIVED_SOCKET=/run/collectived/collectived.sock COLLECTIVED_JOB=demo ./allreduce [N]
 */
#include <stdio.h>
#include <stdlib.h>

#include "collectived.h"

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1u << 20, i, bad = 0;
	cvd_error err;
	cvd_options o;
	cvd_client *c;
	float *x;
	int rank, size;
	cvd_options_init(&o); /* job from $COLLECTIVED_JOB, any free local rank */
	o.label = "examples/allreduce";
	o.rank_retry_ms = 10000; /* a just-exited predecessor may still hold our rank */
	c = cvd_connect(NULL, &o, &err); /* socket from $COLLECTIVED_SOCKET */
	if (!c) {
		fprintf(stderr, "allreduce: %s\n", err.message);
		return 1;
	}
	rank = cvd_rank(c);
	size = cvd_size(c);
	/* in a daemon segment: the allreduce sends no data through the socket */
	x = (float *)cvd_alloc(c, n * sizeof *x, &err);
	if (!x) {
		fprintf(stderr, "allreduce: %s\n", err.message);
		cvd_close(c);
		return 1;
	}
	for (i = 0; i < n; i++)
		x[i] = (float)(rank + 1);
	if (cvd_allreduce(c, x, n, CVD_FLOAT32, CVD_SUM, &err) != 0) {
		fprintf(stderr, "allreduce: %s (%s)\n", err.message, cvd_strerror(err.code));
		cvd_close(c);
		return 1;
	}
	for (i = 0; i < n; i++)
		bad += x[i] != (float)size * (size + 1) / 2;
	printf("rank %d/%d: allreduce of %lu floats: x[0] = %g, %s\n", rank, size, (unsigned long)n,
	       x[0], bad ? "WRONG" : "OK");
	cvd_close(c);
	return bad ? 1 : 0;
}
