/* Named calls (protocol version 4) on worlds of real daemons: every rank
 * makes the same named calls in its own order, and each meets its
 * partners by name (docs/PROTOCOL.md, "Named calls"; docs/MATCHING.md).
 * Skipped, saying so, against a daemon whose status has no "named"
 * object: one that matches named calls by order still. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../collectived.h"
#include "check.h"
#include "world.h"

#define K 6 /* names */

static const char *const names[K] = {"layer0.w", "layer0.b", "layer1.w", "layer1.b", "head.w", "head.b"};

/* The order rank r makes its named calls in, round `round`: rotated by
 * the rank, reversed on odd ranks, so that no two neighbours agree. */
static int order(int r, int round, int j)
{
	int k = (j + r + round) % K;
	return r % 2 ? K - 1 - k : k;
}

/* Element i of rank r's input to name k, round `round`. */
static float named_input(int r, int k, int round, size_t i)
{
	return (float)((r + 1) * (k + 1) + (int)i + 100 * round);
}

/* Named allreduces of K names, all in flight, started in a different
 * order on every rank, then waited in that order; two rounds (the k-th
 * call of a name meets the k-th), an ordered barrier between them (a
 * fence), and an ordered call after. */
static void named_out_of_order(cvd_client *c, const world *w)
{
	int rank = cvd_rank(c), size = cvd_size(c), round, j, r;
	cvd_call_opts opts;
	cvd_error err;
	(void)w;
	for (round = 0; round < 2; round++) {
		cvd_request *reqs[K];
		float *bufs[K];
		for (j = 0; j < K; j++) {
			int k = order(rank, round, j);
			size_t n = (size_t)(k + 1) * 3, i;
			bufs[j] = (float *)malloc(n * sizeof(float));
			for (i = 0; i < n; i++)
				bufs[j][i] = named_input(rank, k, round, i);
			cvd_call_opts_init(&opts);
			opts.named = 1;
			opts.name = names[k];
			reqs[j] = cvd_allreduce_opts_async(c, bufs[j], n, CVD_FLOAT32, CVD_SUM, &opts, &err);
			CHECK(reqs[j] != NULL, "round %d: named call %s: %s", round, names[k], err.message);
		}
		for (j = 0; j < K; j++) {
			int k = order(rank, round, j);
			size_t n = (size_t)(k + 1) * 3, i, bad = 0;
			if (reqs[j]) {
				int rc = cvd_wait(reqs[j], -1, &err);
				CHECK(rc == 0, "round %d: named call %s: %d %s", round, names[k], rc, err.message);
				for (i = 0; rc == 0 && i < n; i++) {
					float want = 0;
					for (r = 0; r < size; r++)
						want += named_input(r, k, round, i);
					bad += bufs[j][i] != want;
				}
				CHECK(bad == 0, "round %d: named call %s: %lu of %lu elements wrong", round, names[k],
				      (unsigned long)bad, (unsigned long)n);
			}
			free(bufs[j]);
		}
		CHECK(cvd_barrier(c, &err) == 0, "round %d: the ordered barrier after the named calls: %s", round,
		      err.message);
	}
	{
		float x = 1;
		CHECK(cvd_allreduce(c, &x, 1, CVD_FLOAT32, CVD_SUM, &err) == 0 && x == (float)size,
		      "an ordered call after named ones: %s (%g)", err.message, x);
	}
}

/* Named calls of other ops in different orders: a broadcast from the last
 * rank, an allgather and a barrier, all in flight at once. */
static void named_ops_out_of_order(cvd_client *c, const world *w)
{
	int rank = cvd_rank(c), size = cvd_size(c), j, r;
	cvd_request *reqs[3] = {NULL, NULL, NULL};
	cvd_call_opts opts;
	cvd_call call;
	cvd_error err;
	double b[4];
	int32_t mine[2], all[2 * 16];
	size_t i, bad = 0;
	(void)w;
	for (i = 0; i < 4; i++)
		b[i] = rank * 10 + (double)i;
	mine[0] = rank;
	mine[1] = -rank;
	for (j = 0; j < 3; j++) {
		int k = rank % 2 ? 2 - j : (j + rank) % 3;
		cvd_call_opts_init(&opts);
		opts.named = 1;
		switch (k) {
		case 0:
			memset(&call, 0, sizeof call);
			call.op = CVD_BROADCAST;
			call.dtype = CVD_FLOAT64;
			call.root = (uint32_t)(size - 1);
			call.buf = b;
			call.count = 4;
			opts.name = "bcast";
			reqs[0] = cvd_call_async_opts(c, &call, NULL, NULL, &opts, &err);
			break;
		case 1:
			opts.name = "gather";
			reqs[1] = cvd_allgather_async(c, mine, all, 2, CVD_INT32, &opts, &err);
			break;
		default:
			memset(&call, 0, sizeof call);
			call.op = CVD_BARRIER;
			opts.name = "fence";
			reqs[2] = cvd_call_async_opts(c, &call, NULL, NULL, &opts, &err);
			break;
		}
		CHECK(reqs[k] != NULL, "named op %d: %s", k, err.message);
	}
	for (j = 0; j < 3; j++)
		CHECK(reqs[j] && cvd_wait(reqs[j], -1, &err) == 0, "named op %d: %s", j, err.message);
	for (i = 0; i < 4; i++)
		bad += b[i] != (size - 1) * 10 + (double)i;
	for (r = 0; r < size; r++)
		bad += all[2 * r] != r || all[2 * r + 1] != -r;
	CHECK(bad == 0, "named broadcast and allgather: %lu values wrong", (unsigned long)bad);
	CHECK(cvd_barrier(c, &err) == 0, "the ordered barrier after named ops: %s", err.message);
}

/* Whether the world's daemons match named calls by name: their status
 * has the "named" object (docs/PROTOCOL.md, STATUS). */
static int daemon_names(const world *w)
{
	cvd_options o;
	cvd_error err;
	cvd_client *c;
	char *js;
	int yes = 0;
	cvd_options_init(&o);
	o.job = JOB;
	o.observer = 1;
	c = cvd_connect(w->sock[0], &o, &err);
	CHECK(c != NULL, "observer: %s", err.message);
	if (!c)
		return 0;
	js = cvd_status(c, NULL, &err);
	CHECK(js != NULL, "status: %s", err.message);
	yes = js && strstr(js, "\"named\":") != NULL;
	free(js);
	cvd_close(c);
	return yes;
}

void run_v4_daemon_tests(const world *w)
{
	if (!daemon_names(w)) {
		printf("named-call tests skipped on world %dx%d: the daemon's status has no \"named\" object "
		       "(it does not match named calls by name yet)\n", w->nodes, w->local);
		return;
	}
	run_trainers(w, named_out_of_order, "named_out_of_order", 120);
	run_trainers(w, named_ops_out_of_order, "named_ops_out_of_order", 120);
}
