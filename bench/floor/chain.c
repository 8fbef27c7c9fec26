/*
 * The latency floor of collectived's 4-byte allreduce path on this machine,
 * without collectived: four processes pass a 32-byte message along the path
 * a world-2 small allreduce takes,
 *
 *     trainer 0 -unix-> daemon 0 -tcp-> daemon 1 -tcp-> daemon 0 -unix-> trainer 0
 *                       (and trainer 1 <-> daemon 1 the same way, at once)
 *
 * every hop on a real socket. Readers poll with MSG_DONTWAIT, yielding the
 * CPU between polls (sched_yield), or block, so the two ways of waiting
 * are measured side by side. Trainer 0 reports the median and p90 of its
 * round trips.
 *
 *   cc -O2 -o chain chain.c && ./chain 20000 poll && ./chain 20000 block
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MSG = 32 };
static int poll_mode;

static void die(const char *what) { perror(what); exit(1); }

static void rd(int fd, char *b) {
	for (int got = 0; got < MSG;) {
		int r = recv(fd, b + got, MSG - got, poll_mode ? MSG_DONTWAIT : 0);
		if (r > 0)
			got += r;
		else if (r < 0 && errno == EAGAIN)
			sched_yield();
		else if (r < 0 && errno == EINTR)
			continue;
		else
			die("recv");
	}
}

static void wr(int fd, const char *b) {
	if (send(fd, b, MSG, 0) != MSG) die("send");
}

static double now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* daemon: a call from its trainer, one message each way round the ring, the reply. */
static void daemon_loop(int trainer, int ring, int iters) {
	char m[MSG] = {0}, r[MSG];
	for (int i = 0; i < iters; i++) {
		rd(trainer, r);
		wr(ring, m);
		rd(ring, r);
		wr(trainer, m);
	}
}

static void trainer_loop(int daemon, int iters, double *lat) {
	char m[MSG] = {0}, r[MSG];
	for (int i = 0; i < iters; i++) {
		double t = now_ns();
		wr(daemon, m);
		rd(daemon, r);
		if (lat) lat[i] = now_ns() - t;
	}
}

int main(int argc, char **argv) {
	if (argc != 3 || (strcmp(argv[2], "poll") && strcmp(argv[2], "block"))) {
		fprintf(stderr, "usage: %s ITERATIONS poll|block\n", argv[0]);
		return 2;
	}
	int iters = atoi(argv[1]);
	if (iters < 1) { fprintf(stderr, "chain: iterations %s: want at least 1\n", argv[1]); return 2; }
	poll_mode = strcmp(argv[2], "poll") == 0;

	int u0[2], u1[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, u0) || socketpair(AF_UNIX, SOCK_STREAM, 0, u1)) die("socketpair");
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof a;
	if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &al)) die("listen");
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(c, (void *)&a, sizeof a)) die("connect");
	int s = accept(ls, 0, 0);
	if (s < 0) die("accept");
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);

	if (fork() == 0) { daemon_loop(u1[0], s, iters); _exit(0); }      /* daemon 1 */
	if (fork() == 0) { trainer_loop(u1[1], iters, NULL); _exit(0); }  /* trainer 1 */
	if (fork() == 0) { daemon_loop(u0[0], c, iters); _exit(0); }      /* daemon 0 */
	double *lat = malloc(sizeof(double) * iters);
	if (!lat) die("malloc");
	trainer_loop(u0[1], iters, lat);                                  /* trainer 0 */
	while (wait(NULL) > 0) {}
	qsort(lat, iters, sizeof(double), cmp);
	printf("%s: median %.1f us, p90 %.1f us over %d round trips\n", argv[2], lat[iters / 2] / 1e3, lat[iters * 9 / 10] / 1e3, iters);
	return 0;
}
