/* Completion callbacks (cvd_request_on_done) and cvd_progress on worlds of
 * real daemons: many calls in flight, each callback run exactly once with
 * its own outcome and its result in place; callbacks that make calls;
 * a mismatch; the client closing (also from a callback) and the daemon
 * stopping, which reach every callback in flight. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../collectived.h"
#include "check.h"
#include "world.h"

static void nap_ms(long ms)
{
	struct timespec ts;
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (ms % 1000) * 1000000L;
	nanosleep(&ts, NULL);
}

/* What one callback saw. */
typedef struct slot {
	int ran;       /* times the callback ran */
	int status;    /* its status */
	int err_code;  /* err->code */
	int want;      /* the status expected */
	int32_t *buf;  /* the call's buffer: checked inside the callback */
	size_t n;
	int32_t sum;   /* every element's expected value, if status 0 */
	int result_ok; /* the buffer held the result when the callback ran */
	int *count;    /* callbacks run so far, of the slots of a test */
	int order;     /* *count when it ran */
} slot;

static void on_done(cvd_request *req, int status, const cvd_error *err, void *arg)
{
	slot *s = (slot *)arg;
	size_t i;
	(void)req;
	s->ran++;
	s->status = status;
	s->err_code = err ? err->code : -1000;
	s->result_ok = 1;
	for (i = 0; status == 0 && s->buf && i < s->n; i++)
		if (s->buf[i] != s->sum)
			s->result_ok = 0;
	if (s->count)
		s->order = (*s->count)++;
}

/* Drive until *count reaches n or the time (ms) runs out. cvd_progress
 * returns 0, or end: the error that ended the connection, when that is
 * what the test expects. */
static void drive_to(cvd_client *c, const int *count, int n, int64_t ms, int end, const char *what)
{
	cvd_error err;
	int64_t waited = 0;
	while (*count < n && waited < ms) {
		int rc = cvd_progress(c, 1000, &err);
		if (rc == CVD_E_WAIT_TIMEOUT) {
			waited += 1000;
			continue;
		}
		CHECK(rc == 0 || rc == end, "%s: cvd_progress: %d %s", what, rc, err.message);
		if (rc != 0)
			break;
	}
	CHECK(*count == n, "%s: %d of %d callbacks ran", what, *count, n);
}

static void drive(cvd_client *c, const int *count, int n, int64_t ms, const char *what)
{
	drive_to(c, count, n, ms, 0, what);
}

enum { KINDS = 4, PER_KIND = 8, N = KINDS * PER_KIND, SMALL = 4, COPIED = 4096 /* 16 KiB */ };

/* Calls of every way a buffer travels (inline, copied through a scratch
 * segment, in a segment of the caller's) and refused ones (a broadcast
 * from a rank outside the world: BAD_REQUEST, which takes no place in
 * matching), all in flight, each with a callback, no request waited on:
 * cvd_progress runs each callback once, with its own status and its
 * result in the buffer. */
static void futures_many(cvd_client *c, const world *w)
{
	slot slots[N];
	int32_t *bufs[N], *seg;
	int k, count = 0, rank = cvd_rank(c), size = cvd_size(c);
	cvd_error err;
	(void)w;
	memset(slots, 0, sizeof slots);
	seg = (int32_t *)cvd_alloc(c, PER_KIND * SMALL * 64 * sizeof(int32_t), &err);
	CHECK(seg != NULL, "cvd_alloc: %s", err.message);
	if (!seg)
		return;
	for (k = 0; k < N; k++) {
		int kind = k % KINDS;
		size_t n = kind == 1 ? COPIED : SMALL, i;
		cvd_request *r;
		slots[k].count = &count;
		slots[k].n = n;
		bufs[k] = kind == 2 ? seg + (size_t)(k / KINDS) * SMALL * 64 : (int32_t *)malloc(n * sizeof(int32_t));
		for (i = 0; i < n; i++)
			bufs[k][i] = rank + k;
		slots[k].buf = bufs[k];
		slots[k].sum = size * k + size * (size - 1) / 2;
		if (kind == 3) {
			cvd_call call;
			memset(&call, 0, sizeof call);
			call.op = CVD_BROADCAST;
			call.dtype = CVD_INT32;
			call.root = (uint32_t)(size + 3);
			call.buf = bufs[k];
			call.count = n;
			r = cvd_call_async(c, &call, &err);
			slots[k].want = CVD_E_BAD_REQUEST;
		} else {
			r = cvd_allreduce_async(c, bufs[k], n, CVD_INT32, CVD_SUM, &err);
		}
		CHECK(r != NULL, "call %d: %s", k, err.message);
		if (!r) {
			slots[k].ran = -1;
			count++;
			continue;
		}
		CHECK(cvd_request_on_done(r, on_done, &slots[k]) == 0, "call %d: cvd_request_on_done", k);
		if (k == 0) {
			CHECK(cvd_request_on_done(r, on_done, &slots[k]) == CVD_E_INVALID,
			      "a second callback for one request was taken");
			CHECK(cvd_wait(r, 0, &err) == CVD_E_INVALID, "cvd_wait on a request with a callback: %d",
			      err.code);
		}
	}
	drive(c, &count, N, 60000, "futures_many");
	CHECK(cvd_progress(c, 0, &err) == 0, "cvd_progress with nothing in flight: %s", err.message);
	for (k = 0; k < N; k++) {
		slot *s = &slots[k];
		if (s->ran < 0)
			continue;
		CHECK(s->ran == 1, "callback %d ran %d times", k, s->ran);
		CHECK(s->status == s->want && s->err_code == s->want, "callback %d: status %d (%s), err %d, want %d",
		      k, s->status, cvd_strerror(s->status), s->err_code, s->want);
		CHECK(s->result_ok, "callback %d ran before its result was in the buffer", k);
		if (k % KINDS != 2)
			free(bufs[k]);
	}
	CHECK(cvd_free(c, seg, &err) == 0, "cvd_free: %s", err.message);
}

/* A callback that runs inside cvd_wait of another request, one that runs
 * at once for a request already complete, and cvd_progress's own rules. */
static void futures_where(cvd_client *c, const world *w)
{
	enum { BIG = 80000 }; /* 320 KB: too large for the lane, so a's reply comes before b's */
	int32_t *a = (int32_t *)malloc(BIG * sizeof(int32_t)), b[2] = {3, 4}, d[2] = {5, 6};
	slot sa, sd;
	cvd_request *ra, *rb, *rd;
	cvd_error err;
	int size = cvd_size(c), rc;
	size_t i;
	(void)w;
	memset(&sa, 0, sizeof sa);
	memset(&sd, 0, sizeof sd);
	for (i = 0; i < BIG; i++)
		a[i] = 1;
	ra = cvd_allreduce_async(c, a, BIG, CVD_INT32, CVD_MAX, &err);
	CHECK(ra != NULL, "a: %s", err.message);
	rb = cvd_allreduce_async(c, b, 2, CVD_INT32, CVD_MAX, &err);
	CHECK(rb != NULL, "b: %s", err.message);
	if (!ra || !rb) {
		free(a);
		return;
	}
	sa.buf = a;
	sa.n = BIG;
	sa.sum = 1;
	CHECK(cvd_request_on_done(ra, on_done, &sa) == 0, "on_done a");
	CHECK(sa.ran == 0, "a's callback ran before anything read its reply");
	/* a was answered first: waiting for b reads a's reply and runs its
	 * callback before cvd_wait returns. */
	CHECK(cvd_wait(rb, -1, &err) == 0, "wait b: %s", err.message);
	CHECK(sa.ran == 1 && sa.status == 0 && sa.result_ok, "a's callback after b's wait: ran %d status %d",
	      sa.ran, sa.status);
	free(a);
	rd = cvd_allreduce_async(c, d, 2, CVD_INT32, CVD_SUM, &err);
	CHECK(rd != NULL, "d: %s", err.message);
	if (!rd)
		return;
	while (!cvd_test(rd))
		;
	CHECK(cvd_request_on_done(rd, on_done, &sd) == 0 && sd.ran == 1 && sd.status == 0,
	      "a callback for a request complete already did not run at once: ran %d", sd.ran);
	CHECK(d[0] == 5 * size && d[1] == 6 * size, "d: %d %d", d[0], d[1]);
	rc = cvd_progress(c, 0, &err);
	CHECK(rc == 0, "cvd_progress, nothing in flight: %d %s", rc, err.message);
}

/* Callbacks that make calls: each makes a synchronous allreduce, then
 * starts the next call of the chain with a callback of its own. */
typedef struct chain {
	cvd_client *c;
	int steps, done, bad;
	int32_t x[1], y[4];
	slot more[4];
	int more_count;
} chain;

static void chain_step(cvd_request *req, int status, const cvd_error *err, void *arg)
{
	chain *ch = (chain *)arg;
	cvd_error e;
	int32_t y = 1;
	cvd_request *r;
	int size = cvd_size(ch->c), k;
	(void)req;
	(void)err;
	if (status != 0 || ch->x[0] != size * ch->steps) {
		ch->bad++;
		ch->done = 1;
		return;
	}
	ch->steps++;
	if (cvd_allreduce(ch->c, &y, 1, CVD_INT32, CVD_SUM, &e) != 0 || y != size) {
		ch->bad++;
		ch->done = 1;
		return;
	}
	if (ch->steps == 10) {
		/* Four more calls with callbacks, started from this callback:
		 * theirs run after it returns. */
		for (k = 0; k < 4; k++) {
			memset(&ch->more[k], 0, sizeof ch->more[k]);
			ch->more[k].count = &ch->more_count;
			ch->more[k].buf = &ch->y[k];
			ch->more[k].n = 1;
			ch->more[k].sum = 7 + k;
			ch->y[k] = 7 + k;
			r = cvd_allreduce_async(ch->c, &ch->y[k], 1, CVD_INT32, CVD_MIN, &e);
			if (!r || cvd_request_on_done(r, on_done, &ch->more[k]) != 0)
				ch->bad++;
		}
		ch->done = 1;
		return;
	}
	ch->x[0] = ch->steps;
	r = cvd_allreduce_async(ch->c, ch->x, 1, CVD_INT32, CVD_SUM, &e);
	if (!r || cvd_request_on_done(r, chain_step, ch) != 0) {
		ch->bad++;
		ch->done = 1;
	}
}

static void futures_chain(cvd_client *c, const world *w)
{
	chain ch;
	cvd_request *r;
	cvd_error err;
	int done = 0, k;
	(void)w;
	memset(&ch, 0, sizeof ch);
	ch.c = c;
	r = cvd_allreduce_async(c, ch.x, 1, CVD_INT32, CVD_SUM, &err);
	CHECK(r != NULL && cvd_request_on_done(r, chain_step, &ch) == 0, "chain: %s", err.message);
	while (!ch.done) {
		int rc = cvd_progress(c, 30000, &err);
		CHECK(rc == 0, "chain: cvd_progress %d %s", rc, err.message);
		if (rc != 0)
			return;
	}
	CHECK(ch.bad == 0 && ch.steps == 10, "chain: %d bad, %d steps", ch.bad, ch.steps);
	drive(c, &ch.more_count, 4, 30000, "chain's last calls");
	for (k = 0; k < 4; k++)
		done += ch.more[k].ran == 1 && ch.more[k].status == 0 && ch.more[k].result_ok;
	CHECK(done == 4, "chain's last calls: %d of 4 completed once", done);
}

/* A mismatch fails the one collective whose calls disagree: its callback
 * gets MISMATCH on every rank, the others their results. The mismatch is
 * the first call of fresh trainers (see mismatch_then_recover). */
static void futures_mismatch(cvd_client *c, const world *w)
{
	enum { K = 6 };
	slot slots[K];
	int32_t bufs[K][4];
	int k, count = 0, rank = cvd_rank(c), size = cvd_size(c);
	cvd_error err;
	(void)w;
	if (size < 2)
		return;
	memset(slots, 0, sizeof slots);
	for (k = 0; k < K; k++) {
		size_t n = k == 0 && rank == 0 ? 3 : 4, i;
		cvd_request *r;
		for (i = 0; i < 4; i++)
			bufs[k][i] = rank + k;
		slots[k].count = &count;
		slots[k].buf = bufs[k];
		slots[k].n = 4;
		slots[k].sum = size * k + size * (size - 1) / 2;
		slots[k].want = k == 0 ? CVD_E_MISMATCH : 0;
		r = cvd_allreduce_async(c, bufs[k], n, CVD_INT32, CVD_SUM, &err);
		CHECK(r != NULL && cvd_request_on_done(r, on_done, &slots[k]) == 0, "call %d: %s", k, err.message);
		if (!r)
			count++;
	}
	drive(c, &count, K, 60000, "futures_mismatch");
	for (k = 0; k < K; k++) {
		CHECK(slots[k].ran == 1 && slots[k].status == slots[k].want,
		      "mismatch test, call %d: ran %d, status %d (%s), want %d", k, slots[k].ran, slots[k].status,
		      cvd_strerror(slots[k].status), slots[k].want);
		CHECK(slots[k].want != 0 || slots[k].result_ok, "mismatch test, call %d: result wrong", k);
	}
}

/* Rank 0 starts calls no other rank makes, then stops its node's daemon:
 * every callback gets the daemon's SHUTDOWN. The other ranks wait a while
 * and leave. Last on a world: it stops a daemon. */
static void futures_daemon_stops(cvd_client *c, const world *w)
{
	enum { K = 8 };
	slot slots[K];
	float bufs[K][2];
	int k, count = 0, rc;
	cvd_error err;
	if (cvd_rank(c) != 0) {
		nap_ms(1500);
		return;
	}
	memset(slots, 0, sizeof slots);
	for (k = 0; k < K; k++) {
		cvd_request *r;
		bufs[k][0] = bufs[k][1] = (float)k;
		r = cvd_allreduce_async(c, bufs[k], 2, CVD_FLOAT32, CVD_SUM, &err);
		slots[k].count = &count;
		CHECK(r != NULL && cvd_request_on_done(r, on_done, &slots[k]) == 0, "call %d: %s", k, err.message);
		if (!r)
			count++;
	}
	rc = cvd_progress(c, 300, &err);
	CHECK(rc == CVD_E_WAIT_TIMEOUT && count == 0, "calls nobody else made: cvd_progress %d (%s), %d callbacks ran",
	      rc, err.message, count);
	kill(w->pid[0], SIGTERM);
	drive_to(c, &count, K, 20000, CVD_E_SHUTDOWN, "futures_daemon_stops");
	for (k = 0; k < K; k++)
		CHECK(slots[k].ran == 1 && slots[k].status == CVD_E_SHUTDOWN && slots[k].err_code == CVD_E_SHUTDOWN,
		      "daemon stopped, call %d: ran %d, status %d (%s)", k, slots[k].ran, slots[k].status,
		      cvd_strerror(slots[k].status));
	rc = cvd_progress(c, 0, &err);
	CHECK(rc == CVD_E_SHUTDOWN, "cvd_progress after the daemon stopped: %d %s", rc, err.message);
}

/* A callback that closes its client: the client closes once the callbacks
 * run with it have run; the calls still in flight then fail with CLOSED,
 * their callbacks run inside that close. */
typedef struct closer {
	cvd_client *c;
	slot *s;
	int at;
} closer;

static void close_at(cvd_request *req, int status, const cvd_error *err, void *arg)
{
	closer *cl = (closer *)arg;
	on_done(req, status, err, cl->s);
	if (cl->s->order == cl->at)
		cvd_close(cl->c);
}

/* The parent's own client on a world of one: cvd_close with calls in
 * flight and no request waited on runs every callback with CLOSED; a
 * callback may close the client. */
static void futures_close(const world *w)
{
	enum { K = 12 };
	int round;
	for (round = 0; round < 2; round++) {
		slot slots[K];
		closer cls[K];
		int32_t bufs[K];
		cvd_options o;
		cvd_error err;
		cvd_client *c;
		int k, count = 0, closed = 0;
		cvd_options_init(&o);
		o.job = JOB;
		o.local_rank = 0;
		o.rank_retry_ms = 5000;
		c = cvd_connect(w->sock[0], &o, &err);
		CHECK(c != NULL, "connect: %s", err.message);
		if (!c)
			return;
		memset(slots, 0, sizeof slots);
		for (k = 0; k < K; k++) {
			cvd_request *r;
			bufs[k] = k;
			slots[k].count = &count;
			slots[k].order = -1;
			cls[k].c = c;
			cls[k].s = &slots[k];
			cls[k].at = 3;
			r = cvd_allreduce_async(c, &bufs[k], 1, CVD_INT32, CVD_SUM, &err);
			CHECK(r != NULL, "call %d: %s", k, err.message);
			if (!r || cvd_request_on_done(r, round == 0 ? on_done : close_at,
						      round == 0 ? (void *)&slots[k] : (void *)&cls[k]) != 0) {
				slots[k].ran = 1;
				count++;
			}
		}
		if (round == 0) {
			/* Nothing read: every call is in flight for the client. */
			cvd_close(c);
		} else {
			/* The callback of the fourth to complete closes it; the
			 * client is gone once cvd_progress returns. */
			while (count < K) {
				int rc = cvd_progress(c, 10000, &err);
				if (count == K)
					break; /* c is freed: closed by a callback */
				CHECK(rc == 0, "close from a callback: cvd_progress %d %s", rc, err.message);
				if (rc != 0)
					return;
			}
		}
		/* Round 0: every callback gets CLOSED. Round 1: the closing
		 * callback's and those run before and with it succeed (those
		 * whose replies cvd_progress had read), the rest get CLOSED. */
		for (k = 0; k < K; k++) {
			CHECK(slots[k].ran == 1, "round %d, callback %d ran %d times", round, k, slots[k].ran);
			if (slots[k].status == CVD_E_CLOSED)
				closed++;
			else
				CHECK(round == 1 && slots[k].status == 0 && bufs[k] == k,
				      "round %d, callback %d: status %d (%s), result %d", round, k, slots[k].status,
				      cvd_strerror(slots[k].status), bufs[k]);
		}
		CHECK(round == 0 ? closed == K : closed <= K - 4, "round %d: %d callbacks got CLOSED", round, closed);
	}
}

void run_future_daemon_tests(const world *w)
{
	run_trainers(w, futures_many, "futures_many", 120);
	run_trainers(w, futures_where, "futures_where", 120);
	run_trainers(w, futures_chain, "futures_chain", 120);
	if (w->size > 1)
		run_trainers(w, futures_mismatch, "futures_mismatch", 120);
	if (w->size == 1)
		futures_close(w);
}

void run_future_stop_test(const world *w)
{
	if (w->size > 1)
		run_trainers(w, futures_daemon_stops, "futures_daemon_stops", 120);
}
