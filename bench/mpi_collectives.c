/*
 * mpi_collectives: the OpenMPI side of bench/compare's collectives other
 * than allreduce (bench/mpi_allreduce.c has that one).
 *
 * Times MPI_Allgather, MPI_Reduce_scatter_block, MPI_Reduce and MPI_Bcast
 * (float32; sum; root 0) the way `collectived bench --op OP` times its
 * calls, so the two are comparable number for number: first `prewarm`
 * untimed calls of the smallest size (one float per rank), then per size
 * one checked call on known values, `warmup` untimed calls, then `iters`
 * back-to-back timed calls (no barrier between them), the inputs refilled
 * before the last one and its result checked after it. Rank 0's per-call
 * times are printed as one JSON object per size on stdout; the caller
 * computes the median, p99 and bandwidths from them.
 *
 * Sizes mean what they mean to `collectived bench --op`: each rank's
 * block for allgather (the result is world x size), the whole input for
 * reducescatter (rounded down to a multiple of world x 4 bytes, at least
 * one float per rank), each rank's buffer for reduce and broadcast. The
 * known values are collectived bench's for float32 (cmd/collectived/
 * benchcoll.go): allgather rank r's element i is (i + 7r) mod 127 + 1,
 * broadcast's root holds i mod 127 + 1 and the others zeros, and the sums
 * add (r + 1)(i mod 7 + 1), exact in float32.
 *
 * usage: mpi_collectives OP SIZES ITERS WARMUP [PREWARM]
 *   OP       allgather, reducescatter, reduce or broadcast
 *   SIZES    comma-separated byte counts
 *   PREWARM  untimed smallest calls before the first size (default 0)
 */
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum op { ALLGATHER, REDUCESCATTER, REDUCE, BROADCAST };
static const char *op_names[] = {"allgather", "reducescatter", "reduce", "broadcast"};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#define COUNT_MAX 100000000

static int count_arg(const char *s, int min, int max, const char *name, int rank)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || errno != 0 || v < min || v > max) {
		if (rank == 0)
			fprintf(stderr, "mpi_collectives: %s \"%s\": want a whole number from %d to %d\n", name, s, min, max);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	return (int)v;
}

/* What rank r contributes at element i of its input. */
static float input(enum op op, size_t i, int r)
{
	switch (op) {
	case ALLGATHER:
		return (float)((i + 7 * (size_t)r) % 127 + 1);
	case BROADCAST:
		return r == 0 ? (float)(i % 127 + 1) : 0.0f;
	default:
		return (float)((r + 1) * (int)(i % 7 + 1));
	}
}

/* One size's buffers: in (n floats) and, for allgather and
 * reducescatter, out (the result). */
struct bufs {
	enum op op;
	int rank, world;
	size_t n, nout;
	float *in, *out;
};

static float *alloc_floats(size_t n, int rank)
{
	float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
	if (!p) {
		fprintf(stderr, "mpi_collectives: rank %d: cannot allocate %zu floats\n", rank, n);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	return p;
}

static void fill(struct bufs *b)
{
	for (size_t i = 0; i < b->n; i++)
		b->in[i] = input(b->op, i, b->rank);
	if (b->out)
		memset(b->out, 0, b->nout * 4);
}

static void call(struct bufs *b)
{
	switch (b->op) {
	case ALLGATHER:
		MPI_Allgather(b->in, (int)b->n, MPI_FLOAT, b->out, (int)b->n, MPI_FLOAT, MPI_COMM_WORLD);
		break;
	case REDUCESCATTER:
		MPI_Reduce_scatter_block(b->in, b->out, (int)b->nout, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		break;
	case REDUCE:
		if (b->rank == 0)
			MPI_Reduce(MPI_IN_PLACE, b->in, (int)b->n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
		else
			MPI_Reduce(b->in, NULL, (int)b->n, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
		break;
	case BROADCAST:
		MPI_Bcast(b->in, (int)b->n, MPI_FLOAT, 0, MPI_COMM_WORLD);
		break;
	}
}

/* The sum over the world at element i. */
static float sum_at(size_t i, int world)
{
	return (float)(i % 7 + 1) * (float)(world * (world + 1) / 2);
}

static int check(const struct bufs *b, int64_t bytes)
{
	const float *got = b->out ? b->out : b->in;
	size_t len = b->out ? b->nout : b->n;
	for (size_t j = 0; j < len; j++) {
		float want;
		switch (b->op) {
		case ALLGATHER:
			want = input(ALLGATHER, j % b->n, (int)(j / b->n));
			break;
		case REDUCESCATTER:
			want = sum_at((size_t)b->rank * b->nout + j, b->world);
			break;
		case REDUCE:
			want = b->rank == 0 ? sum_at(j, b->world) : input(REDUCE, j, b->rank);
			break;
		default:
			want = input(BROADCAST, j, 0);
		}
		if (got[j] != want) {
			fprintf(stderr, "mpi_collectives: %s of %lld bytes, rank %d: wrong result at element %zu: got %g, want %g\n",
				op_names[b->op], (long long)bytes, b->rank, j, got[j], want);
			return -1;
		}
	}
	return 0;
}

/* The buffers of a size of req bytes. */
static struct bufs make_bufs(enum op op, long long req, int rank, int world)
{
	struct bufs b = {.op = op, .rank = rank, .world = world};
	b.n = (size_t)req / 4;
	if (b.n == 0)
		b.n = 1;
	if (op == REDUCESCATTER) {
		b.n = b.n / (size_t)world * (size_t)world;
		if (b.n == 0)
			b.n = (size_t)world;
		b.nout = b.n / (size_t)world;
	} else if (op == ALLGATHER) {
		b.nout = b.n * (size_t)world;
	}
	b.in = alloc_floats(b.n, rank);
	b.out = b.nout ? alloc_floats(b.nout, rank) : NULL;
	return b;
}

static void free_bufs(struct bufs *b)
{
	free(b->in);
	free(b->out);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, world;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (argc < 5 || argc > 6) {
		if (rank == 0)
			fprintf(stderr, "usage: %s allgather|reducescatter|reduce|broadcast SIZES ITERS WARMUP [PREWARM]\n", argv[0]);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int op = -1;
	for (int i = 0; i < 4; i++)
		if (strcmp(argv[1], op_names[i]) == 0)
			op = i;
	if (op < 0) {
		if (rank == 0)
			fprintf(stderr, "mpi_collectives: OP \"%s\": want allgather, reducescatter, reduce or broadcast\n", argv[1]);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int iters = count_arg(argv[3], 1, COUNT_MAX, "ITERS", rank);
	int warmup = count_arg(argv[4], 0, COUNT_MAX, "WARMUP", rank);
	int prewarm = argc == 6 ? count_arg(argv[5], 0, COUNT_MAX, "PREWARM", rank) : 0;
	if (prewarm > 0) {
		struct bufs one = make_bufs((enum op)op, 4, rank, world);
		memset(one.in, 0, one.n * 4); /* zeros, as collectived bench's prewarm */
		for (int i = 0; i < prewarm; i++)
			call(&one);
		free_bufs(&one);
	}
	int64_t *times = malloc(sizeof(int64_t) * (size_t)iters);
	if (!times) {
		fprintf(stderr, "mpi_collectives: rank %d: cannot allocate %d times\n", rank, iters);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	char *sizes = strdup(argv[2]);
	for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
		char *end;
		long long req = strtoll(tok, &end, 10);
		if (*end != '\0' || req < 0) {
			if (rank == 0)
				fprintf(stderr, "mpi_collectives: size \"%s\" is not a byte count\n", tok);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
		struct bufs b = make_bufs((enum op)op, req, rank, world);
		int64_t bytes = (int64_t)b.n * 4;
		int64_t total = op == ALLGATHER ? bytes * world : bytes;
		fill(&b);
		call(&b);
		if (check(&b, bytes) != 0)
			MPI_Abort(MPI_COMM_WORLD, 1);
		for (int i = 0; i < warmup; i++)
			call(&b);
		for (int i = 0; i < iters; i++) {
			if (i == iters - 1)
				fill(&b);
			int64_t t0 = now_ns();
			call(&b);
			times[i] = now_ns() - t0;
		}
		if (check(&b, bytes) != 0)
			MPI_Abort(MPI_COMM_WORLD, 1);
		if (rank == 0) {
			printf("{\"op\": \"%s\", \"bytes\": %lld, \"total_bytes\": %lld, \"times_ns\": [", op_names[op],
			       (long long)bytes, (long long)total);
			for (int i = 0; i < iters; i++)
				printf("%s%lld", i ? ", " : "", (long long)times[i]);
			printf("]}\n");
			fflush(stdout);
		}
		free_bufs(&b);
	}
	free(sizes);
	free(times);
	MPI_Finalize();
	return 0;
}
