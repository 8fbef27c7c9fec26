/* The C client against a scripted peer (a forked process on a real Unix
 * socket) for what a real daemon cannot be made to do on demand: replies
 * out of order, no reply at all, a fatal connection-level error.
 *
 * The peer answers HELLO (timeout_ms 1000, inline_limit 64; in version 3
 * first_call_timeout_ms 60000), then CALLs by
 * name: "silent" never, "hold" only after the next call (out of order),
 * "fatal" with ERROR BAD_FRAME FATAL id 0 and a close, anything else at
 * once with the data unchanged. In the lane modes it speaks version 2 and
 * answers LANE with a LANE_OK the client must refuse. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
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
       PEER_V1_ONLY, PEER_NO_VERSION, PEER_V1_ANSWERS_2, PEER_V2_ONLY, PEER_V2_ANSWERS_3, PEER_V3 };

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

static void peer(int lfd, int refuse)
{
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
		if (read_n(fd, buf, 16) != 0 || cvd_frame_header(buf, 8192, &f, &plen, &err) != 0 ||
		    read_n(fd, buf + 16, plen) != 0 || cvd_frame_payload(&f, buf + 16, plen, &err) != 0)
			_exit(0);
		memset(&r, 0, sizeof r);
		r.id = f.id;
		if (f.type == CVD_T_HELLO) {
			send_hello_ok(fd, f.id, refuse == PEER_V3 ? 3 : refuse >= PEER_LANE_SHORT_FD ? 2 : 1);
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
}
