/* The collectives of protocol version 3 against real daemons (worlds of
 * test_daemon.c): allgather(v), reduce_scatter(v), reduce, the dtypes
 * float16, bfloat16, int8 and uint8, avg, scale factors and shapes, over
 * every way a buffer travels, with exact expected results, and the
 * errors of bad input.
 *
 * Inputs are small integers, exact in every dtype, so that a sum does not
 * depend on its order; integer sums of int8 and uint8 are made to wrap.
 * Expected float results follow docs/PROTOCOL.md, Reductions: each
 * node's partial (its local trainers' inputs, prescaled, folded in
 * float32) rounded to the 16-bit type, the nodes' partials folded in
 * float32, divided by the world size for avg, multiplied by postscale,
 * rounded once (v3_rounding picks values where those roundings are ties
 * and near-ties). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../collectived.h"
#include "check.h"
#include "world.h"

static const cvd_dtype all_dtypes[] = {CVD_FLOAT32, CVD_FLOAT64, CVD_INT32, CVD_INT64, CVD_BYTES,
				       CVD_FLOAT16, CVD_BFLOAT16, CVD_INT8, CVD_UINT8};
#define NDTYPES (sizeof all_dtypes / sizeof all_dtypes[0])
static const char *const dt_names[] = {"none", "float32", "float64", "int32", "int64", "bytes",
				       "float16", "bfloat16", "int8", "uint8"};
static const char *const op_names[] = {"none", "sum", "prod", "max", "min", "avg"};

static int is_float(cvd_dtype t)
{
	return t == CVD_FLOAT32 || t == CVD_FLOAT64 || t == CVD_FLOAT16 || t == CVD_BFLOAT16;
}

/* A value as its dtype holds it: i for the integer types (and bytes), f
 * for the float ones. */
typedef struct tv {
	int64_t i;
	double f;
} tv;

/* v as dtype t holds it: integers wrap to the type's width. */
static tv typed(cvd_dtype t, int64_t v)
{
	tv x;
	x.i = 0;
	x.f = 0;
	switch (t) {
	case CVD_INT8: x.i = (int8_t)(uint8_t)(uint64_t)v; break;
	case CVD_UINT8: case CVD_BYTES: x.i = (uint8_t)(uint64_t)v; break;
	case CVD_INT32: x.i = (int32_t)(uint32_t)(uint64_t)v; break;
	case CVD_INT64: x.i = v; break;
	default: x.f = (double)v; break;
	}
	return x;
}

static void store(void *buf, cvd_dtype t, size_t i, tv x)
{
	switch (t) {
	case CVD_FLOAT32: ((float *)buf)[i] = (float)x.f; break;
	case CVD_FLOAT64: ((double *)buf)[i] = x.f; break;
	case CVD_INT32: ((int32_t *)buf)[i] = (int32_t)x.i; break;
	case CVD_INT64: ((int64_t *)buf)[i] = x.i; break;
	case CVD_FLOAT16: ((uint16_t *)buf)[i] = cvd_f32_to_f16((float)x.f); break;
	case CVD_BFLOAT16: ((uint16_t *)buf)[i] = cvd_f32_to_bf16((float)x.f); break;
	case CVD_INT8: ((int8_t *)buf)[i] = (int8_t)x.i; break;
	default: ((uint8_t *)buf)[i] = (uint8_t)x.i; break;
	}
}

static double shown(const void *buf, cvd_dtype t, size_t i)
{
	switch (t) {
	case CVD_FLOAT32: return ((const float *)buf)[i];
	case CVD_FLOAT64: return ((const double *)buf)[i];
	case CVD_INT32: return ((const int32_t *)buf)[i];
	case CVD_INT64: return (double)((const int64_t *)buf)[i];
	case CVD_FLOAT16: return cvd_f16_to_f32(((const uint16_t *)buf)[i]);
	case CVD_BFLOAT16: return cvd_bf16_to_f32(((const uint16_t *)buf)[i]);
	case CVD_INT8: return ((const int8_t *)buf)[i];
	default: return ((const uint8_t *)buf)[i];
	}
}

/* Element i of world rank r's input for reduce op op (salt varies it per
 * call): products of 2, -1 and 1; else -5..5, times 29 for int8 and uint8
 * sums so that they wrap. */
static tv input(cvd_dtype t, cvd_op op, int r, size_t i, int salt)
{
	int64_t v;
	if (op == CVD_PROD) {
		int k = (int)((r + i + (size_t)salt) % 3);
		v = k == 0 ? 2 : (k == 1 ? -1 : 1);
	} else {
		v = (int64_t)((r * 7 + (int)(i % 13) * 3 + salt) % 11) - 5;
		if ((t == CVD_INT8 || t == CVD_UINT8) && op == CVD_SUM)
			v *= 29;
	}
	return typed(t, v);
}

/* x rounded to dtype t and back, as a float32 leaving the daemon's
 * arithmetic is. */
static float round_to(cvd_dtype t, float x)
{
	if (t == CVD_FLOAT16)
		return cvd_f16_to_f32(cvd_f32_to_f16(x));
	if (t == CVD_BFLOAT16)
		return cvd_bf16_to_f32(cvd_f32_to_bf16(x));
	return x;
}

static double fold_d(cvd_op op, double a, double b)
{
	switch (op) {
	case CVD_PROD: return a * b;
	case CVD_MAX: return b > a ? b : a;
	case CVD_MIN: return b < a ? b : a;
	default: return a + b;
	}
}

static float fold_f(cvd_op op, float a, float b)
{
	switch (op) {
	case CVD_PROD: return a * b;
	case CVD_MAX: return b > a ? b : a;
	case CVD_MIN: return b < a ? b : a;
	default: return a + b;
	}
}

/* The reduction of x[0..size) (world rank order) by op, as the daemon
 * computes it in a world of nodes x local (docs/PROTOCOL.md, Reductions);
 * pre and post: the scale factors (1: none). */
static tv reduction(const world *w, cvd_dtype t, cvd_op op, const tv *x, double pre, double post)
{
	tv out;
	int n, l;
	out.i = 0;
	out.f = 0;
	if (!is_float(t)) {
		uint64_t acc = (uint64_t)x[0].i;
		for (n = 1; n < w->size; n++) {
			switch (op) {
			case CVD_PROD: acc *= (uint64_t)x[n].i; break;
			case CVD_MAX: acc = x[n].i > (int64_t)acc ? (uint64_t)x[n].i : acc; break;
			case CVD_MIN: acc = x[n].i < (int64_t)acc ? (uint64_t)x[n].i : acc; break;
			default: acc += (uint64_t)x[n].i; break;
			}
		}
		return typed(t, (int64_t)acc);
	}
	if (t == CVD_FLOAT64) {
		double acc = 0;
		for (n = 0; n < w->size; n++)
			acc = n ? fold_d(op, acc, x[n].f * pre) : x[n].f * pre;
		if (op == CVD_AVG)
			acc /= w->size;
		out.f = acc * post;
		return out;
	}
	{
		float acc = 0;
		for (n = 0; n < w->nodes; n++) {
			float part = 0;
			for (l = 0; l < w->local; l++) {
				float v = (float)x[n * w->local + l].f * (float)pre;
				part = l ? fold_f(op, part, v) : v;
			}
			part = round_to(t, part); /* the node's partial, written to the ring */
			acc = n ? fold_f(op, acc, part) : part;
		}
		if (op == CVD_AVG)
			acc /= (float)w->size;
		acc *= (float)post;
		out.f = (double)round_to(t, acc); /* the final value, written once */
		return out;
	}
}

/* Report the first byte-wise difference of got and want (n elements of t). */
static void check_same(const void *got, const void *want, size_t n, cvd_dtype t, const char *what)
{
	size_t es = cvd_dtype_size(t), i;
	for (i = 0; i < n; i++)
		if (memcmp((const uint8_t *)got + i * es, (const uint8_t *)want + i * es, es) != 0)
			break;
	CHECK(i == n, "%s: element %lu of %lu is %.9g, want %.9g", what, (unsigned long)i, (unsigned long)n,
	      i < n ? shown(got, t, i) : 0.0, i < n ? shown(want, t, i) : 0.0);
}

/* How the buffers travel: plain memory inline, both in a segment, plain
 * memory through scratch segments, the input in a segment and the output
 * in plain memory, in place in a segment. */
enum { P_INLINE, P_SEGMENT, P_SCRATCH, P_MIXED, P_IN_PLACE, NPATHS };
static const char *const path_names[] = {"inline", "segment", "scratch", "mixed", "in place"};

/* A buffer of n bytes: from a segment (cvd_alloc) or malloc. */
static void *get_buf(cvd_client *c, size_t n, int shm)
{
	cvd_error err;
	void *p = shm ? cvd_alloc(c, n ? n : 1, &err) : malloc(n ? n : 1);
	CHECK(p != NULL, "no buffer of %lu bytes: %s", (unsigned long)n, shm ? err.message : "malloc");
	return p;
}

static void put_buf(cvd_client *c, void *p, int shm)
{
	cvd_error err;
	if (shm)
		CHECK(cvd_free(c, p, &err) == 0, "cvd_free: %s", err.message);
	else
		free(p);
}

/* Per-rank counts of an allgatherv or reduce_scatterv: some zero (rank 1
 * has none), scaled by k. */
static void make_counts(uint64_t *counts, int size, uint64_t k)
{
	int j;
	for (j = 0; j < size; j++)
		counts[j] = (uint64_t)((j * 3 + 1) % 4) * k;
}

/* allgather and allgatherv of every dtype over every path. */
static void v3_allgather(cvd_client *c, const world *w)
{
	int rank = cvd_rank(c), size = cvd_size(c), v, p;
	size_t d;
	cvd_error err;
	for (v = 0; v < 2; v++) {
		for (p = 0; p < NPATHS; p++) {
			for (d = 0; d < NDTYPES; d++) {
				cvd_dtype t = all_dtypes[d];
				size_t es = cvd_dtype_size(t), k = p == P_SCRATCH || p == P_MIXED ? 600 : 3, i, j, at;
				uint64_t counts[16], total = 0, mine;
				uint8_t *seg = NULL, *in, *out, *want;
				char what[96];
				int rc, shm = p == P_SEGMENT || p == P_IN_PLACE;
				make_counts(counts, size, k);
				if (!v)
					for (j = 0; j < (size_t)size; j++)
						counts[j] = k;
				for (j = 0; j < (size_t)size; j++)
					total += counts[j];
				mine = counts[rank];
				snprintf(what, sizeof what, "%s %s %s", v ? "allgatherv" : "allgather", path_names[p],
					 dt_names[t]);
				/* one segment: the output first, then the input (in place:
				 * the input is the caller's block of the output) */
				if (shm || p == P_MIXED)
					seg = (uint8_t *)get_buf(c, (total + mine) * es + 64, 1);
				if ((shm || p == P_MIXED) && !seg)
					continue;
				out = shm ? seg : (uint8_t *)malloc(total * es + 1);
				in = p == P_IN_PLACE ? seg : p == P_MIXED ? seg : shm ? seg + total * es + 64 - (64 % es)
									      : (uint8_t *)malloc(mine * es + 1);
				if (p == P_IN_PLACE)
					for (j = 0; j < (size_t)rank; j++)
						in += counts[j] * es;
				want = (uint8_t *)malloc(total * es + 1);
				memset(out, 0xee, total * es);
				for (i = 0; i < mine; i++)
					store(in, t, i, input(t, CVD_SUM, rank, i, (int)d));
				for (j = 0, at = 0; j < (size_t)size; at += counts[j], j++)
					for (i = 0; i < counts[j]; i++)
						store(want, t, at + i, input(t, CVD_SUM, (int)j, i, (int)d));
				rc = v ? cvd_allgatherv(c, in, mine, out, counts, t, NULL, &err)
				       : cvd_allgather(c, in, out, mine, t, NULL, &err);
				CHECK(rc == 0, "%s: %s", what, err.message);
				if (rc == 0)
					check_same(out, want, total, t, what);
				free(want);
				if (!shm)
					free(out);
				if (!shm && p != P_MIXED)
					free(in);
				if (seg)
					put_buf(c, seg, 1);
			}
		}
	}
	(void)w;
}

/* reduce_scatter(v) of every reducible dtype and op over every path but in
 * place, which reduce_scatter_in_place covers. */
static void v3_reduce_scatter(cvd_client *c, const world *w)
{
	static const cvd_op ops[] = {CVD_SUM, CVD_PROD, CVD_MAX, CVD_MIN, CVD_AVG};
	int rank = cvd_rank(c), size = cvd_size(c), v, p;
	size_t d, o;
	cvd_error err;
	for (v = 0; v < 2; v++) {
		for (p = 0; p < P_IN_PLACE; p++) {
			for (d = 0; d < NDTYPES; d++) {
				cvd_dtype t = all_dtypes[d];
				if (t == CVD_BYTES)
					continue;
				for (o = 0; o < sizeof ops / sizeof ops[0]; o++) {
					size_t es = cvd_dtype_size(t), k = p == P_SCRATCH || p == P_MIXED ? 700 : 3, i, j;
					uint64_t counts[16], total = 0, start = 0, mine;
					uint8_t *in, *out, *want;
					tv x[16];
					char what[96];
					int rc, shm_in = p == P_SEGMENT || p == P_MIXED, shm_out = p == P_SEGMENT;
					if (ops[o] == CVD_AVG && !is_float(t))
						continue;
					make_counts(counts, size, k);
					if (!v)
						for (j = 0; j < (size_t)size; j++)
							counts[j] = k;
					for (j = 0; j < (size_t)size; j++) {
						if ((int)j < rank)
							start += counts[j];
						total += counts[j];
					}
					mine = counts[rank];
					snprintf(what, sizeof what, "%s %s %s %s", v ? "reduce_scatterv" : "reduce_scatter",
						 path_names[p], dt_names[t], op_names[ops[o]]);
					in = (uint8_t *)get_buf(c, total * es, shm_in);
					out = (uint8_t *)get_buf(c, mine * es, shm_out);
					want = (uint8_t *)malloc(mine * es + 1);
					if (!in || !out || !want)
						continue;
					for (i = 0; i < total; i++)
						store(in, t, i, input(t, ops[o], rank, i, (int)o));
					memset(out, 0xee, mine * es);
					for (i = 0; i < mine; i++) {
						for (j = 0; j < (size_t)size; j++)
							x[j] = input(t, ops[o], (int)j, start + i, (int)o);
						store(want, t, i, reduction(w, t, ops[o], x, 1, 1));
					}
					rc = v ? cvd_reduce_scatterv(c, in, total, out, counts, t, ops[o], NULL, &err)
					       : cvd_reduce_scatter(c, in, out, total, t, ops[o], NULL, &err);
					CHECK(rc == 0, "%s: %s", what, err.message);
					if (rc == 0)
						check_same(out, want, mine, t, what);
					free(want);
					put_buf(c, in, shm_in);
					put_buf(c, out, shm_out);
				}
			}
		}
	}
}

/* reduce_scatter with its output the caller's own block of its input, in
 * a segment; allgather in place is in v3_allgather. */
static void reduce_scatter_in_place(cvd_client *c, const world *w)
{
	int rank = cvd_rank(c), size = cvd_size(c);
	size_t n = 5, i, j;
	int32_t *seg = (int32_t *)get_buf(c, n * (size_t)size * 4, 1), want[5];
	cvd_error err;
	tv x[16];
	if (!seg)
		return;
	for (i = 0; i < n * (size_t)size; i++)
		store(seg, CVD_INT32, i, input(CVD_INT32, CVD_SUM, rank, i, 1));
	for (i = 0; i < n; i++) {
		for (j = 0; j < (size_t)size; j++)
			x[j] = input(CVD_INT32, CVD_SUM, (int)j, (size_t)rank * n + i, 1);
		store(want, CVD_INT32, i, reduction(w, CVD_INT32, CVD_SUM, x, 1, 1));
	}
	CHECK(cvd_reduce_scatter(c, seg, seg + (size_t)rank * n, n * (size_t)size, CVD_INT32, CVD_SUM, NULL, &err) == 0,
	      "reduce_scatter in place: %s", err.message);
	check_same(seg + (size_t)rank * n, want, n, CVD_INT32, "reduce_scatter in place");
	put_buf(c, seg, 1);
}

/* reduce to the last rank and to rank 0, and allreduce, of every
 * reducible dtype and op, inline, in a segment and through scratch; the
 * root gets the reduction, the others keep their input. */
static void v3_reduce_allreduce(cvd_client *c, const world *w)
{
	static const cvd_op ops[] = {CVD_SUM, CVD_PROD, CVD_MAX, CVD_MIN, CVD_AVG};
	int rank = cvd_rank(c), size = cvd_size(c), p, kind;
	size_t d, o;
	cvd_error err;
	for (kind = 0; kind < 3; kind++) { /* reduce to size-1, reduce to 0, allreduce */
		for (p = 0; p < P_MIXED; p++) {
			for (d = 0; d < NDTYPES; d++) {
				cvd_dtype t = all_dtypes[d];
				if (t == CVD_BYTES)
					continue;
				for (o = 0; o < sizeof ops / sizeof ops[0]; o++) {
					size_t es = cvd_dtype_size(t), n = p == P_SCRATCH ? 3000 : 7, i, j;
					uint32_t root = kind == 0 ? (uint32_t)(size - 1) : 0;
					uint8_t *buf, *want;
					tv x[16];
					char what[96];
					int rc, shm = p == P_SEGMENT, gets = kind == 2 || (uint32_t)rank == root;
					if (ops[o] == CVD_AVG && !is_float(t))
						continue;
					snprintf(what, sizeof what, "%s %s %s %s (root %u)", kind == 2 ? "allreduce" : "reduce",
						 path_names[p], dt_names[t], op_names[ops[o]], root);
					buf = (uint8_t *)get_buf(c, n * es, shm);
					want = (uint8_t *)malloc(n * es);
					if (!buf || !want)
						continue;
					for (i = 0; i < n; i++) {
						store(buf, t, i, input(t, ops[o], rank, i, kind));
						for (j = 0; j < (size_t)size; j++)
							x[j] = input(t, ops[o], (int)j, i, kind);
						store(want, t, i, gets ? reduction(w, t, ops[o], x, 1, 1) : x[rank]);
					}
					rc = kind == 2 ? cvd_allreduce(c, buf, n, t, ops[o], &err)
						       : cvd_reduce(c, buf, n, t, ops[o], root, NULL, &err);
					CHECK(rc == 0, "%s: %s", what, err.message);
					if (rc == 0)
						check_same(buf, want, n, t, what);
					free(want);
					put_buf(c, buf, shm);
				}
			}
		}
	}
}

/* Where the 16-bit types round: element e of a pattern of 6, for the
 * 16-bit type with f fraction bits (u = 2^-f, the step at 1): rank 0 and
 * the last rank hold the values below, the others 0, so that every node's
 * partial is exact and the total is (0) 1 + 1.5u, a tie, up to even; (1)
 * 1 + u/2, a tie, down to even; (2) 1 + 0.75u, up; (3) 1 + 0.25u, down;
 * (4) -(1 + 1.5u); (5) small integers on every rank. */
static tv rounding_input(cvd_dtype t, int r, int size, size_t i)
{
	double u = t == CVD_FLOAT16 ? 1.0 / 1024 : 1.0 / 128, first[] = {1 + u, 1, 1, 1, -1 - u},
	       last[] = {u / 2, u / 2, 0.75 * u, 0.25 * u, -u / 2};
	size_t e = i % 6;
	tv x;
	x.i = 0;
	x.f = 0;
	if (e == 5)
		return typed(t, (int64_t)((r * 5 + (int)i) % 7) - 3);
	if (r == 0)
		x.f += first[e];
	if (r == size - 1)
		x.f += last[e];
	x.f = (double)round_to(t, (float)x.f); /* as stored (a world of one holds both) */
	return x;
}

/* float16 and bfloat16 sums and avgs whose results round, with and
 * without scale factors (prescale 2: still exact partials; postscale 3:
 * the final product rounds), by allreduce, reduce_scatter and reduce. */
static void v3_rounding(cvd_client *c, const world *w)
{
	static const cvd_dtype ts[] = {CVD_FLOAT16, CVD_BFLOAT16};
	static const double scales[][2] = {{1, 1}, {2, 1}, {1, 3}, {0.5, 3}};
	int rank = cvd_rank(c), size = cvd_size(c), a, s, kind;
	cvd_call_opts opts;
	cvd_error err;
	for (a = 0; a < 2; a++) {
		for (s = 0; s < 4; s++) {
			for (kind = 0; kind < 6; kind++) { /* allreduce, reduce_scatter, reduce; sum, avg */
				cvd_dtype t = ts[a];
				cvd_op op = kind % 2 ? CVD_AVG : CVD_SUM;
				size_t n = 12 * (size_t)size, i, j, lo = 0, len = n;
				uint16_t in[48], out[48], want[48];
				tv x[16];
				char what[96];
				int rc;
				cvd_call_opts_init(&opts);
				opts.prescale = scales[s][0];
				opts.postscale = scales[s][1];
				snprintf(what, sizeof what, "rounding: %s %s %s, prescale %g, postscale %g",
					 kind / 2 == 0 ? "allreduce" : kind / 2 == 1 ? "reduce_scatter" : "reduce",
					 dt_names[t], op_names[op], scales[s][0], scales[s][1]);
				for (i = 0; i < n; i++)
					store(in, t, i, rounding_input(t, rank, size, i));
				if (kind / 2 == 1) {
					lo = (size_t)rank * 12;
					len = 12;
				}
				for (i = 0; i < len; i++) {
					for (j = 0; j < (size_t)size; j++)
						x[j] = rounding_input(t, (int)j, size, lo + i);
					store(want, t, i, reduction(w, t, op, x, scales[s][0], scales[s][1]));
				}
				if (kind / 2 == 0) {
					rc = cvd_allreduce_opts(c, in, n, t, op, &opts, &err);
					memcpy(out, in, n * 2);
				} else if (kind / 2 == 1) {
					rc = cvd_reduce_scatter(c, in, out, n, t, op, &opts, &err);
				} else {
					rc = cvd_reduce(c, in, n, t, op, 0, &opts, &err);
					memcpy(out, in, n * 2);
					if (rank != 0) /* elsewhere: the input, as it was */
						for (i = 0; i < n; i++)
							store(want, t, i, rounding_input(t, rank, size, i));
				}
				CHECK(rc == 0, "%s: %s", what, err.message);
				if (rc == 0)
					check_same(out, want, len, t, what);
			}
		}
	}
}

/* Shapes: the same on every rank; an allgatherv whose first dimension is
 * each rank's own count; float32 avg with scale factors in a segment. */
static void v3_shapes_and_scale(cvd_client *c, const world *w)
{
	int rank = cvd_rank(c), size = cvd_size(c);
	uint64_t shape[3] = {2, 3, 1}, counts[16], total = 0;
	cvd_call_opts opts;
	cvd_error err;
	float x[6], want[6], *g;
	double all[64], dwant[64];
	size_t i, j, at;
	tv v[16];
	cvd_call_opts_init(&opts);
	opts.shape = shape;
	opts.ndim = 3;
	opts.name = "shaped";
	for (i = 0; i < 6; i++) {
		x[i] = (float)(rank + (int)i);
		want[i] = 0;
		for (j = 0; j < (size_t)size; j++)
			want[i] += (float)((int)j + (int)i);
	}
	CHECK(cvd_allreduce_opts(c, x, 6, CVD_FLOAT32, CVD_SUM, &opts, &err) == 0, "allreduce with a shape: %s",
	      err.message);
	check_same(x, want, 6, CVD_FLOAT32, "allreduce with a shape");
	/* allgatherv: shape (own count, 2) */
	for (j = 0; j < (size_t)size; j++) {
		counts[j] = 2 * (j % 3 + 1);
		total += counts[j];
	}
	shape[0] = counts[rank] / 2;
	shape[1] = 2;
	opts.ndim = 2;
	for (i = 0; i < counts[rank]; i++)
		x[i] = (float)(100 * rank + (int)i);
	for (j = 0, at = 0; j < (size_t)size; at += counts[j], j++)
		for (i = 0; i < counts[j]; i++)
			dwant[at + i] = (double)(100 * (int)j + (int)i);
	{
		double mine[6];
		for (i = 0; i < counts[rank]; i++)
			mine[i] = x[i];
		CHECK(cvd_allgatherv(c, mine, counts[rank], all, counts, CVD_FLOAT64, &opts, &err) == 0,
		      "allgatherv with a shape of its own count: %s", err.message);
	}
	check_same(all, dwant, total, CVD_FLOAT64, "allgatherv with a shape");
	/* avg with prescale 0.5 and postscale 3, in a segment */
	g = (float *)get_buf(c, 64 * sizeof(float), 1);
	if (!g)
		return;
	cvd_call_opts_init(&opts);
	opts.prescale = 0.5;
	opts.postscale = 3;
	for (i = 0; i < 64; i++) {
		g[i] = (float)input(CVD_FLOAT32, CVD_SUM, rank, i, 3).f;
		for (j = 0; j < (size_t)size; j++)
			v[j] = input(CVD_FLOAT32, CVD_SUM, (int)j, i, 3);
		store(dwant, CVD_FLOAT32, i, reduction(w, CVD_FLOAT32, CVD_AVG, v, 0.5, 3));
	}
	CHECK(cvd_allreduce_opts(c, g, 64, CVD_FLOAT32, CVD_AVG, &opts, &err) == 0, "scaled avg: %s", err.message);
	check_same(g, dwant, 64, CVD_FLOAT32, "scaled avg in a segment");
	put_buf(c, g, 1);
}

/* Several calls in flight at once, waited for in reverse: each result
 * right, run in the order made. */
static void v3_async(cvd_client *c, const world *w)
{
	enum { K = 4, N = 300 };
	int rank = cvd_rank(c), size = cvd_size(c), k;
	cvd_request *reqs[K];
	int32_t *in[K], *out[K];
	cvd_error err;
	size_t i;
	(void)w;
	for (k = 0; k < K; k++) {
		in[k] = (int32_t *)malloc(N * (size_t)size * sizeof(int32_t));
		out[k] = (int32_t *)malloc(N * (size_t)size * sizeof(int32_t));
		for (i = 0; i < N * (size_t)size; i++)
			in[k][i] = rank * 1000 + k * 10 + (int32_t)(i % 7);
		reqs[k] = k % 2 ? cvd_reduce_scatter_async(c, in[k], out[k], N * (size_t)size, CVD_INT32, CVD_MAX, NULL, &err)
				: cvd_allgather_async(c, in[k], out[k], N, CVD_INT32, NULL, &err);
		CHECK(reqs[k] != NULL, "async %d: %s", k, err.message);
	}
	for (k = K - 1; k >= 0; k--) {
		size_t bad = 0;
		if (reqs[k]) {
			CHECK(cvd_wait(reqs[k], -1, &err) == 0, "wait %d: %s", k, err.message);
			for (i = 0; i < N * (size_t)(k % 2 ? 1 : size); i++) {
				int32_t want = k % 2 ? (size - 1) * 1000 + k * 10 + (int32_t)((rank * N + i) % 7)
						     : (int32_t)(i / N) * 1000 + k * 10 + (int32_t)((i % N) % 7);
				bad += out[k][i] != want;
			}
			CHECK(bad == 0, "async %d: %lu elements wrong", k, (unsigned long)bad);
		}
		free(in[k]);
		free(out[k]);
	}
}

/* Bad input: the client's own errors (a count not the rank's own in
 * counts, avg of int32) and the daemon's (a root outside the world, avg
 * of int32 and a scale factor on int32 through the generic call); none
 * uses up a collective: the calls after them match. */
static void v3_bad_input(cvd_client *c, const world *w)
{
	int rank = cvd_rank(c), size = cvd_size(c), rc;
	uint64_t counts[16];
	int32_t x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[128];
	float f[4];
	cvd_call call;
	cvd_call_opts opts;
	cvd_error err;
	size_t i;
	(void)w;
	for (i = 0; i < (size_t)size; i++)
		counts[i] = 2;
	rc = cvd_allgatherv(c, x, 3, y, counts, CVD_INT32, NULL, &err);
	CHECK(rc == CVD_E_INVALID && strstr(err.message, "count 3 disagrees with counts["), "allgatherv count: %d %s",
	      rc, err.message);
	rc = cvd_allreduce(c, x, 8, CVD_INT32, CVD_AVG, &err);
	CHECK(rc == CVD_E_INVALID && strstr(err.message, "avg needs a float dtype"), "avg of int32: %d %s", rc,
	      err.message);
	rc = cvd_reduce(c, f, 4, CVD_FLOAT32, CVD_SUM, (uint32_t)size, NULL, &err);
	CHECK(rc == CVD_E_BAD_REQUEST && !err.fatal && strstr(err.message, "root"),
	      "reduce to root %d of a world of %d: %d %s", size, size, rc, err.message);
	memset(&call, 0, sizeof call);
	call.op = CVD_ALLREDUCE;
	call.dtype = CVD_INT32;
	call.reduce = CVD_AVG;
	call.buf = x;
	call.count = 8;
	rc = cvd_call_sync_opts(c, &call, NULL, NULL, NULL, &err);
	CHECK(rc == CVD_E_BAD_REQUEST && !err.fatal && strstr(err.message, "avg"), "daemon: avg of int32: %d %s", rc,
	      err.message);
	call.reduce = CVD_SUM;
	cvd_call_opts_init(&opts);
	opts.prescale = 2;
	rc = cvd_call_sync_opts(c, &call, NULL, NULL, &opts, &err);
	CHECK(rc == CVD_E_BAD_REQUEST && !err.fatal && strstr(err.message, "prescale"),
	      "daemon: prescale on int32: %d %s", rc, err.message);
	/* the next calls are every rank's first collective here */
	for (i = 0; i < 4; i++)
		f[i] = (float)(rank + 1);
	CHECK(cvd_allreduce(c, f, 4, CVD_FLOAT32, CVD_SUM, &err) == 0 && f[3] == (float)(size * (size + 1) / 2),
	      "allreduce after refused calls: %s (%g)", err.message, f[3]);
	CHECK(cvd_allgather(c, x, y, 2, CVD_INT32, NULL, &err) == 0 && y[2 * size - 1] == 2,
	      "allgather after refused calls: %s", err.message);
}

/* Two shapes of one count, (2,3) on rank 0 and (3,2) elsewhere: a
 * mismatch on every trainer, naming its own shape (fresh trainers, as
 * mismatch_then_recover in test_daemon.c), then a call that matches.
 * Trainers of one node are compared in full: where rank 0 shares its
 * node with another rank, the errors of that node name both shapes.
 * Between nodes only a fingerprint of the shape travels, and a node may
 * name the other's call by "shape ... differ" alone (docs/MATCHING.md,
 * Limits; PROTOCOL.md says a mismatch names both shapes). */
static void v3_shape_mismatch(cvd_client *c, const world *w)
{
	uint64_t shape[2];
	cvd_call_opts opts;
	cvd_error err;
	float x[6] = {1, 1, 1, 1, 1, 1};
	int rc, rank = cvd_rank(c), both = w->local > 1 && cvd_node_rank(c) == 0;
	cvd_call_opts_init(&opts);
	shape[0] = rank == 0 ? 2 : 3;
	shape[1] = rank == 0 ? 3 : 2;
	opts.shape = shape;
	opts.ndim = 2;
	rc = cvd_allreduce_opts(c, x, 6, CVD_FLOAT32, CVD_SUM, &opts, &err);
	CHECK(rc == CVD_E_MISMATCH && strstr(err.message, rank == 0 ? "shape=(2,3)" : "shape=(3,2)") &&
		      (both ? strstr(err.message, rank == 0 ? "shape=(3,2)" : "shape=(2,3)") != NULL
			    : strstr(err.message, rank == 0 ? "shape=(3,2)" : "shape=(2,3)") != NULL ||
				      strstr(err.message, "shape, per-rank counts or scales differ") != NULL),
	      "different shapes: %d %s", rc, err.message);
	x[0] = 1;
	CHECK(cvd_allreduce_opts(c, x, 1, CVD_FLOAT32, CVD_SUM, NULL, &err) == 0 && x[0] == (float)w->size,
	      "after the mismatch: %s", err.message);
}

void run_v3_daemon_tests(const world *w)
{
	run_trainers(w, v3_bad_input, "v3_bad_input", 120);
	if (w->size > 1)
		run_trainers(w, v3_shape_mismatch, "v3_shape_mismatch", 120);
	run_trainers(w, v3_allgather, "v3_allgather", 300);
	run_trainers(w, v3_reduce_scatter, "v3_reduce_scatter", 300);
	run_trainers(w, reduce_scatter_in_place, "reduce_scatter_in_place", 120);
	run_trainers(w, v3_reduce_allreduce, "v3_reduce_allreduce", 300);
	run_trainers(w, v3_rounding, "v3_rounding", 300);
	run_trainers(w, v3_shapes_and_scale, "v3_shapes_and_scale", 120);
	run_trainers(w, v3_async, "v3_async", 120);
}
