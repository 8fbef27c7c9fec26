/* The C client against a scripted peer (a forked process on a real Unix
 * socket) for what a real daemon cannot be made to do on demand: replies
 * out of order, no reply at all, a fatal connection-level error.
 *
 * The peer answers HELLO (timeout_ms 1000, inline_limit 64; in version 3
 * first_call_timeout_ms 60000), then CALLs by
 * name: "silent" never, "hold" only after the next call (out of order),
 * "fatal" with ERROR BAD_FRAME FATAL id 0 and a close, anything else at
 * once with the data unchanged. In the lane modes it speaks version 2 and
 * answers LANE with a LANE_OK the client must refuse. In mode PEER_V3_W4
 * it plays world rank 1 of a world of 4 (see v3_answer), in mode PEER_V4
 * a daemon of version 4 with a lane (see v4_call). */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../collectived.h"
#include "check.h"

static int read_n(int fd, uint8_t *b, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, b + got, n - got);
		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

static int write_all(int fd, const uint8_t *b, size_t n)
{
	while (n > 0) {
		ssize_t k = write(fd, b, n);
		if (k <= 0)
			return -1;
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

/* The size of the scripted peer's first STATUS_OK document. */
#define STATUS_BIG (3u << 20)

static void send_frame(int fd, const cvd_frame *f)
{
	uint8_t buf[8192];
	size_t n = cvd_frame_encode(f, buf, sizeof buf);
	if (n && n <= sizeof buf && write(fd, buf, n) != (ssize_t)n)
		_exit(2);
}

/* The peer's HELLO_OK, in version v: a world of one, inline limit 64,
 * collective timeout 1000 ms, first-call timeout 60000 ms (version 3). */
static void send_hello_ok(int fd, uint64_t id, uint16_t v)
{
	cvd_frame r;
	memset(&r, 0, sizeof r);
	r.id = id;
	r.type = CVD_T_HELLO_OK;
	r.version = v;
	r.info.world_size = r.info.node_count = r.info.local_size = 1;
	r.info.inline_limit = 64;
	r.info.max_frame = 4096;
	r.info.max_in_flight = 8;
	r.info.timeout_ms = 1000;
	r.size = v >= 3 ? 60000 : 0; /* first_call_timeout_ms */
	send_frame(fd, &r);
}

enum { PEER_OK, PEER_REFUSE, PEER_LANE_SHORT_FD, PEER_LANE_WRONG_SIZE, PEER_LANE_BAD_WAKE, PEER_LANE_BAD_ANSWER,
       PEER_V1_ONLY, PEER_NO_VERSION, PEER_V1_ANSWERS_2, PEER_V2_ONLY, PEER_V2_ANSWERS_3, PEER_V3, PEER_V3_W4,
       PEER_V4 };

/* PEER_V3_W4: world rank 1 of a world of 4 on one node (local size 4),
 * inline limit 64. It keeps the segments it gives (ALLOC) mapped, writes
 * every CALL frame it receives to v3_record (a u32 length, then the
 * frame), and answers as if the other ranks had called too: an allgather
 * gets the caller's block at its place and block j (j != 1) filled with
 * other_byte(j, i); a reduce_scatter gets the caller's own block of its
 * input (as if the others gave zeros to a sum); other calls their data
 * back. A call named "short" gets an inline result one byte short. Spans
 * outside their segment get BAD_SEGMENT. */
#define W4_SIZE 4
#define W4_RANK 1
static char v3_record[96];

static uint8_t other_byte(uint32_t j, size_t i) { return (uint8_t)(0x40 + 16 * j + i); }

typedef struct peer_seg {
	uint32_t id;
	uint8_t *base;
	size_t size;
} peer_seg;

/* f with fd attached to its first byte, as the daemon sends LANE_OK. */
static void send_frame_fd(int fd, const cvd_frame *f, int pass)
{
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	uint8_t buf[64];
	struct msghdr mh;
	struct iovec iov;
	struct cmsghdr *cm;
	memset(&mh, 0, sizeof mh);
	memset(&u, 0, sizeof u);
	iov.iov_base = buf;
	iov.iov_len = cvd_frame_encode(f, buf, sizeof buf);
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof u.buf;
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &pass, sizeof(int));
	if (sendmsg(fd, &mh, 0) != (ssize_t)iov.iov_len)
		_exit(2);
}

static void send_frame_fd(int fd, const cvd_frame *f, int pass);

static uint8_t *span(peer_seg *segs, size_t nsegs, uint32_t id, uint64_t off, uint64_t len)
{
	size_t i;
	for (i = 0; i < nsegs; i++)
		if (segs[i].id == id && off <= segs[i].size && len <= segs[i].size - off)
			return segs[i].base + off;
	return NULL;
}

static void v3_answer(int fd, const uint8_t *frame, size_t n, peer_seg *segs, size_t nsegs)
{
	static uint8_t res[8192];
	cvd_frame f, r;
	cvd_call_ext x;
	cvd_error err;
	const uint8_t *in;
	uint8_t *out = res;
	uint64_t cnt[W4_SIZE], start = 0, total = 0, outn;
	size_t esize, j, i, rlen = 0;
	uint32_t len32 = (uint32_t)n;
	FILE *rec = fopen(v3_record, "ab");
	if (!rec || fwrite(&len32, 4, 1, rec) != 1 || fwrite(frame, 1, n, rec) != n)
		_exit(7);
	fclose(rec);
	memset(&r, 0, sizeof r);
	if (cvd_frame_decode_ext(frame, n, 8192, 3, &f, &x, &err) != 0) {
		r.type = CVD_T_ERROR;
		r.frame_flags = CVD_FLAG_FATAL;
		r.code = CVD_E_BAD_FRAME;
		r.data = (const uint8_t *)err.message;
		r.data_len = strlen(err.message);
		send_frame(fd, &r);
		_exit(0);
	}
	r.id = f.id;
	esize = cvd_dtype_size(f.dtype);
	in = (f.flags & CVD_CALL_SHM) ? span(segs, nsegs, f.segment, f.offset, f.count * esize) : f.data;
	for (j = 0; j < W4_SIZE; j++)
		cnt[j] = (x.xflags & CVD_X_COUNTS) && x.ncounts == W4_SIZE ? cvd_call_ext_count(&x, (uint32_t)j)
		       : f.op == CVD_ALLGATHER ? f.count : f.count / W4_SIZE;
	for (j = 0; j < W4_SIZE; j++) {
		if (j < W4_RANK)
			start += cnt[j];
		total += cnt[j];
	}
	outn = f.op == CVD_ALLGATHER ? total * esize : f.op == CVD_REDUCE_SCATTER ? cnt[W4_RANK] * esize : f.count * esize;
	if ((f.flags & CVD_CALL_SHM) && (f.op == CVD_ALLGATHER || f.op == CVD_REDUCE_SCATTER))
		out = (x.xflags & CVD_X_OUT) ? span(segs, nsegs, x.out_segment, x.out_offset, outn) : NULL;
	if (!in || !out || outn > sizeof res) {
		static const char msg[] = "scripted peer: span outside its segment";
		r.type = CVD_T_ERROR;
		r.code = CVD_E_BAD_SEGMENT;
		r.data = (const uint8_t *)msg;
		r.data_len = sizeof msg - 1;
		send_frame(fd, &r);
		return;
	}
	if (f.op == CVD_ALLGATHER) {
		uint64_t at = 0;
		/* the caller's block first: in place, it is already there */
		memmove(out + start * esize, in, cnt[W4_RANK] * esize);
		for (j = 0; j < W4_SIZE; at += cnt[j], j++)
			for (i = 0; j != W4_RANK && i < cnt[j] * esize; i++)
				out[at * esize + i] = other_byte((uint32_t)j, i);
		rlen = total * esize;
	} else if (f.op == CVD_REDUCE_SCATTER) {
		memmove(out, in + start * esize, cnt[W4_RANK] * esize);
		rlen = cnt[W4_RANK] * esize;
	} else if (!(f.flags & CVD_CALL_SHM)) {
		memcpy(res, in, f.data_len);
		rlen = f.data_len;
	}
	r.type = CVD_T_CALL_OK;
	if (!(f.flags & CVD_CALL_SHM)) {
		r.data = res;
		r.data_len = rlen - (f.name_len == 5 && memcmp(f.name, "short", 5) == 0 ? 1 : 0);
	}
	send_frame(fd, &r);
}

/* PEER_V4: a daemon of protocol version 4 in a world of one that gives a
 * working lane and reads calls from it and from the socket. Each CALL
 * goes to v4_record as a line "<L|S> <flags> <name>" (L: it came on the
 * lane). A call whose name begins with "wait" is held; a call named
 * "release" is answered, then every held one; others at once, with their
 * data as the result (the answer always on the socket). */
static char v4_record[96];

static void v4_call(int fd, const uint8_t *frame, size_t n, char via)
{
	static uint8_t held[8][512];
	static size_t held_n[8], nheld;
	uint8_t out[8192];
	cvd_frame f, r;
	cvd_error err;
	size_t k, len;
	FILE *rec;
	if (cvd_frame_decode_ext(frame, n, 8192, 4, &f, NULL, &err) != 0 || f.type != CVD_T_CALL)
		_exit(10);
	rec = fopen(v4_record, "a");
	if (!rec || fprintf(rec, "%c %u %.*s\n", via, (unsigned)f.flags, (int)f.name_len, (const char *)f.name) < 0)
		_exit(10);
	fclose(rec);
	memset(&r, 0, sizeof r);
	r.id = f.id;
	r.type = CVD_T_CALL_OK;
	r.seq = f.id;
	if (!(f.flags & CVD_CALL_SHM)) {
		r.data = f.data;
		r.data_len = f.data_len;
	}
	if (f.name_len >= 4 && memcmp(f.name, "wait", 4) == 0 && nheld < 8) {
		held_n[nheld] = cvd_frame_encode(&r, held[nheld], sizeof held[nheld]);
		if (held_n[nheld] == 0 || held_n[nheld] > sizeof held[nheld])
			_exit(10);
		nheld++;
		return;
	}
	len = cvd_frame_encode(&r, out, sizeof out);
	if (len == 0 || len > sizeof out || write_all(fd, out, len) != 0)
		_exit(10);
	if (f.name_len == 7 && memcmp(f.name, "release", 7) == 0) {
		for (k = 0; k < nheld; k++)
			if (write_all(fd, held[k], held_n[k]) != 0)
				_exit(10);
		nheld = 0;
	}
}

/* PEER_V4: wait until the socket is readable, taking (and answering)
 * the calls the client puts on the lane meanwhile. */
static void v4_wait_socket(int fd, uint8_t *lane)
{
	static uint32_t seen;
	uint8_t frame[4096];
	for (;;) {
		struct pollfd pfd;
		pfd.fd = fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		if (poll(&pfd, 1, 1) > 0)
			return;
		if (lane && __atomic_load_n((uint32_t *)(void *)lane, __ATOMIC_SEQ_CST) != seen) {
			uint32_t plen;
			cvd_frame f;
			cvd_error err;
			seen++;
			memcpy(frame, lane + 4096, sizeof frame);
			__atomic_store_n((uint32_t *)(void *)(lane + 64), seen, __ATOMIC_SEQ_CST); /* c2d_taken */
			if (cvd_frame_header(frame, 4096, &f, &plen, &err) != 0 || plen > 4096 - 16)
				_exit(11);
			v4_call(fd, frame, 16 + plen, 'L');
		}
	}
}

static void peer(int lfd, int refuse)
{
	uint8_t *v4_lane = NULL;
	peer_seg segs[16];
	size_t nsegs = 0;
	uint8_t buf[8192], held[8192];
	size_t held_n = 0;
	cvd_frame f, r;
	cvd_error err;
	uint32_t plen;
	int fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		_exit(1);
	/* An older daemon (versions 1 to maxv), or one that speaks none:
	 * VERSION, fatal, for each HELLO it refuses, naming the version asked;
	 * then the next connection. */
	while (refuse == PEER_V1_ONLY || refuse == PEER_NO_VERSION || refuse == PEER_V1_ANSWERS_2 ||
	       refuse == PEER_V2_ONLY || refuse == PEER_V2_ANSWERS_3) {
		char msg[96];
		unsigned maxv = refuse == PEER_NO_VERSION ? 0 : refuse == PEER_V2_ONLY || refuse == PEER_V2_ANSWERS_3 ? 2 : 1;
		if (read_n(fd, buf, 16) != 0 || cvd_frame_header(buf, 8192, &f, &plen, &err) != 0 ||
		    read_n(fd, buf + 16, plen) != 0 || cvd_frame_payload(&f, buf + 16, plen, &err) != 0 ||
		    f.type != CVD_T_HELLO)
			_exit(6);
		if (f.version <= maxv) {
			send_hello_ok(fd, f.id, refuse == PEER_V1_ANSWERS_2 || refuse == PEER_V2_ANSWERS_3 ? f.version + 1 : f.version);
			break;
		}
		memset(&r, 0, sizeof r);
		r.id = f.id;
		r.type = CVD_T_ERROR;
		r.frame_flags = CVD_FLAG_FATAL;
		r.code = CVD_E_VERSION;
		snprintf(msg, sizeof msg, "client speaks protocol version %u, daemon speaks 1 to %u", f.version, maxv);
		r.data = (const uint8_t *)msg;
		r.data_len = strlen(msg);
		send_frame(fd, &r);
		close(fd);
		if ((fd = accept(lfd, NULL, NULL)) < 0)
			_exit(1);
	}
	if (refuse == PEER_REFUSE) { /* as for refused credentials: answer before reading, close */
		memset(&r, 0, sizeof r);
		r.type = CVD_T_ERROR;
		r.frame_flags = CVD_FLAG_FATAL;
		r.code = CVD_E_PERMISSION;
		r.data = (const uint8_t *)"uid 1000 is not allowed";
		r.data_len = strlen("uid 1000 is not allowed");
		send_frame(fd, &r);
		close(fd);
		_exit(0);
	}
	for (;;) {
		if (refuse == PEER_V4)
			v4_wait_socket(fd, v4_lane);
		if (read_n(fd, buf, 16) != 0 || cvd_frame_header(buf, 8192, &f, &plen, &err) != 0 ||
		    read_n(fd, buf + 16, plen) != 0 || cvd_frame_payload(&f, buf + 16, plen, &err) != 0)
			_exit(0);
		memset(&r, 0, sizeof r);
		r.id = f.id;
		if (refuse == PEER_V4) {
			if (f.type == CVD_T_HELLO) {
				send_hello_ok(fd, f.id, 4);
			} else if (f.type == CVD_T_LANE) {
				char tmp[] = "/tmp/cvd-lane-XXXXXX";
				int mfd = mkstemp(tmp);
				if (mfd < 0 || ftruncate(mfd, 12288) != 0)
					_exit(4);
				unlink(tmp);
				v4_lane = mmap(NULL, 12288, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
				if (v4_lane == MAP_FAILED)
					_exit(4);
				r.type = CVD_T_LANE_OK;
				r.size = 12288;
				send_frame_fd(fd, &r, mfd);
				close(mfd);
			} else if (f.type == CVD_T_CALL) {
				v4_call(fd, buf, 16 + plen, 'S');
			} else {
				_exit(3);
			}
			continue;
		}
		if (f.type == CVD_T_HELLO && refuse == PEER_V3_W4) {
			memset(&r, 0, sizeof r);
			r.id = f.id;
			r.type = CVD_T_HELLO_OK;
			r.version = 3;
			r.info.world_rank = W4_RANK;
			r.info.local_rank = W4_RANK;
			r.info.world_size = r.info.local_size = W4_SIZE;
			r.info.node_count = 1;
			r.info.inline_limit = 64;
			r.info.max_frame = 4096;
			r.info.max_in_flight = 8;
			r.info.timeout_ms = 1000;
			r.size = 60000;
			send_frame(fd, &r);
			continue;
		}
		if (f.type == CVD_T_HELLO) {
			send_hello_ok(fd, f.id, refuse == PEER_V3 ? 3 : refuse >= PEER_LANE_SHORT_FD ? 2 : 1);
			continue;
		}
		if (f.type == CVD_T_STATUS) {
			/* A document of STATUS_BIG bytes, far past max_frame (4096), as
			 * the largest worlds' are; then, on a second STATUS, one byte
			 * past the bound STATUS_OK has. */
			static int statuses;
			size_t n = statuses++ ? CVD_MAX_STATUS_FRAME + 1 : STATUS_BIG;
			uint8_t *big = (uint8_t *)malloc(16 + n);
			if (!big)
				_exit(9);
			memset(&r, 0, sizeof r);
			r.id = f.id;
			r.type = CVD_T_STATUS_OK;
			if (cvd_frame_encode(&r, big, 16) != 16)
				_exit(9);
			big[0] = (uint8_t)n; /* the length, little-endian */
			big[1] = (uint8_t)(n >> 8);
			big[2] = (uint8_t)(n >> 16);
			big[3] = (uint8_t)(n >> 24);
			memset(big + 16, 'x', n);
			big[16] = '{';
			big[16 + n - 1] = '}';
			if (write_all(fd, big, 16 + n) != 0)
				_exit(2);
			free(big);
			continue;
		}
		if (f.type == CVD_T_ALLOC && refuse == PEER_V3_W4 && nsegs < 16) {
			char tmp[] = "/tmp/cvd-seg-XXXXXX"; /* a file will do: the client maps what it gets */
			int mfd = mkstemp(tmp);
			void *m;
			if (mfd < 0 || ftruncate(mfd, (off_t)f.size) != 0)
				_exit(8);
			unlink(tmp);
			m = mmap(NULL, (size_t)f.size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
			if (m == MAP_FAILED)
				_exit(8);
			segs[nsegs].id = (uint32_t)nsegs + 1;
			segs[nsegs].base = (uint8_t *)m;
			segs[nsegs].size = (size_t)f.size;
			r.type = CVD_T_ALLOC_OK;
			r.segment = segs[nsegs].id;
			r.size = f.size;
			nsegs++;
			send_frame_fd(fd, &r, mfd);
			close(mfd);
			continue;
		}
		if (f.type == CVD_T_FREE && refuse == PEER_V3_W4) {
			r.type = CVD_T_FREE_OK;
			send_frame(fd, &r);
			continue;
		}
		if (f.type == CVD_T_CALL && refuse == PEER_V3_W4) {
			v3_answer(fd, buf, 16 + plen, segs, nsegs);
			continue;
		}
		if (f.type == CVD_T_LANE) {
			/* A file of 4096 bytes: LANE_OK either claims the lane's
			 * 12288 (more than the file has) or says 4096. */
			char tmp[] = "/tmp/cvd-lane-XXXXXX";
			int mfd = mkstemp(tmp);
			int good = refuse == PEER_LANE_BAD_WAKE || refuse == PEER_LANE_BAD_ANSWER;
			if (mfd < 0 || ftruncate(mfd, good ? 12288 : 4096) != 0)
				_exit(4);
			unlink(tmp);
			r.type = CVD_T_LANE_OK;
			r.size = refuse == PEER_LANE_WRONG_SIZE ? 4096 : 12288;
			send_frame_fd(fd, &r, mfd);
			if (refuse == PEER_LANE_BAD_ANSWER) {
				/* An answer on the lane that is not one: a STATUS_OK in the
				 * d2c slot (offset 8192), d2c_seq (offset 128) moved to 1. */
				uint8_t *lane = mmap(NULL, 12288, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
				memset(&r, 0, sizeof r);
				r.type = CVD_T_STATUS_OK;
				if (lane == MAP_FAILED || cvd_frame_encode(&r, lane + 8192, 4096) != 16)
					_exit(5);
				__atomic_store_n((uint32_t *)(void *)(lane + 128), 1u, __ATOMIC_SEQ_CST);
			}
			close(mfd);
			if (good) { /* then a ring: with an id (not one), or for the answer above */
				memset(&r, 0, sizeof r);
				r.type = CVD_T_WAKE_CLIENT;
				r.id = refuse == PEER_LANE_BAD_WAKE ? 7 : 0;
				send_frame(fd, &r);
			}
			continue;
		}
		if (f.type != CVD_T_CALL)
			_exit(3);
		if (f.name_len == 6 && memcmp(f.name, "silent", 6) == 0)
			continue;
		if (f.name_len == 5 && memcmp(f.name, "fatal", 5) == 0) {
			r.type = CVD_T_ERROR;
			r.id = 0;
			r.frame_flags = CVD_FLAG_FATAL;
			r.code = CVD_E_BAD_FRAME;
			r.data = (const uint8_t *)"scripted fatal error";
			r.data_len = strlen("scripted fatal error");
			send_frame(fd, &r);
			close(fd);
			_exit(0);
		}
		r.type = CVD_T_CALL_OK;
		r.seq = f.id;
		r.data = f.data;
		r.data_len = f.data_len;
		if (f.name_len == 4 && memcmp(f.name, "hold", 4) == 0) {
			held_n = cvd_frame_encode(&r, held, sizeof held);
			continue;
		}
		send_frame(fd, &r);
		if (held_n) {
			if (write(fd, held, held_n) != (ssize_t)held_n)
				_exit(2);
			held_n = 0;
		}
	}
}

static pid_t start_peer(const char *path, int refuse)
{
	struct sockaddr_un sa;
	pid_t p;
	int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	strcpy(sa.sun_path, path);
	unlink(path);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 1) != 0) {
		CHECK(0, "cannot listen on %s", path);
		return -1;
	}
	fflush(stdout);
	fflush(stderr);
	p = fork();
	if (p == 0) {
		peer(lfd, refuse);
		_exit(0);
	}
	close(lfd);
	return p;
}

static void stop_peer(pid_t p, const char *path)
{
	int st;
	if (p > 0) {
		kill(p, SIGKILL);
		waitpid(p, &st, 0);
	}
	unlink(path);
}

static int64_t ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static cvd_request *named(cvd_client *c, float *x, size_t n, const char *name, cvd_error *err)
{
	cvd_call call;
	memset(&call, 0, sizeof call);
	call.op = CVD_ALLREDUCE;
	call.dtype = CVD_FLOAT32;
	call.reduce = CVD_SUM;
	call.buf = x;
	call.count = n;
	call.name = name;
	return cvd_call_async(c, &call, err);
}

/* The default wait comes from HELLO_OK: from a version-3 daemon with a
 * 1 s collective and a 60 s first-call timeout, the larger plus two 5 s
 * margins (so the daemon's TIMEOUT comes first on a generation's first
 * call too); from a version-2 daemon (asked again after refusing 3), which
 * does not state the first call's, 2 * 1 s plus two margins. An explicit
 * cvd_options.timeout_ms wins. */
static void test_default_wait(const char *path)
{
	static const struct { int mode; unsigned version; int64_t want; uint64_t first; } cases[] = {
		{PEER_V3, 3, 70000, 60000},
		{PEER_V2_ONLY, 2, 12000, 0},
	};
	cvd_options o;
	cvd_error err;
	size_t i;
	int explicit_wait;
	for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		for (explicit_wait = 0; explicit_wait < 2; explicit_wait++) {
			pid_t p = start_peer(path, cases[i].mode);
			cvd_client *c;
			int64_t want = explicit_wait ? 2500 : cases[i].want;
			cvd_options_init(&o);
			o.job = "demo";
			o.no_lane = 1; /* this peer answers no LANE as a daemon would */
			o.timeout_ms = explicit_wait ? 2500 : 0;
			c = cvd_connect(path, &o, &err);
			CHECK(c != NULL, "connect to a version-%u peer: %s", cases[i].version, err.message);
			if (c) {
				CHECK(cvd_get_info(c)->version == cases[i].version &&
				      cvd_first_call_timeout_ms(c) == cases[i].first && cvd_default_timeout_ms(c) == want,
				      "version-%u peer: version %u, first call %llu ms, default wait %lld ms; want %lld",
				      cases[i].version, (unsigned)cvd_get_info(c)->version,
				      (unsigned long long)cvd_first_call_timeout_ms(c), (long long)cvd_default_timeout_ms(c),
				      (long long)want);
				CHECK(explicit_wait || cases[i].version < 3 || cvd_default_timeout_ms(c) > 60000,
				      "the default wait %lld ms does not outlast the first-call timeout",
				      (long long)cvd_default_timeout_ms(c));
				CHECK(cvd_barrier(c, &err) == 0, "barrier on version %u: %s", cases[i].version, err.message);
			}
			cvd_close(c);
			stop_peer(p, path);
		}
	}
}

/* Connecting to a peer in mode must fail with code (a daemon's own error
 * is fatal), its message holding want (and want2, if not NULL). */
static void expect_refused(const char *path, const cvd_options *o, int mode, int code, const char *want,
			   const char *want2, const char *what)
{
	cvd_error err;
	pid_t p = start_peer(path, mode);
	cvd_client *c = cvd_connect(path, o, &err);
	int from_daemon = code == CVD_E_VERSION || code == CVD_E_PERMISSION;
	CHECK(c == NULL && err.code == code && (!from_daemon || err.fatal) && strstr(err.message, want) != NULL &&
	      (want2 == NULL || strstr(err.message, want2) != NULL),
	      "%s: %d %s", what, c ? 0 : err.code, c ? "connected" : err.message);
	cvd_close(c);
	stop_peer(p, path);
}

/* A peer in mode gives a lane, then answers a call wrongly: the call fails
 * with CVD_E_PROTOCOL, its message holding want. */
static void expect_lane_call_refused(const char *path, const cvd_options *o, int mode, const char *want,
				     const char *what)
{
	cvd_error err;
	pid_t p = start_peer(path, mode);
	cvd_client *c = cvd_connect(path, o, &err);
	CHECK(c != NULL && cvd_has_lane(c), "%s: connect to a peer with a lane: %s", what,
	      c ? "no lane" : err.message);
	if (c) {
		int rc = cvd_barrier(c, &err);
		CHECK(rc == CVD_E_PROTOCOL && strstr(err.message, want) != NULL, "%s: %d %s", what, rc, err.message);
	}
	cvd_close(c);
	stop_peer(p, path);
}

/* Connecting with every fd of this process taken but one (for the client's
 * socket): the fd LANE_OK carries cannot be received, and connect fails
 * saying the process is out of file descriptors, not that the peer sent
 * too many. */
static void expect_out_of_fds(const char *path, const cvd_options *o)
{
	int fds[256], n = 0;
	struct rlimit old, low;
	cvd_error err;
	cvd_client *c;
	pid_t p = start_peer(path, PEER_LANE_WRONG_SIZE);
	if (getrlimit(RLIMIT_NOFILE, &old) != 0) {
		CHECK(0, "getrlimit: %s", strerror(errno));
		stop_peer(p, path);
		return;
	}
	low = old;
	low.rlim_cur = 64;
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit: %s", strerror(errno));
	while (n < 256 && (fds[n] = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0)
		n++;
	CHECK(n > 0 && n < 256 && errno == EMFILE, "filling the fd table: %d fds, %s", n, strerror(errno));
	if (n > 0)
		close(fds[--n]); /* the client's socket */
	c = cvd_connect(path, o, &err);
	while (n > 0)
		close(fds[--n]);
	setrlimit(RLIMIT_NOFILE, &old);
	CHECK(c == NULL && err.code == CVD_E_SYSTEM &&
		      strstr(err.message, "could not be received: this process is out of file descriptors"),
	      "connect out of fds: %d %s", c ? 0 : err.code, c ? "connected" : err.message);
	cvd_close(c);
	stop_peer(p, path);
}

/* The CALL frames the PEER_V3_W4 peer received, in order: up to max of
 * them into frames (each malloc'd: free them). */
static size_t recorded(uint8_t **frames, size_t *lens, size_t max)
{
	FILE *f = fopen(v3_record, "rb");
	uint32_t n;
	size_t k = 0;
	if (!f)
		return 0;
	while (k < max && fread(&n, 4, 1, f) == 1) {
		frames[k] = (uint8_t *)malloc(n);
		if (!frames[k] || fread(frames[k], 1, n, f) != n) {
			free(frames[k]);
			break;
		}
		lens[k++] = n;
	}
	fclose(f);
	return k;
}

/* The last CALL the peer received, decoded into *f and *x (its bytes in
 * *keep, which the caller frees); 0 if there is none. */
static int last_call(cvd_frame *f, cvd_call_ext *x, uint8_t **keep)
{
	uint8_t *frames[64];
	size_t lens[64], n = recorded(frames, lens, 64), i;
	cvd_error err;
	int ok = 0;
	*keep = NULL;
	if (n) {
		ok = cvd_frame_decode_ext(frames[n - 1], lens[n - 1], 8192, 3, f, x, &err) == 0;
		CHECK(ok, "the last CALL does not decode: %s", err.message);
		*keep = frames[n - 1];
	}
	for (i = 0; i + 1 < n; i++)
		free(frames[i]);
	return ok;
}

/* What PEER_V3_W4 answers an allgather(v) with: the caller's bytes at its
 * block, other_byte(j, i) in block j. */
static void expect_allgather(uint8_t *want, const void *mine, const uint64_t *counts, size_t count, size_t esize)
{
	size_t j, i, at = 0;
	for (j = 0; j < W4_SIZE; j++) {
		size_t n = (counts ? counts[j] : count) * esize;
		for (i = 0; i < n; i++)
			want[at + i] = j == W4_RANK ? ((const uint8_t *)mine)[i] : other_byte((uint32_t)j, i);
		at += n;
	}
}

/* The version-3 calls against a peer of protocol version 3 playing rank 1
 * of a world of 4 with an inline limit of 64 bytes: the frames they send
 * (op, extension, spans) and where their results land, for each way the
 * buffers travel (inline, a scratch segment, the caller's segments), and
 * the errors the client finds itself. */
static void test_v3_calls(const char *path)
{
	cvd_options o;
	cvd_error err;
	cvd_client *c;
	cvd_frame f;
	cvd_call_ext x;
	cvd_call_opts opts;
	uint8_t *keep = NULL, want[1024];
	float send8[8], recv32[32];
	double d6[6];
	int32_t i8[8], o2[2];
	uint64_t before;
	size_t i;
	pid_t p;
	snprintf(v3_record, sizeof v3_record, "%s.frames", path);
	unlink(v3_record);
	p = start_peer(path, PEER_V3_W4);
	cvd_options_init(&o);
	o.job = "demo";
	o.no_lane = 1;
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL && cvd_rank(c) == W4_RANK && cvd_size(c) == W4_SIZE, "connect to the v3 peer: %s",
	      c ? "wrong world" : err.message);
	if (!c) {
		stop_peer(p, path);
		return;
	}
	for (i = 0; i < 8; i++) {
		send8[i] = (float)i + 0.5f;
		i8[i] = (int32_t)i;
	}

	/* inline allgather: 8 bytes in, 32 out; no extension */
	memset(recv32, 0, sizeof recv32);
	CHECK(cvd_allgather(c, send8, recv32, 2, CVD_FLOAT32, NULL, &err) == 0, "inline allgather: %s", err.message);
	expect_allgather(want, send8, NULL, 2, 4);
	CHECK(memcmp(recv32, want, 32) == 0, "inline allgather: wrong result");
	CHECK(last_call(&f, &x, &keep) && f.op == CVD_ALLGATHER && f.dtype == CVD_FLOAT32 && f.flags == 0 &&
	      f.count == 2 && f.data_len == 8, "inline allgather frame: op %u flags %u count %llu data %lu", f.op,
	      f.flags, (unsigned long long)f.count, (unsigned long)f.data_len);
	free(keep);

	/* 32 bytes in, 128 out: over the inline limit, through one scratch
	 * segment, the input at 0 and the output after it (OUT) */
	memset(recv32, 0, sizeof recv32);
	CHECK(cvd_allgather(c, send8, recv32, 8, CVD_FLOAT32, NULL, &err) == 0, "scratch allgather: %s", err.message);
	expect_allgather(want, send8, NULL, 8, 4);
	CHECK(memcmp(recv32, want, 128) == 0, "scratch allgather: wrong result");
	CHECK(last_call(&f, &x, &keep) && f.flags == (CVD_CALL_SHM | CVD_CALL_EXT) && x.xflags == CVD_X_OUT &&
	      x.ndim == 0 && f.offset == 0 && x.out_segment == f.segment && x.out_offset == 32,
	      "scratch allgather frame: flags %u xflags %u segment %u+%llu out %u+%llu", f.flags, x.xflags,
	      f.segment, (unsigned long long)f.offset, x.out_segment, (unsigned long long)x.out_offset);
	free(keep);

	/* in place in the caller's segment: the input is its own block of the
	 * output; only the spans travel */
	{
		float *seg = (float *)cvd_alloc(c, 4096, &err);
		CHECK(seg != NULL, "alloc: %s", err.message);
		if (seg) {
			float *outp = seg + 16, *mine = outp + W4_RANK * 3;
			for (i = 0; i < 3; i++)
				mine[i] = (float)i * 2;
			memcpy(send8, mine, 12);
			before = cvd_bytes_sent(c);
			CHECK(cvd_allgather(c, mine, outp, 3, CVD_FLOAT32, NULL, &err) == 0, "in-place allgather: %s",
			      err.message);
			CHECK(cvd_bytes_sent(c) - before < 128, "in-place allgather sent %llu bytes",
			      (unsigned long long)(cvd_bytes_sent(c) - before));
			expect_allgather(want, send8, NULL, 3, 4);
			CHECK(memcmp(outp, want, 48) == 0, "in-place allgather: wrong result");
			CHECK(last_call(&f, &x, &keep) && (f.flags & CVD_CALL_SHM) && x.xflags == CVD_X_OUT &&
			      f.segment == x.out_segment && x.out_offset == 64 && f.offset == 64 + 12,
			      "in-place allgather spans: %u+%llu out %u+%llu", f.segment, (unsigned long long)f.offset,
			      x.out_segment, (unsigned long long)x.out_offset);
			free(keep);
			/* reduce_scatter with the input in the segment, the output
			 * (96 bytes, over the inline limit) in plain memory: a
			 * scratch segment for the output only */
			for (i = 0; i < 96; i++)
				seg[i] = (float)(10 + i);
			memset(recv32, 0, sizeof recv32);
			CHECK(cvd_reduce_scatter(c, seg, recv32, 96, CVD_FLOAT32, CVD_SUM, NULL, &err) == 0,
			      "reduce_scatter, input in a segment: %s", err.message);
			CHECK(recv32[0] == 34 && recv32[23] == 57 && recv32[24] == 0, "reduce_scatter result %g %g %g",
			      recv32[0], recv32[23], recv32[24]);
			CHECK(last_call(&f, &x, &keep) && (f.flags & CVD_CALL_SHM) && f.offset == 0 &&
			      x.xflags == CVD_X_OUT && x.out_segment != f.segment && x.out_offset == 0,
			      "reduce_scatter spans: %u+%llu out %u+%llu", f.segment, (unsigned long long)f.offset,
			      x.out_segment, (unsigned long long)x.out_offset);
			free(keep);
			/* reduce_scatterv whose own block is empty, input in the
			 * segment: the (empty) output span is that block, in place */
			{
				static const uint64_t counts[4] = {3, 0, 4, 1};
				CHECK(cvd_reduce_scatterv(c, seg, 8, recv32, counts, CVD_FLOAT32, CVD_MAX, NULL, &err) == 0,
				      "reduce_scatterv, empty block: %s", err.message);
				CHECK(last_call(&f, &x, &keep) && (f.flags & CVD_CALL_SHM) && f.offset == 0 &&
				      x.xflags == (CVD_X_COUNTS | CVD_X_OUT) && x.ncounts == 4 &&
				      cvd_call_ext_count(&x, 2) == 4 && x.out_segment == f.segment && x.out_offset == 12,
				      "empty block spans: xflags %u %u+%llu out %u+%llu", x.xflags, f.segment,
				      (unsigned long long)f.offset, x.out_segment, (unsigned long long)x.out_offset);
				free(keep);
			}
			CHECK(cvd_free(c, seg, &err) == 0, "free: %s", err.message);
		}
	}

	/* allgatherv inline: this rank gives nothing, the result is 48 bytes */
	{
		static const uint64_t counts[4] = {1, 0, 2, 3};
		memset(d6, 0, sizeof d6);
		CHECK(cvd_allgatherv(c, NULL, 0, d6, counts, CVD_FLOAT64, NULL, &err) == 0, "allgatherv: %s", err.message);
		expect_allgather(want, NULL, counts, 0, 8);
		CHECK(memcmp(d6, want, 48) == 0, "allgatherv: wrong result");
		CHECK(last_call(&f, &x, &keep) && f.flags == CVD_CALL_EXT && x.xflags == CVD_X_COUNTS && x.ncounts == 4 &&
		      cvd_call_ext_count(&x, 0) == 1 && cvd_call_ext_count(&x, 3) == 3 && f.count == 0 && f.data_len == 0,
		      "allgatherv frame: flags %u xflags %u ncounts %u", f.flags, x.xflags, x.ncounts);
		free(keep);
		/* the count must be this rank's own */
		CHECK(cvd_allgatherv(c, send8, 2, d6, counts, CVD_FLOAT64, NULL, &err) == CVD_E_INVALID &&
		      strstr(err.message, "cvd_allgatherv: count 2 disagrees with counts[1] = 0"),
		      "allgatherv with a count not its own: %d %s", err.code, err.message);
		CHECK(cvd_allgatherv(c, send8, 0, d6, NULL, CVD_FLOAT64, NULL, &err) == CVD_E_INVALID,
		      "allgatherv without counts: %d %s", err.code, err.message);
	}

	/* reduce_scatterv inline with a shape and scale factors, by name */
	{
		static const uint64_t counts[4] = {1, 2, 3, 2}, shape[2] = {4, 2};
		float in8[8];
		double pre = 1.0 / 3;
		for (i = 0; i < 8; i++)
			in8[i] = (float)(i + 1);
		cvd_call_opts_init(&opts);
		opts.name = "grads";
		opts.shape = shape;
		opts.ndim = 2;
		opts.prescale = pre;
		opts.postscale = -2.5;
		memset(recv32, 0, sizeof recv32);
		CHECK(cvd_reduce_scatterv(c, in8, 8, recv32, counts, CVD_FLOAT32, CVD_AVG, &opts, &err) == 0,
		      "reduce_scatterv with options: %s", err.message);
		CHECK(recv32[0] == 2 && recv32[1] == 3 && recv32[2] == 0, "reduce_scatterv result %g %g", recv32[0],
		      recv32[1]);
		CHECK(last_call(&f, &x, &keep) && f.op == CVD_REDUCE_SCATTER && f.reduce == CVD_AVG && f.flags == CVD_CALL_EXT &&
		      f.name_len == 5 && memcmp(f.name, "grads", 5) == 0 &&
		      x.xflags == (CVD_X_COUNTS | CVD_X_SCALE) && x.ndim == 2 && x.dims[0] == 4 && x.dims[1] == 2 &&
		      memcmp(&x.prescale, &pre, 8) == 0 && x.postscale == -2.5,
		      "reduce_scatterv frame: op %u reduce %u flags %u xflags %u ndim %u pre %.17g post %g", f.op, f.reduce,
		      f.flags, x.xflags, x.ndim, x.prescale, x.postscale);
		free(keep);
		/* a shape whose product is not the count */
		opts.ndim = 1;
		CHECK(cvd_reduce_scatterv(c, in8, 8, recv32, counts, CVD_FLOAT32, CVD_SUM, &opts, &err) == CVD_E_INVALID &&
		      strstr(err.message, "the shape's product is 4, the count 8"), "bad shape: %d %s", err.code,
		      err.message);
		/* scale factors on integers, avg of integers, scale on max */
		opts.ndim = 0;
		CHECK(cvd_reduce_scatter(c, i8, o2, 8, CVD_INT32, CVD_SUM, &opts, &err) == CVD_E_INVALID &&
		      strstr(err.message, "prescale and postscale needs a float dtype"), "scale on int32: %s", err.message);
		CHECK(cvd_allreduce(c, i8, 8, CVD_INT32, CVD_AVG, &err) == CVD_E_INVALID &&
		      strstr(err.message, "avg needs a float dtype (float16, bfloat16, float32 or float64), not int32"),
		      "avg on int32: %s", err.message);
		CHECK(cvd_allreduce_opts(c, in8, 8, CVD_FLOAT32, CVD_MAX, &opts, &err) == CVD_E_INVALID &&
		      strstr(err.message, "need sum or avg, not max"), "scale on max: %s", err.message);
		CHECK(cvd_reduce_scatter(c, in8, recv32, 6, CVD_FLOAT32, CVD_SUM, NULL, &err) == CVD_E_INVALID &&
		      strstr(err.message, "count 6 is not a multiple of the world size 4"), "count 6 of 4 ranks: %s",
		      err.message);
		CHECK(cvd_reduce_scatterv(c, in8, 7, recv32, counts, CVD_FLOAT32, CVD_SUM, NULL, &err) == CVD_E_INVALID &&
		      strstr(err.message, "the counts sum to 8, the count is 7"), "counts not summing: %s", err.message);
	}

	/* reduce: the root and the reduce op travel; bfloat16 */
	{
		uint16_t b[3] = {cvd_f32_to_bf16(1), cvd_f32_to_bf16(-2), cvd_f32_to_bf16(0.5f)};
		CHECK(cvd_reduce(c, b, 3, CVD_BFLOAT16, CVD_SUM, 3, NULL, &err) == 0, "reduce: %s", err.message);
		CHECK(last_call(&f, &x, &keep) && f.op == CVD_REDUCE && f.root == 3 && f.reduce == CVD_SUM &&
		      f.dtype == CVD_BFLOAT16 && f.flags == 0 && f.data_len == 6 && b[2] == 0x3f00,
		      "reduce frame: op %u root %u reduce %u dtype %u", f.op, f.root, f.reduce, f.dtype);
		free(keep);
	}

	/* a result of the wrong length is the daemon's fault: the call fails */
	cvd_call_opts_init(&opts);
	opts.name = "short";
	CHECK(cvd_allgather(c, send8, recv32, 2, CVD_FLOAT32, &opts, &err) == CVD_E_PROTOCOL &&
	      strstr(err.message, "CALL_OK result is 31 bytes, the call expects 32"), "short result: %d %s", err.code,
	      err.message);
	/* the generic form: an allgather needs its output buffer */
	{
		cvd_call call;
		memset(&call, 0, sizeof call);
		call.op = CVD_ALLGATHER;
		call.dtype = CVD_INT32;
		call.buf = i8;
		call.count = 2;
		CHECK(cvd_call_sync(c, &call, &err) == CVD_E_INVALID &&
		      strstr(err.message, "allgather needs an output buffer of 8 elements"), "allgather without out: %s",
		      err.message);
		call.op = CVD_ALLREDUCE;
		call.reduce = CVD_SUM;
		CHECK(cvd_call_sync_opts(c, &call, o2, NULL, NULL, &err) == CVD_E_INVALID &&
		      strstr(err.message, "allreduce takes no output buffer"), "allreduce with out: %s", err.message);
	}
	cvd_close(c);
	stop_peer(p, path);
	unlink(v3_record);
}

/* A daemon of protocol version 2: every version-3 call fails at once,
 * naming the version, and sends nothing; the connection goes on. */
static void test_v3_calls_on_v2(const char *path)
{
	cvd_options o;
	cvd_error err;
	cvd_client *c;
	cvd_call_opts opts;
	static const uint64_t counts[2] = {1, 1}, shape[1] = {2};
	float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[16];
	uint64_t before;
	int k;
	pid_t p = start_peer(path, PEER_V2_ONLY);
	cvd_options_init(&o);
	o.job = "demo";
	o.no_lane = 1;
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL && cvd_get_info(c)->version == 2, "connect to a version-2 daemon: %s", c ? "" : err.message);
	if (!c) {
		stop_peer(p, path);
		return;
	}
	cvd_call_opts_init(&opts);
	before = cvd_bytes_sent(c);
	for (k = 0; k < 9; k++) {
		static const char *const want[] = {
			"cvd_allgather: allgather needs protocol version 3; the daemon speaks 2",
			"cvd_allgatherv: allgather needs protocol version 3",
			"cvd_reduce_scatter: reduce_scatter needs protocol version 3",
			"cvd_reduce_scatterv: reduce_scatter needs protocol version 3",
			"cvd_reduce: reduce needs protocol version 3",
			"cvd_allreduce: dtype bfloat16 needs protocol version 3",
			"cvd_allreduce: reduce op avg needs protocol version 3",
			"cvd_allreduce: a shape needs protocol version 3",
			"cvd_allreduce: prescale and postscale needs protocol version 3"};
		int rc;
		switch (k) {
		case 0: rc = cvd_allgather(c, x, y, 1, CVD_FLOAT32, NULL, &err); break;
		case 1: rc = cvd_allgatherv(c, x, 1, y, counts, CVD_FLOAT32, NULL, &err); break;
		case 2: rc = cvd_reduce_scatter(c, x, y, 2, CVD_FLOAT32, CVD_SUM, NULL, &err); break;
		case 3: rc = cvd_reduce_scatterv(c, x, 2, y, counts, CVD_FLOAT32, CVD_SUM, NULL, &err); break;
		case 4: rc = cvd_reduce(c, x, 2, CVD_FLOAT32, CVD_SUM, 0, NULL, &err); break;
		case 5: rc = cvd_allreduce(c, x, 2, CVD_BFLOAT16, CVD_SUM, &err); break;
		case 6: rc = cvd_allreduce(c, x, 2, CVD_FLOAT32, CVD_AVG, &err); break;
		case 7:
			opts.shape = shape;
			opts.ndim = 1;
			rc = cvd_allreduce_opts(c, x, 2, CVD_FLOAT32, CVD_SUM, &opts, &err);
			break;
		default:
			opts.ndim = 0;
			opts.postscale = 0.5;
			rc = cvd_allreduce_opts(c, x, 2, CVD_FLOAT32, CVD_SUM, &opts, &err);
			break;
		}
		CHECK(rc == CVD_E_UNSUPPORTED && err.code == CVD_E_UNSUPPORTED && strstr(err.message, want[k]),
		      "version-3 call %d on a version-2 daemon: %d %s", k, rc, err.message);
	}
	CHECK(cvd_bytes_sent(c) == before, "%llu bytes sent for refused calls",
	      (unsigned long long)(cvd_bytes_sent(c) - before));
	/* ... and a scale factor of 1 is no scaling at all: this one goes */
	opts.postscale = 1;
	CHECK(cvd_allreduce_opts(c, x, 2, CVD_FLOAT32, CVD_SUM, &opts, &err) == 0 && cvd_barrier(c, &err) == 0,
	      "calls of version 2 after the refused ones: %s", err.message);
	cvd_close(c);
	stop_peer(p, path);
}

/* The lines of v4_record (each without its newline) into lines, up to
 * max; returns how many. */
static size_t v4_lines(char lines[][300], size_t max)
{
	FILE *f = fopen(v4_record, "r");
	size_t n = 0;
	if (!f)
		return 0;
	while (n < max && fgets(lines[n], 300, f)) {
		lines[n][strcspn(lines[n], "\n")] = '\0';
		n++;
	}
	fclose(f);
	return n;
}

/* Named calls (protocol version 4) against PEER_V4: they set NAMED on
 * every op; never take the lane, which an ordinary call with nothing in
 * flight does; need a name; and a name may be in flight once: a second
 * call of it fails at once (CVD_E_INVALID naming it), sending nothing,
 * until the first is answered. Against a version-3 daemon they fail at
 * once (CVD_E_UNSUPPORTED). */
static void test_named_calls(const char *path)
{
	static const char *const want[] = {
		"L 0 ",          /* the ordinary call: on the lane */
		"S 4 wait.a",    /* named, nothing else in flight: on the socket */
		"S 4 wait.b",
		"S 0 wait.a",    /* an ordinary call of a name in flight as a named one */
		"S 4 release",
		"S 4 wait.a",    /* the name again, once answered; nothing in flight */
		"S 4 release",
		"S 4 gather",    /* every op named, each with nothing else in flight */
		"S 4 scatter",
		"S 4 reduce",
		"S 4 bcast",
		"S 4 barrier",
		"S 6 shaped",    /* NAMED with the extension */
		"L 0 after",     /* an ordinary call takes the lane again */
	};
	char lines[32][300];
	cvd_options o;
	cvd_error err;
	cvd_client *c;
	cvd_call_opts opts, plain;
	cvd_request *a, *b, *s;
	cvd_call call;
	float x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8}, z[4];
	static const uint64_t shape[2] = {2, 2};
	uint64_t before;
	size_t n, i;
	int rc;
	pid_t p;
	snprintf(v4_record, sizeof v4_record, "/tmp/cvd-v4-record-%ld", (long)getpid());
	unlink(v4_record);
	p = start_peer(path, PEER_V4);
	cvd_options_init(&o);
	o.job = "demo";
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL && cvd_get_info(c)->version == 4 && cvd_has_lane(c), "connect to a version-4 daemon: %s",
	      c ? "not version 4 with a lane" : err.message);
	if (!c) {
		stop_peer(p, path);
		return;
	}
	cvd_call_opts_init(&opts);
	cvd_call_opts_init(&plain);
	opts.named = 1;
	CHECK(cvd_allreduce(c, x, 4, CVD_FLOAT32, CVD_SUM, &err) == 0, "an ordinary call: %s", err.message);

	opts.name = "wait.a";
	a = cvd_allreduce_opts_async(c, x, 4, CVD_FLOAT32, CVD_SUM, &opts, &err);
	CHECK(a != NULL, "named call wait.a: %s", err.message);
	before = cvd_bytes_sent(c);
	rc = cvd_allreduce_opts(c, y, 4, CVD_FLOAT32, CVD_SUM, &opts, &err);
	CHECK(rc == CVD_E_INVALID && err.code == CVD_E_INVALID &&
		      strstr(err.message, "cvd_allreduce: named call \"wait.a\": this client's call of that name") &&
		      strstr(err.message, "is still in flight"),
	      "a second call of a name in flight: %d %s", rc, err.message);
	rc = cvd_allgather(c, y, z, 1, CVD_FLOAT32, &opts, &err);
	CHECK(rc == CVD_E_INVALID && strstr(err.message, "cvd_allgather: named call \"wait.a\""),
	      "a second call of a name in flight, allgather: %d %s", rc, err.message);
	opts.name = NULL;
	rc = cvd_allreduce_opts(c, y, 4, CVD_FLOAT32, CVD_SUM, &opts, &err);
	CHECK(rc == CVD_E_INVALID && strstr(err.message, "a named call needs a name"), "named without a name: %d %s",
	      rc, err.message);
	opts.name = "";
	memset(&call, 0, sizeof call);
	call.op = CVD_BARRIER;
	rc = cvd_call_sync_opts(c, &call, NULL, NULL, &opts, &err);
	CHECK(rc == CVD_E_INVALID && strstr(err.message, "a named call needs a name"),
	      "named barrier with an empty name: %d %s", rc, err.message);
	CHECK(cvd_bytes_sent(c) == before, "%llu bytes sent for refused calls",
	      (unsigned long long)(cvd_bytes_sent(c) - before));

	opts.name = "wait.b";
	b = cvd_allreduce_opts_async(c, y, 4, CVD_FLOAT32, CVD_SUM, &opts, &err);
	CHECK(b != NULL, "another name: %s", err.message);
	plain.name = "wait.a";
	s = cvd_allreduce_opts_async(c, z, 4, CVD_FLOAT32, CVD_SUM, &plain, &err);
	CHECK(s != NULL, "an ordinary call named as a named call in flight: %s", err.message);
	opts.name = "release";
	CHECK(cvd_allreduce_opts(c, z, 4, CVD_FLOAT32, CVD_SUM, &opts, &err) == 0, "release: %s", err.message);
	CHECK(a && cvd_wait(a, 2000, &err) == 0, "wait.a: %s", err.message);
	CHECK(b && cvd_wait(b, 2000, &err) == 0, "wait.b: %s", err.message);
	CHECK(s && cvd_wait(s, 2000, &err) == 0, "the ordinary wait.a: %s", err.message);

	/* answered: the name is free again */
	opts.name = "wait.a";
	a = cvd_allreduce_opts_async(c, x, 4, CVD_FLOAT32, CVD_SUM, &opts, &err);
	CHECK(a != NULL, "wait.a after its answer: %s", err.message);
	opts.name = "release";
	CHECK(cvd_allreduce_opts(c, z, 4, CVD_FLOAT32, CVD_SUM, &opts, &err) == 0, "release: %s", err.message);
	CHECK(a && cvd_wait(a, 2000, &err) == 0, "wait.a again: %s", err.message);

	opts.name = "gather";
	CHECK(cvd_allgather(c, x, z, 2, CVD_FLOAT32, &opts, &err) == 0, "named allgather: %s", err.message);
	opts.name = "scatter";
	CHECK(cvd_reduce_scatter(c, x, z, 4, CVD_FLOAT32, CVD_SUM, &opts, &err) == 0, "named reduce_scatter: %s",
	      err.message);
	opts.name = "reduce";
	CHECK(cvd_reduce(c, x, 4, CVD_FLOAT32, CVD_MAX, 0, &opts, &err) == 0, "named reduce: %s", err.message);
	opts.name = "bcast";
	memset(&call, 0, sizeof call);
	call.op = CVD_BROADCAST;
	call.dtype = CVD_FLOAT32;
	call.buf = x;
	call.count = 4;
	CHECK(cvd_call_sync_opts(c, &call, NULL, NULL, &opts, &err) == 0, "named broadcast: %s", err.message);
	opts.name = "barrier";
	memset(&call, 0, sizeof call);
	call.op = CVD_BARRIER;
	CHECK(cvd_call_sync_opts(c, &call, NULL, NULL, &opts, &err) == 0, "named barrier: %s", err.message);
	opts.name = "shaped";
	opts.shape = shape;
	opts.ndim = 2;
	CHECK(cvd_allreduce_opts(c, x, 4, CVD_FLOAT32, CVD_SUM, &opts, &err) == 0, "named with a shape: %s",
	      err.message);
	plain.name = "after";
	CHECK(cvd_allreduce_opts(c, x, 4, CVD_FLOAT32, CVD_SUM, &plain, &err) == 0 && x[3] == 4,
	      "an ordinary call after the named ones: %s", err.message);
	cvd_close(c);
	stop_peer(p, path);
	n = v4_lines(lines, 32);
	CHECK(n == sizeof want / sizeof want[0], "the peer read %lu calls, want %lu", (unsigned long)n,
	      (unsigned long)(sizeof want / sizeof want[0]));
	for (i = 0; i < n && i < sizeof want / sizeof want[0]; i++)
		CHECK(strcmp(lines[i], want[i]) == 0, "call %lu reached the peer as \"%s\", want \"%s\"", (unsigned long)i,
		      lines[i], want[i]);
	unlink(v4_record);

	/* a daemon of version 3 */
	p = start_peer(path, PEER_V3);
	o.no_lane = 1; /* this peer answers no LANE as a daemon would */
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL && cvd_get_info(c)->version == 3, "connect to a version-3 daemon: %s", c ? "" : err.message);
	if (c) {
		before = cvd_bytes_sent(c);
		opts.name = "w";
		opts.ndim = 0;
		rc = cvd_allreduce_opts(c, x, 4, CVD_FLOAT32, CVD_SUM, &opts, &err);
		CHECK(rc == CVD_E_UNSUPPORTED && strstr(err.message, "cvd_allreduce: named call \"w\": named calls need "
							      "protocol version 4; the daemon speaks 3"),
		      "a named call to a version-3 daemon: %d %s", rc, err.message);
		CHECK(cvd_bytes_sent(c) == before, "a refused named call was sent");
		CHECK(cvd_barrier(c, &err) == 0, "a call after it: %s", err.message);
	}
	cvd_close(c);
	stop_peer(p, path);
}

void run_scripted_tests(void)
{
	char path[64];
	cvd_options o;
	cvd_error err;
	cvd_client *c;
	cvd_request *a, *b, *s;
	float x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8};
	int64_t t0;
	pid_t p;
	snprintf(path, sizeof path, "/tmp/cvd-scripted-%ld.sock", (long)getpid());
	p = start_peer(path, 0);
	cvd_options_init(&o);
	o.job = "demo";
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL, "connect to scripted peer: %s", err.message);
	if (!c) {
		stop_peer(p, path);
		return;
	}
	/* It answers HELLO in version 1, which states only timeout_ms: twice
	 * that plus two margins. */
	CHECK(cvd_get_info(c)->version == 1 && cvd_default_timeout_ms(c) == 12000 && cvd_first_call_timeout_ms(c) == 0,
	      "version %u: default timeout %lld, want 2 * 1000 + 2 * 5000 margin",
	      (unsigned)cvd_get_info(c)->version, (long long)cvd_default_timeout_ms(c));

	/* out of order: a's reply comes after b's */
	a = named(c, x, 4, "hold", &err);
	CHECK(a && cvd_wait(a, 100, &err) == CVD_E_WAIT_TIMEOUT, "held call answered early");
	b = named(c, y, 4, "", &err);
	CHECK(a && b, "async calls: %s", err.message);
	if (a && b) {
		CHECK(cvd_wait(b, -1, &err) == 0, "wait b: %s", err.message);
		CHECK(cvd_wait(a, -1, &err) == 0, "wait a: %s", err.message);
		CHECK(x[3] == 4 && y[0] == 5, "results %g %g", x[3], y[0]);
	}

	/* a forked child may not use the parent's client */
	{
		pid_t child;
		int st = 0;
		fflush(stdout);
		fflush(stderr);
		child = fork();
		if (child == 0) {
			cvd_error e2;
			int rc = cvd_barrier(c, &e2);
			_exit(rc == CVD_E_INVALID && strstr(e2.message, "after fork") ? 0 : 1);
		}
		waitpid(child, &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child could use the client");
		CHECK(cvd_barrier(c, &err) == 0, "parent after fork: %s", err.message);
	}

	/* A STATUS_OK past max_frame (4096 here) and past the read buffer is
	 * taken whole, and the connection goes on; one past
	 * CVD_MAX_STATUS_FRAME breaks it. */
	{
		size_t n = 0;
		char *js = cvd_status(c, &n, &err);
		CHECK(js != NULL && n == STATUS_BIG && js[0] == '{' && js[n - 1] == '}' && js[n] == '\0',
		      "a %u-byte STATUS_OK: %s (%lu bytes)", STATUS_BIG, js ? "wrong" : err.message, (unsigned long)n);
		free(js);
		CHECK(cvd_barrier(c, &err) == 0, "a call after a large STATUS_OK: %s", err.message);
	}

	/* no reply: a bounded wait, the request stays valid */
	s = named(c, x, 4, "silent", &err);
	CHECK(s != NULL, "silent call: %s", err.message);
	if (s) {
		t0 = ms();
		CHECK(cvd_wait(s, 200, &err) == CVD_E_WAIT_TIMEOUT && err.code == CVD_E_WAIT_TIMEOUT,
		      "silent wait: %d %s", err.code, err.message);
		CHECK(ms() - t0 >= 200, "wait returned after %lld ms", (long long)(ms() - t0));
		CHECK(strstr(err.message, "still in flight") != NULL, "message: %s", err.message);
		CHECK(cvd_test(s) == 0, "silent request completed");
		CHECK(cvd_wait(s, 0, &err) == CVD_E_WAIT_TIMEOUT, "second wait: %d", err.code);
	}

	/* a fatal error fails everything in flight and the connection */
	b = named(c, y, 4, "fatal", &err);
	CHECK(b != NULL, "fatal call: %s", err.message);
	if (b) {
		CHECK(cvd_wait(b, -1, &err) == CVD_E_BAD_FRAME && err.fatal, "fatal: %d %s", err.code,
		      err.message);
		CHECK(strstr(err.message, "scripted fatal error") != NULL, "message: %s", err.message);
	}
	if (s)
		CHECK(cvd_wait(s, 1000, &err) == CVD_E_BAD_FRAME, "pending after fatal: %d %s", err.code,
		      err.message);
	CHECK(cvd_barrier(c, &err) == CVD_E_BAD_FRAME && strstr(err.message, "unusable") != NULL,
	      "after fatal: %d %s", err.code, err.message);
	cvd_close(c);
	stop_peer(p, path);

	/* close with a request in flight: it fails, the caller still frees it */
	p = start_peer(path, 0);
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL, "reconnect: %s", err.message);
	if (c) {
		s = named(c, x, 4, "silent", &err);
		cvd_close(c);
		CHECK(s && cvd_wait(s, 1000, &err) == CVD_E_CLOSED, "after close: %d %s", err.code,
		      err.message);
	}
	stop_peer(p, path);

	/* A STATUS_OK one byte past CVD_MAX_STATUS_FRAME is refused from its
	 * header (the peer's second answer to STATUS). */
	p = start_peer(path, 0);
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL, "reconnect: %s", err.message);
	if (c) {
		size_t n = 0;
		char *js = cvd_status(c, &n, &err);
		CHECK(js != NULL && n == STATUS_BIG, "first STATUS: %s", js ? "wrong size" : err.message);
		free(js);
		js = cvd_status(c, &n, &err);
		CHECK(js == NULL && err.code == CVD_E_PROTOCOL && strstr(err.message, "over the bound of 8388608"),
		      "a STATUS_OK past the bound: %d %s", err.code, err.message);
		free(js);
		cvd_close(c);
	}
	stop_peer(p, path);

	/* A lane the client must refuse: connect fails naming what was wrong. */
	expect_refused(path, &o, PEER_LANE_SHORT_FD, CVD_E_PROTOCOL,
		       "lane: LANE_OK (id 2) says 12288 bytes, its memfd has 4096", NULL,
		       "lane memfd shorter than LANE_OK says");
	expect_refused(path, &o, PEER_LANE_WRONG_SIZE, CVD_E_PROTOCOL, "lane: LANE_OK says 4096 bytes, want 12288",
		       NULL, "lane of the wrong size");
	expect_out_of_fds(path, &o);
	/* A ring with an id is a protocol fault: the next call fails naming it. */
	expect_lane_call_refused(path, &o, PEER_LANE_BAD_WAKE, "WAKE_CLIENT carries id 7, want 0",
				 "WAKE_CLIENT with an id");
	/* An answer on the lane of a type that may not travel there. */
	expect_lane_call_refused(path, &o, PEER_LANE_BAD_ANSWER,
				 "lane: STATUS_OK (id 0): only CALL_OK and ERROR may travel the lane",
				 "STATUS_OK on the lane");
	/* ... which the client does not ask for when told not to. */
	p = start_peer(path, PEER_LANE_WRONG_SIZE);
	o.no_lane = 1;
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL && !cvd_has_lane(c), "no_lane against a version-2 peer: %s", c ? "" : err.message);
	CHECK(c && cvd_barrier(c, &err) == 0, "barrier without a lane: %s", err.message);
	o.no_lane = 0;
	cvd_close(c);
	stop_peer(p, path);

	/* A daemon older than the client refuses version 3, and a version-1
	 * one 2 as well: the client asks again one version lower each time;
	 * with version 1 it has no lane, and its calls work. */
	p = start_peer(path, PEER_V1_ONLY);
	c = cvd_connect(path, &o, &err);
	CHECK(c != NULL && !cvd_has_lane(c), "connect to a version-1 daemon: %s", c ? "it has a lane" : err.message);
	CHECK(c && cvd_get_info(c)->version == 1, "version-1 daemon: connection of version %u",
	      c ? (unsigned)cvd_get_info(c)->version : 0u);
	CHECK(c && cvd_barrier(c, &err) == 0, "barrier on version 1: %s", err.message);
	cvd_close(c);
	stop_peer(p, path);
	test_default_wait(path);
	/* One that speaks none: its VERSION error for the last, version-1 HELLO. */
	expect_refused(path, &o, PEER_NO_VERSION, CVD_E_VERSION, "HELLO (protocol version 1): ",
		       "client speaks protocol version 1, daemon speaks 1 to 0", "a daemon of no version");
	/* One that answers the version-1 HELLO in version 2 would have the
	 * client open a lane it did not ask for: refused, as is an answer in 3
	 * to a HELLO in 2. */
	expect_refused(path, &o, PEER_V1_ANSWERS_2, CVD_E_PROTOCOL,
		       "daemon answers HELLO (protocol version 1) in version 2", NULL,
		       "a version-2 answer to a version-1 HELLO");
	expect_refused(path, &o, PEER_V2_ANSWERS_3, CVD_E_PROTOCOL,
		       "daemon answers HELLO (protocol version 2) in version 3", NULL,
		       "a version-3 answer to a version-2 HELLO");
	/* refused before HELLO is read: the daemon's error, not a broken pipe */
	expect_refused(path, &o, PEER_REFUSE, CVD_E_PERMISSION, "uid 1000 is not allowed", NULL, "refused");
	test_v3_calls_on_v2(path);
	test_v3_calls(path);
	test_named_calls(path);
}
