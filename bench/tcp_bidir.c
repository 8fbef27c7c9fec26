/*
 * tcp_bidir: bidirectional TCP loopback throughput, N streams each way,
 * for bench/compare; the same measurement as tcp_bidir.py without the
 * Python interpreter in the way (one pthread sends and one receives per
 * connection, 64 MiB send/recv buffers).
 *
 *   tcp_bidir --listen PORT --seconds S [--streams N] [--chunk BYTES]   # start first
 *   tcp_bidir --connect PORT --seconds S [--streams N] [--chunk BYTES]
 * Data comes from and goes to 64 MiB buffers, CHUNK bytes per call (64 MiB
 * by default; the daemon's segment size is the fair comparison).
 * Each prints one JSON line: bytes sent and received and the seconds each took.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (64 << 20)
#define MAXSTREAMS 16

static double seconds = 5, timeout_s = 30;
static size_t chunk = CHUNK; /* bytes per send and recv call */
static struct timespec t0;
static char *out_buf;

struct side {
	int fd;
	long long bytes;
	double secs;
	int err;
};

static double since(const struct timespec *a)
{
	struct timespec b;
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (b.tv_sec - a->tv_sec) + (b.tv_nsec - a->tv_nsec) / 1e9;
}

static void *sender(void *arg)
{
	struct side *s = arg;
	while (since(&t0) < seconds) {
		for (size_t off = 0; off < CHUNK;) {
			size_t len = CHUNK - off < chunk ? CHUNK - off : chunk;
			ssize_t n = send(s->fd, out_buf + off, len, MSG_NOSIGNAL);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				s->err = errno;
				goto done;
			}
			off += (size_t)n;
			s->bytes += n;
		}
	}
	shutdown(s->fd, SHUT_WR);
done:
	s->secs = since(&t0);
	return NULL;
}

static void *receiver(void *arg)
{
	struct side *s = arg;
	char *buf = malloc(CHUNK);
	if (!buf) {
		s->err = ENOMEM;
		return NULL;
	}
	for (size_t off = 0;; off = (off + chunk) % CHUNK) {
		ssize_t n = recv(s->fd, buf + off, chunk, 0);
		if (n == 0)
			break;
		if (n < 0) {
			if (errno == EINTR)
				continue;
			s->err = errno;
			break;
		}
		s->bytes += n;
	}
	s->secs = since(&t0);
	free(buf);
	return NULL;
}

static void usage(const char *why)
{
	fprintf(stderr, "tcp_bidir: %s\nusage: tcp_bidir (--listen|--connect) PORT --seconds S [--streams N]\n", why);
	exit(2);
}

int main(int argc, char **argv)
{
	int listen_port = 0, connect_port = 0, streams = 1;
	static struct option opts[] = {
		{"listen", required_argument, 0, 'l'}, {"connect", required_argument, 0, 'c'},
		{"seconds", required_argument, 0, 's'}, {"streams", required_argument, 0, 'n'},
		{"timeout", required_argument, 0, 't'}, {"chunk", required_argument, 0, 'k'}, {0, 0, 0, 0},
	};
	for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
		switch (o) {
		case 'l': listen_port = atoi(optarg); break;
		case 'c': connect_port = atoi(optarg); break;
		case 's': seconds = atof(optarg); break;
		case 'n': streams = atoi(optarg); break;
		case 't': timeout_s = atof(optarg); break;
		case 'k': chunk = (size_t)atol(optarg); break;
		default: usage("unknown option");
		}
	}
	if ((listen_port > 0) == (connect_port > 0))
		usage("give exactly one of --listen PORT and --connect PORT (1-65535)");
	if (!(seconds > 0))
		usage("--seconds: want more than 0");
	if (streams < 1 || streams > MAXSTREAMS)
		usage("--streams: want 1 to 16");
	if (chunk < 4096 || chunk > CHUNK || CHUNK % chunk != 0)
		usage("--chunk: want a power of two from 4096 to 64 MiB");

	struct sockaddr_in addr = {.sin_family = AF_INET};
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	addr.sin_port = htons((unsigned short)(listen_port ? listen_port : connect_port));
	int fds[MAXSTREAMS];
	struct timeval tv = {.tv_sec = (time_t)(timeout_s + seconds)};
	if (listen_port) {
		int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); /* bounds accept too */
		if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(ls, streams) < 0) {
			fprintf(stderr, "tcp_bidir: listen on 127.0.0.1:%d: %s\n", listen_port, strerror(errno));
			return 1;
		}
		for (int i = 0; i < streams; i++) {
			if ((fds[i] = accept(ls, NULL, NULL)) < 0) {
				fprintf(stderr, "tcp_bidir: accept on 127.0.0.1:%d: %s\n", listen_port, strerror(errno));
				return 1;
			}
		}
		close(ls);
	} else {
		struct timespec start;
		clock_gettime(CLOCK_MONOTONIC, &start);
		for (int i = 0; i < streams; i++) {
			for (;;) {
				fds[i] = socket(AF_INET, SOCK_STREAM, 0);
				if (connect(fds[i], (struct sockaddr *)&addr, sizeof addr) == 0)
					break;
				int e = errno;
				close(fds[i]);
				if (e != ECONNREFUSED || since(&start) > timeout_s) {
					fprintf(stderr, "tcp_bidir: connect to 127.0.0.1:%d: %s\n", connect_port, strerror(e));
					return 1;
				}
				usleep(50000);
			}
		}
	}
	for (int i = 0; i < streams; i++) {
		int one = 1;
		char b = 's';
		setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		/* A one-byte handshake each way so both sides start timing together. */
		if (send(fds[i], &b, 1, MSG_NOSIGNAL) != 1 || recv(fds[i], &b, 1, MSG_WAITALL) != 1 || b != 's') {
			fprintf(stderr, "tcp_bidir: stream %d: peer closed before starting\n", i);
			return 1;
		}
	}
	if (!(out_buf = malloc(CHUNK))) {
		fprintf(stderr, "tcp_bidir: cannot allocate %d bytes\n", CHUNK);
		return 1;
	}
	memset(out_buf, 0x5a, CHUNK);

	struct side snd[MAXSTREAMS] = {0}, rcv[MAXSTREAMS] = {0};
	pthread_t th[2 * MAXSTREAMS];
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < streams; i++) {
		snd[i].fd = rcv[i].fd = fds[i];
		pthread_create(&th[2 * i], NULL, sender, &snd[i]);
		pthread_create(&th[2 * i + 1], NULL, receiver, &rcv[i]);
	}
	for (int i = 0; i < 2 * streams; i++)
		pthread_join(th[i], NULL);
	long long sent = 0, got = 0;
	double send_s = 0, recv_s = 0;
	for (int i = 0; i < streams; i++) {
		close(fds[i]);
		if (snd[i].err || rcv[i].err) {
			fprintf(stderr, "tcp_bidir: stream %d: %s: %s\n", i, snd[i].err ? "send" : "receive",
				strerror(snd[i].err ? snd[i].err : rcv[i].err));
			return 1;
		}
		sent += snd[i].bytes;
		got += rcv[i].bytes;
		send_s = snd[i].secs > send_s ? snd[i].secs : send_s;
		recv_s = rcv[i].secs > recv_s ? rcv[i].secs : recv_s;
	}
	printf("{\"streams\": %d, \"chunk\": %zu, \"sent_bytes\": %lld, \"send_s\": %.6f, \"recv_bytes\": %lld, \"recv_s\": %.6f}\n",
	       streams, chunk, sent, send_s, got, recv_s);
	return 0;
}
