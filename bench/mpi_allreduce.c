/*
 * mpi_allreduce: the OpenMPI side of bench/compare.
 *
 * Times MPI_Allreduce (float32, sum, in place) the way `collectived bench`
 * times its allreduce, so the two are comparable number for number: first
 * `prewarm` untimed calls of one float, then per size one checked call, `warmup` untimed calls, then `iters` back-to-back
 * timed calls (no barrier between them), the buffer refilled before the
 * last one and checked after it. Rank 0's per-call times are printed as one
 * JSON object per size on stdout; the median and p99 are computed by the
 * caller from those times, exactly as for the other systems.
 *
 * usage: mpi_allreduce SIZES ITERS WARMUP [PREWARM [IN_FLIGHT]]
 *   SIZES      comma-separated byte counts (multiples of 4 are used as is,
 *              smaller ones become one float)
 *   PREWARM    untimed one-float calls before the first size (default 0)
 *   IN_FLIGHT  allreduces started together per timed iteration, each on a
 *              buffer of its own (MPI_Iallreduce, then MPI_Waitall), timed
 *              as one, as `collectived bench --in-flight` times its calls
 *              (default 1: MPI_Allreduce, one at a time)
 */
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Same contribution as collectived's bench trainer: exact in float32 for
 * any world a machine can hold, so the check is exact. */
static void fill(float *b, size_t n, int rank)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (float)((rank + 1) * (int)(i % 7 + 1));
}

static int check(const float *b, size_t n, int world, int64_t bytes)
{
	float tri = (float)(world * (world + 1) / 2);
	for (size_t i = 0; i < n; i++) {
		float want = (float)(i % 7 + 1) * tri;
		if (b[i] != want) {
			fprintf(stderr, "mpi_allreduce: %lld bytes: wrong sum at element %zu: got %g, want %g\n",
				(long long)bytes, i, b[i], want);
			return -1;
		}
	}
	return 0;
}

#define COUNT_MAX 100000000
#define IN_FLIGHT_MAX 64

/* A count argument: a whole decimal number from min to COUNT_MAX, or the
 * run ends naming it. Every rank parses the same arguments, so every rank
 * finds the same fault; rank 0 says so. */
static int count_arg(const char *s, int min, int max, const char *name, int rank)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || errno != 0 || v < min || v > max) {
		if (rank == 0)
			fprintf(stderr, "mpi_allreduce: %s \"%s\": want a whole number from %d to %d\n", name, s, min, max);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	return (int)v;
}

/* One step of the measurement: the k buffers reduced, one MPI_Allreduce
 * when k is 1, else k MPI_Iallreduce started together and waited for. */
static void reduce(float **bufs, int k, size_t n, MPI_Request *reqs)
{
	if (k == 1) {
		MPI_Allreduce(MPI_IN_PLACE, bufs[0], (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		return;
	}
	for (int j = 0; j < k; j++)
		MPI_Iallreduce(MPI_IN_PLACE, bufs[j], (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &reqs[j]);
	MPI_Waitall(k, reqs, MPI_STATUSES_IGNORE);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, world;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	if (argc < 4 || argc > 6) {
		if (rank == 0)
			fprintf(stderr, "usage: %s SIZES ITERS WARMUP [PREWARM [IN_FLIGHT]]\n", argv[0]);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int iters = count_arg(argv[2], 1, COUNT_MAX, "ITERS", rank);
	int warmup = count_arg(argv[3], 0, COUNT_MAX, "WARMUP", rank);
	int prewarm = argc >= 5 ? count_arg(argv[4], 0, COUNT_MAX, "PREWARM", rank) : 0;
	int k = argc == 6 ? count_arg(argv[5], 1, IN_FLIGHT_MAX, "IN_FLIGHT", rank) : 1;
	float *bufs[IN_FLIGHT_MAX];
	MPI_Request reqs[IN_FLIGHT_MAX];
	float one = 0; /* zero, as collectived bench's prewarm: the sum stays 0 */
	for (int i = 0; i < prewarm; i++)
		MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
	int64_t *times = malloc(sizeof(int64_t) * (size_t)iters);
	if (!times) {
		fprintf(stderr, "mpi_allreduce: rank %d: cannot allocate %d times\n", rank, iters);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	char *sizes = strdup(argv[1]);
	for (char *tok = strtok(sizes, ","); tok; tok = strtok(NULL, ",")) {
		char *end;
		long long req = strtoll(tok, &end, 10);
		if (*end != '\0' || req < 0) {
			if (rank == 0)
				fprintf(stderr, "mpi_allreduce: size \"%s\" is not a byte count\n", tok);
			MPI_Abort(MPI_COMM_WORLD, 2);
		}
		size_t n = (size_t)req / 4;
		if (n == 0)
			n = 1;
		int64_t bytes = (int64_t)n * 4;
		for (int j = 0; j < k; j++) {
			bufs[j] = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
			if (!bufs[j]) {
				fprintf(stderr, "mpi_allreduce: rank %d: cannot allocate %lld bytes\n", rank,
					(long long)bytes);
				MPI_Abort(MPI_COMM_WORLD, 1);
			}
			fill(bufs[j], n, rank);
		}
		reduce(bufs, k, n, reqs);
		for (int j = 0; j < k; j++)
			if (check(bufs[j], n, world, bytes) != 0)
				MPI_Abort(MPI_COMM_WORLD, 1);
		for (int i = 0; i < warmup; i++)
			reduce(bufs, k, n, reqs);
		for (int i = 0; i < iters; i++) {
			if (i == iters - 1)
				for (int j = 0; j < k; j++)
					fill(bufs[j], n, rank);
			int64_t t0 = now_ns();
			reduce(bufs, k, n, reqs);
			times[i] = now_ns() - t0;
		}
		for (int j = 0; j < k; j++)
			if (check(bufs[j], n, world, bytes) != 0)
				MPI_Abort(MPI_COMM_WORLD, 1);
		if (rank == 0) {
			printf("{\"bytes\": %lld, \"in_flight\": %d, \"times_ns\": [", (long long)bytes, k);
			for (int i = 0; i < iters; i++)
				printf("%s%lld", i ? ", " : "", (long long)times[i]);
			printf("]}\n");
			fflush(stdout);
		}
		for (int j = 0; j < k; j++)
			free(bufs[j]);
	}
	free(sizes);
	free(times);
	MPI_Finalize();
	return 0;
}
