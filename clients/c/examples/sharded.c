/* sharded.c - one step of sharded data-parallel training, as ZeRO and
 * FSDP do it: reduce_scatter averages the bfloat16 gradients and leaves
 * each trainer the shard it owns, the trainer updates its shard of the
 * parameters, and allgather puts the updated shards together again on
 * every trainer. Needs a daemon of protocol version 3.
 *
 * Run one copy per trainer, e.g. with a daemon serving job "demo":
 *   COLLECTIVED_SOCKET=/run/collectived/collectived.sock COLLECTIVED_JOB=demo ./sharded [N]
 */
#include <stdio.h>
#include <stdlib.h>

#include "collectived.h"

int main(int argc, char **argv)
{
	size_t n = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1u << 20, shard, i, bad = 0;
	cvd_error err;
	cvd_options o;
	cvd_client *c;
	uint16_t *grad, *gshard, *params, *pshard;
	int rank, size;
	cvd_options_init(&o);
	o.label = "examples/sharded";
	o.rank_retry_ms = 10000;
	c = cvd_connect(NULL, &o, &err);
	if (!c) {
		fprintf(stderr, "sharded: %s\n", err.message);
		return 1;
	}
	rank = cvd_rank(c);
	size = cvd_size(c);
	n -= n % (size_t)size; /* reduce_scatter splits the vector evenly */
	shard = n / (size_t)size;
	/* gradients and parameters in daemon segments: no data on the socket */
	grad = (uint16_t *)cvd_alloc(c, n * 2, &err);
	params = grad ? (uint16_t *)cvd_alloc(c, n * 2, &err) : NULL;
	gshard = (uint16_t *)malloc(shard * 2 + 1);
	if (!grad || !params || !gshard) {
		fprintf(stderr, "sharded: %s\n", err.message);
		cvd_close(c);
		return 1;
	}
	for (i = 0; i < n; i++) {
		grad[i] = cvd_f32_to_bf16((float)(rank + 1)); /* every trainer's own gradient */
		params[i] = cvd_f32_to_bf16(1.0f);
	}
	/* the average of the gradients, this trainer's shard of it */
	if (cvd_reduce_scatter(c, grad, gshard, n, CVD_BFLOAT16, CVD_AVG, NULL, &err) != 0) {
		fprintf(stderr, "sharded: reduce_scatter: %s (%s)\n", err.message, cvd_strerror(err.code));
		cvd_close(c);
		return 1;
	}
	/* update the shard it owns (in float32), in place in the parameters */
	pshard = params + (size_t)rank * shard;
	for (i = 0; i < shard; i++)
		pshard[i] = cvd_f32_to_bf16(cvd_bf16_to_f32(pshard[i]) - 0.5f * cvd_bf16_to_f32(gshard[i]));
	/* every trainer gets every shard: the input is its own block of the output */
	if (cvd_allgather(c, pshard, params, shard, CVD_BFLOAT16, NULL, &err) != 0) {
		fprintf(stderr, "sharded: allgather: %s (%s)\n", err.message, cvd_strerror(err.code));
		cvd_close(c);
		return 1;
	}
	/* the mean gradient is (size + 1) / 2: each parameter 1 - (size + 1) / 4 */
	for (i = 0; i < n; i++)
		bad += cvd_bf16_to_f32(params[i]) != 1.0f - (float)(size + 1) / 4;
	printf("rank %d/%d: sharded step over %lu bfloat16s: params[0] = %g, %s\n", rank, size, (unsigned long)n,
	       cvd_bf16_to_f32(params[0]), bad ? "WRONG" : "OK");
	free(gshard);
	cvd_close(c);
	return bad ? 1 : 0;
}
