/*
 * collectived.h - C client of collectived, client protocol version 4
 * (docs/PROTOCOL.md; against an older daemon it speaks 3, 2, or 1). C99,
 * libc only; usable from C++.
 *
 * A trainer connects to its node's daemon, then runs collectives whose
 * results land in its own buffer:
 *
 *     cvd_error err;
 *     cvd_client *c = cvd_connect(NULL, NULL, &err);   // $COLLECTIVED_SOCKET
 *     if (!c) { fprintf(stderr, "%s\n", err.message); return 1; }
 *     float *g = cvd_alloc(c, n * sizeof(float), &err); // shared memory: zero copy
 *     ...fill g...
 *     if (cvd_allreduce(c, g, n, CVD_FLOAT32, CVD_SUM, &err) != 0) ...
 *     cvd_allgather(c, x, all, n, CVD_BFLOAT16, NULL, &err); // all: n * cvd_size(c)
 *     cvd_close(c);
 *
 * Collectives (docs/PROTOCOL.md, CALL: "What each op does"): allreduce,
 * broadcast and barrier in every protocol version; allgather(v),
 * reduce_scatter(v), reduce, the dtypes float16, bfloat16, int8 and
 * uint8, the reduce op avg, shapes and scale factors (cvd_call_opts) need
 * a daemon of protocol version 3: against an older one these calls fail
 * at once with CVD_E_UNSUPPORTED ("needs protocol version 3"), sending
 * nothing. A count is always the number of elements in the caller's
 * input buffer.
 *
 * Named calls (protocol version 4; cvd_call_opts.named): a call with a
 * name and the named option is matched by its name, not by its place in
 * the trainer's sequence of calls: the k-th named call of a name on every
 * trainer meet, in whatever order each trainer makes its named calls
 * (docs/MATCHING.md, "Named calls"). Every op may be named. A name may be
 * in flight only once per client: a second named call of a name whose
 * earlier call has not been answered fails at once with CVD_E_INVALID,
 * naming it, sending nothing. Named calls never take the lane.
 *
 * How a buffer travels:
 *   - it lies inside a segment from cvd_alloc()/cvd_register(): only
 *     (segment, offset) is sent; the daemon reduces in place (no copy);
 *   - else, at most inline_limit bytes: inside the CALL frame and its reply;
 *   - else: copied into a scratch segment (kept for reuse until cvd_close)
 *     and back (two memcpy of the buffer).
 *
 * Errors: functions returning int return 0 on success, else an error code
 * (also stored in err->code, with a message). Codes 1..22 are the daemon's
 * (CVD_E_MISMATCH, CVD_E_TIMEOUT, ...), negative ones are found by the
 * client (CVD_E_WAIT_TIMEOUT, CVD_E_CLOSED, ...). `err` may be NULL.
 *
 * Thread safety: a cvd_client and its requests are not thread-safe: use
 * each client from one thread at a time (collectives are matched by call
 * order anyway). Distinct clients are independent. After fork() the child
 * must connect anew: calls on the parent's client fail with CVD_E_INVALID.
 * Completion callbacks (cvd_request_on_done) run in the thread that calls
 * into the client, inside the call that reads the reply; the client has no
 * thread of its own.
 *
 * Timeouts: no call waits forever. The default bound of a wait
 * (cvd_default_timeout_ms) is the larger of the daemon's two timeouts in
 * HELLO_OK, timeout_ms and first_call_timeout_ms (the first collective of
 * a ring generation), plus twice CVD_TIMEOUT_MARGIN_MS: the daemon's own
 * TIMEOUT, which names who has not called, always comes first
 * (docs/PROTOCOL.md, Timeouts). A daemon of protocol version 1 or 2 does
 * not state the first-call timeout: then twice timeout_ms plus two
 * margins. cvd_options.timeout_ms, when given, wins.
 */
#ifndef COLLECTIVED_H
#define COLLECTIVED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CVD_PROTOCOL_VERSION 4 /* the newest spoken; a daemon that refuses it is asked in 3 (no named
				* calls), 2 (nor version 3's ops, dtypes, shapes, scales and
				* first-call timeout), then 1 (nor the lane) */
/* The slack on the daemon's timeout bound (docs/PROTOCOL.md, Timeouts):
 * the same 5 s as every client's. */
#define CVD_TIMEOUT_MARGIN_MS 5000
#define CVD_DEFAULT_SOCKET "/run/collectived/collectived.sock"
#define CVD_DEFAULT_JOB "default"
#define CVD_HEADER_SIZE 16
#define CVD_PRE_HELLO_MAX_FRAME 4096u
/* A STATUS_OK payload may be this long whatever max_frame is (the status of
 * the largest worlds is megabytes); no other frame may pass max_frame. */
#define CVD_MAX_STATUS_FRAME (8u << 20)

/* Element types (wire codes). */
typedef enum cvd_dtype {
	CVD_DTYPE_NONE = 0,
	CVD_FLOAT32 = 1,
	CVD_FLOAT64 = 2,
	CVD_INT32 = 3,
	CVD_INT64 = 4,
	CVD_BYTES = 5,    /* untyped: broadcast and allgather only */
	CVD_FLOAT16 = 6,  /* IEEE 754 binary16 (version 3; see cvd_f32_to_f16) */
	CVD_BFLOAT16 = 7, /* the upper half of a binary32 (version 3; see cvd_f32_to_bf16) */
	CVD_INT8 = 8,     /* version 3 */
	CVD_UINT8 = 9     /* version 3 */
} cvd_dtype;

/* Reduce operations (wire codes). */
typedef enum cvd_op {
	CVD_OP_NONE = 0,
	CVD_SUM = 1,
	CVD_PROD = 2,
	CVD_MAX = 3,
	CVD_MIN = 4,
	CVD_AVG = 5 /* sum, then one division by the world size; float dtypes only (version 3) */
} cvd_op;

/* Collectives (wire codes). */
typedef enum cvd_collective {
	CVD_ALLREDUCE = 1,
	CVD_BROADCAST = 2,
	CVD_ALLGATHER = 3,      /* version 3 */
	CVD_BARRIER = 4,
	CVD_REDUCE_SCATTER = 5, /* version 3 */
	CVD_REDUCE = 6          /* version 3 */
} cvd_collective;

/* Error codes: 1..23 come from the daemon, negative ones from the client. */
enum {
	CVD_OK = 0,
	CVD_E_BAD_FRAME = 1,
	CVD_E_VERSION = 2,
	CVD_E_JOB = 3,
	CVD_E_RANK_TAKEN = 4,
	CVD_E_RANK_RANGE = 5,
	CVD_E_FULL = 6,
	CVD_E_PERMISSION = 7,
	CVD_E_QUOTA = 8,
	CVD_E_BAD_SEGMENT = 9,
	CVD_E_BUSY = 10,
	CVD_E_BAD_FD = 11,
	CVD_E_BAD_REQUEST = 12,
	CVD_E_TOO_LARGE = 13,
	CVD_E_TOO_MANY = 14,
	CVD_E_MISMATCH = 15,
	CVD_E_TIMEOUT = 16,
	CVD_E_PEER_LOST = 17,
	CVD_E_TRAINER_LOST = 18,
	CVD_E_ABORTED = 19,
	CVD_E_SHUTDOWN = 20,
	CVD_E_UNSUPPORTED = 21,
	CVD_E_INTERNAL = 22,
	CVD_E_CORRUPT = 23, /* a frame between two nodes arrived corrupted */

	CVD_E_CONNECT = -1,      /* cannot connect to the socket */
	CVD_E_CLOSED = -2,       /* connection lost or closed */
	CVD_E_WAIT_TIMEOUT = -3, /* a client-side wait ran out; the request stays in flight */
	CVD_E_PROTOCOL = -4,     /* a malformed frame (see cvd_error.check) */
	CVD_E_INVALID = -5,      /* an invalid argument */
	CVD_E_NOMEM = -6,        /* out of memory */
	CVD_E_SYSTEM = -7        /* a system call failed (message names it and errno) */
};

#define CVD_MESSAGE_MAX 4400

typedef struct cvd_error {
	int code;      /* CVD_OK, a daemon code (1..22, or another it sent) or a CVD_E_ client code */
	int fatal;     /* the daemon closed the connection after this error */
	char check[32];/* for CVD_E_PROTOCOL from the codec: the failed check (see clients/testdata/README.md) */
	char message[CVD_MESSAGE_MAX]; /* for people; daemon messages verbatim */
} cvd_error;

/* Name of an error code, e.g. "MISMATCH", "WAIT_TIMEOUT"; never NULL. */
const char *cvd_strerror(int code);

typedef struct cvd_options {
	const char *job;            /* NULL: $COLLECTIVED_JOB, then "default" */
	const char *label;          /* NULL: "" (at most 255 bytes) */
	int32_t local_rank;         /* -1: the lowest free local rank */
	int observer;               /* nonzero: no rank, STATUS only */
	int64_t timeout_ms;         /* default wait; <= 0: from HELLO_OK (see Timeouts above) */
	int64_t connect_timeout_ms; /* connect + HELLO; <= 0: 10000 */
	int64_t rank_retry_ms;      /* keep retrying while the daemon answers RANK_TAKEN or
				     * FULL (a restarted trainer whose predecessor's exit the
				     * daemon has not noticed yet); <= 0: fail at once */
	int64_t spin_us;            /* how long waiting for the reply to a call of at most
				     * 256 KiB polls the socket (yielding the CPU between
				     * looks) before it sleeps, which saves a small call a
				     * thread wake-up; 0: 200; < 0: never poll; at most
				     * 10000 */
	int64_t inline_max;         /* largest call on plain memory (not from cvd_alloc)
				     * whose data travels inside the call and its answer;
				     * a larger one is copied through a scratch segment of
				     * shared memory, fewer copies than the socket's; never
				     * above the daemon's inline_limit; 0: 2048; < 0: none.
				     * Calls the daemon would take inline share eight scratch
				     * segments; one started while all are busy goes
				     * inline */
	int no_lane;                /* nonzero: small calls keep to the socket instead of
				     * the connection's lane of shared memory (protocol
				     * version 2 and later, docs/PROTOCOL.md, LANE) */
} cvd_options;

/* Fill *opt with the defaults (local_rank -1, everything else 0/NULL). */
void cvd_options_init(cvd_options *opt);

/* What HELLO_OK told the client (but first_call_timeout_ms, of version 3:
 * cvd_first_call_timeout_ms; this struct keeps its layout). */
typedef struct cvd_info {
	uint32_t version;
	uint32_t world_rank; /* 0xffffffff for an observer */
	uint32_t world_size;
	uint32_t node_rank;
	uint32_t node_count;
	uint32_t local_rank; /* 0xffffffff for an observer */
	uint32_t local_size;
	uint32_t inline_limit;
	uint32_t max_frame;
	uint32_t max_in_flight;
	uint32_t generation;
	uint64_t shm_quota;
	uint64_t timeout_ms;
} cvd_info;

typedef struct cvd_client cvd_client;
typedef struct cvd_request cvd_request;

/* Connect and say HELLO. socket_path NULL: $COLLECTIVED_SOCKET, then
 * CVD_DEFAULT_SOCKET. opt NULL: defaults. Returns NULL on failure (err set). */
cvd_client *cvd_connect(const char *socket_path, const cvd_options *opt, cvd_error *err);

/* Close the connection, unmap every segment (pointers from cvd_alloc and
 * cvd_register become invalid) and free the client. Requests still in
 * flight are failed with CVD_E_CLOSED; the caller still owns them and
 * releases them with cvd_wait() or cvd_request_free(), but for those with a
 * callback (cvd_request_on_done), whose callbacks run here first, while the
 * segments are still mapped. Called from a callback, it closes the client
 * once the callbacks have run, before the function that ran them returns.
 * NULL is a no-op. */
void cvd_close(cvd_client *c);

const cvd_info *cvd_get_info(const cvd_client *c);
int cvd_rank(const cvd_client *c);       /* world rank, -1 for an observer */
int cvd_size(const cvd_client *c);       /* world size */
int cvd_local_rank(const cvd_client *c); /* -1 for an observer */
int cvd_local_size(const cvd_client *c);
int cvd_node_rank(const cvd_client *c);
int cvd_node_count(const cvd_client *c);
uint32_t cvd_generation(const cvd_client *c); /* of the last completed collective */
int64_t cvd_default_timeout_ms(const cvd_client *c); /* the wait of cvd_wait(..., -1, ...) */
/* HELLO_OK's first_call_timeout_ms: the daemon's timeout for the first
 * collective of a ring generation; 0 from a daemon of protocol version 1
 * or 2, which does not state it. */
uint64_t cvd_first_call_timeout_ms(const cvd_client *c);
uint64_t cvd_bytes_sent(const cvd_client *c); /* bytes of frames sent so far (socket and lane) */
int cvd_has_lane(const cvd_client *c); /* nonzero: small calls go through the lane */

/* A daemon-made shared segment of at least size bytes (ALLOC), mapped
 * read-write. Collectives on buffers inside it send no data. NULL on error. */
void *cvd_alloc(cvd_client *c, size_t size, cvd_error *err);
/* The same with a memfd made by the client and passed with REGISTER. */
void *cvd_register(cvd_client *c, size_t size, cvd_error *err);
/* Unmap and FREE a segment from cvd_alloc/cvd_register (ptr: its start). */
int cvd_free(cvd_client *c, void *ptr, cvd_error *err);

/* One collective call. */
typedef struct cvd_call {
	cvd_collective op;
	cvd_dtype dtype;  /* CVD_DTYPE_NONE for a barrier */
	cvd_op reduce;    /* allreduce, reduce, reduce_scatter; else CVD_OP_NONE */
	uint32_t root;    /* broadcast and reduce: the root's world rank */
	void *buf;        /* the input: in place, except for allgather and reduce_scatter,
			   * whose result goes to cvd_call_async_opts's out; untouched
			   * until the request completes */
	size_t count;     /* elements in buf */
	const char *name; /* NULL or at most 255 bytes; part of matching */
} cvd_call;

/* What protocol versions 3 and 4 add to a call, all optional (the pointer
 * to it may be NULL; a zeroed struct, or cvd_call_opts_init, means none of
 * it). A call with a shape or scale factors needs a daemon of version 3, a
 * named call one of version 4. */
#define CVD_MAX_NDIM 8
typedef struct cvd_call_opts {
	const char *name;      /* the call's name, for the functions without a cvd_call
				* (cvd_allgather, ...); a cvd_call's own name wins */
	const uint64_t *shape; /* ndim dimensions, outermost first; their product must
				* be the call's count; part of matching (for allgatherv
				* the first dimension is the caller's own) */
	size_t ndim;           /* 0 (no shape) .. CVD_MAX_NDIM */
	double prescale;       /* allreduce, reduce, reduce_scatter of a float dtype with
				* sum or avg: every input element is multiplied by it
				* before the reduction, every result element by postscale
				* after; finite and nonzero; 0: 1. Sent (and compared bit
				* for bit when calls are matched) only when one of the two
				* is not 1 */
	double postscale;
	int named;             /* nonzero (version 4): the call is matched by its name, in
				* any order (see Named calls above); it needs a name
				* (CVD_E_INVALID otherwise) and never takes the lane.
				* The struct grew by it: a program built against an
				* older header is rebuilt before it loads this library */
} cvd_call_opts;

/* Fill *o with the defaults: no name, no shape, no scaling, not named. */
void cvd_call_opts_init(cvd_call_opts *o);

/* Start a call; NULL on error. Complete it with cvd_wait(). */
cvd_request *cvd_call_async(cvd_client *c, const cvd_call *call, cvd_error *err);
/* Any call with what version 3 adds: out is the result buffer of an
 * allgather or reduce_scatter (NULL for other ops); counts, NULL or
 * cvd_size(c) per-rank element counts, makes an allgather or
 * reduce_scatter its "v" form (see cvd_allgatherv, cvd_reduce_scatterv);
 * opts may be NULL. Only what is needed to build the frame is checked
 * here; the daemon checks the rest (BAD_REQUEST naming the field). */
cvd_request *cvd_call_async_opts(cvd_client *c, const cvd_call *call, void *out,
				 const uint64_t *counts, const cvd_call_opts *opts, cvd_error *err);
cvd_request *cvd_allreduce_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype,
				 cvd_op op, cvd_error *err);
/* Wait at most timeout_ms (< 0: the client's default). Returns 0 or an
 * error code. Except on CVD_E_WAIT_TIMEOUT (the request is still in flight
 * and may be waited on again), the request is freed. CVD_E_INVALID for a
 * request with a callback. */
int cvd_wait(cvd_request *req, int64_t timeout_ms, cvd_error *err);
/* Nonzero once the request completed (reads what has arrived, never blocks). */
int cvd_test(cvd_request *req);
/* Generation and sequence number of a completed collective. */
uint32_t cvd_request_generation(const cvd_request *req);
uint64_t cvd_request_seq(const cvd_request *req);
/* Forget a request without waiting (its buffer must stay valid until the
 * client closes, as the reply may still arrive). A no-op for a request
 * with a callback, which the client frees. */
void cvd_request_free(cvd_request *req);

/* Completion callbacks. No thread is made, here or anywhere in this client:
 * a callback runs inside a call of the same thread that reads the reply.
 *
 * cvd_request_on_done(req, cb, arg) has cb(req, status, err, arg) called
 * exactly once when the request completes: status is what cvd_wait would
 * return (0, or the error code, also in err->code, with err->message), and
 * the result is then in the caller's buffer. req stays valid while cb
 * runs (cvd_request_generation and cvd_request_seq may be read) and is
 * freed when it returns: from cvd_request_on_done on, the request is the
 * client's, and must not be passed to cvd_wait, cvd_test or
 * cvd_request_free. If req has completed already, cb runs before
 * cvd_request_on_done returns.
 *
 * Otherwise cb runs inside whichever call of this client reads the reply
 * (or fails it): cvd_progress, cvd_wait or cvd_test of another request, a
 * synchronous call (cvd_allreduce, ..., cvd_alloc, cvd_free, cvd_status),
 * an asynchronous start that waited (for a scratch segment or a free slot
 * under max_in_flight), or cvd_close (status CVD_E_CLOSED). It runs at the
 * end of that call, when the client is between calls: cb may start calls,
 * wait for them, and attach callbacks to them. Callbacks never nest: those
 * of the calls a callback completes run after it returns, in the order
 * the requests completed. A broken connection completes every request in
 * flight with its error (status < 0, or the daemon's fatal code).
 *
 * Returns 0, or CVD_E_INVALID (NULL req or cb, or req already has a
 * callback or was freed with cvd_request_free). */
typedef void (*cvd_done_fn)(cvd_request *req, int status, const cvd_error *err, void *arg);
int cvd_request_on_done(cvd_request *req, cvd_done_fn cb, void *arg);
/* Drive completions without waiting on a particular request: read the
 * replies that have arrived, and if none completed a request, wait at most
 * timeout_ms (0: not at all; < 0: the client's default) for one that does;
 * then run the callbacks of the requests completed. Polls first, as
 * cvd_wait does, when a call in flight is small enough.
 * Returns 0 once at least one request completed, or when none is in
 * flight; CVD_E_WAIT_TIMEOUT when the time ran out with none completing
 * (the requests stay in flight); else the error that ended the connection
 * (every request in flight has then completed with it). Called from a
 * callback, it completes requests, but their callbacks run after it. */
int cvd_progress(cvd_client *c, int64_t timeout_ms, cvd_error *err);

int cvd_allreduce(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
		  cvd_error *err);
int cvd_broadcast(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, uint32_t root,
		  cvd_error *err);
int cvd_barrier(cvd_client *c, cvd_error *err);
/* Any call, synchronously. */
int cvd_call_sync(cvd_client *c, const cvd_call *call, cvd_error *err);
int cvd_call_sync_opts(cvd_client *c, const cvd_call *call, void *out, const uint64_t *counts,
		       const cvd_call_opts *opts, cvd_error *err);

/* The collectives of protocol version 3 (CVD_E_UNSUPPORTED, sending
 * nothing, against an older daemon). opts may be NULL. The input and the
 * output may each be plain memory or lie in a segment (cvd_alloc,
 * cvd_register); both in segments: nothing is copied. They must not
 * overlap, except in place: an allgather's input exactly the caller's own
 * block of the output, a reduce_scatter's output exactly the caller's own
 * block of the input. Every _async form returns NULL on error; complete
 * it with cvd_wait().
 *
 * allreduce with a shape or scale factors; avg with plain cvd_allreduce. */
int cvd_allreduce_opts(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
		       const cvd_call_opts *opts, cvd_error *err);
cvd_request *cvd_allreduce_opts_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype,
				      cvd_op op, const cvd_call_opts *opts, cvd_error *err);
/* recv (count * cvd_size(c) elements) gets every rank's count elements of
 * send, rank 0's first. */
int cvd_allgather(cvd_client *c, const void *send, void *recv, size_t count, cvd_dtype dtype,
		  const cvd_call_opts *opts, cvd_error *err);
cvd_request *cvd_allgather_async(cvd_client *c, const void *send, void *recv, size_t count,
				 cvd_dtype dtype, const cvd_call_opts *opts, cvd_error *err);
/* counts: cvd_size(c) elements, rank i's count (zero allowed); count must
 * be counts[cvd_rank(c)]. recv (the sum of counts elements) gets rank i's
 * elements at offset counts[0] + ... + counts[i-1]. */
int cvd_allgatherv(cvd_client *c, const void *send, size_t count, void *recv,
		   const uint64_t *counts, cvd_dtype dtype, const cvd_call_opts *opts, cvd_error *err);
cvd_request *cvd_allgatherv_async(cvd_client *c, const void *send, size_t count, void *recv,
				  const uint64_t *counts, cvd_dtype dtype, const cvd_call_opts *opts,
				  cvd_error *err);
/* send holds count elements (a multiple of cvd_size(c)); recv gets the
 * caller's block of their reduction: count / cvd_size(c) elements from
 * offset cvd_rank(c) * count / cvd_size(c). */
int cvd_reduce_scatter(cvd_client *c, const void *send, void *recv, size_t count, cvd_dtype dtype,
		       cvd_op op, const cvd_call_opts *opts, cvd_error *err);
cvd_request *cvd_reduce_scatter_async(cvd_client *c, const void *send, void *recv, size_t count,
				      cvd_dtype dtype, cvd_op op, const cvd_call_opts *opts,
				      cvd_error *err);
/* counts: cvd_size(c) elements summing to count; recv gets
 * counts[cvd_rank(c)] elements, from offset counts[0] + ... of the
 * reduction. */
int cvd_reduce_scatterv(cvd_client *c, const void *send, size_t count, void *recv,
			const uint64_t *counts, cvd_dtype dtype, cvd_op op, const cvd_call_opts *opts,
			cvd_error *err);
cvd_request *cvd_reduce_scatterv_async(cvd_client *c, const void *send, size_t count, void *recv,
				       const uint64_t *counts, cvd_dtype dtype, cvd_op op,
				       const cvd_call_opts *opts, cvd_error *err);
/* In place: at the root (a world rank) buf gets the reduction; elsewhere
 * it is left as it was. */
int cvd_reduce(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op, uint32_t root,
	       const cvd_call_opts *opts, cvd_error *err);
cvd_request *cvd_reduce_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
			      uint32_t root, const cvd_call_opts *opts, cvd_error *err);

/* 16-bit floats, which C has no portable type for: conversions from and
 * to float, rounding to nearest even (overflow to infinity; a NaN stays a
 * NaN, made quiet), as the daemon rounds (docs/PROTOCOL.md, Reductions).
 * Widening is exact. */
uint16_t cvd_f32_to_f16(float x);
float cvd_f16_to_f32(uint16_t h);
uint16_t cvd_f32_to_bf16(float x);
float cvd_bf16_to_f32(uint16_t h);

/* STATUS: the daemon's JSON document, malloc'd and NUL-terminated (free()
 * it); *len gets its length if len is not NULL. NULL on error. */
char *cvd_status(cvd_client *c, size_t *len, cvd_error *err);

/* ---------------------------------------------------------------------
 * Frame codec (used by the client; exposed for tests and other tools).
 * Strings and buffers point into the decoded frame; nothing is copied.
 */
enum {
	CVD_T_HELLO = 0x01, CVD_T_HELLO_OK = 0x81,
	CVD_T_ALLOC = 0x02, CVD_T_ALLOC_OK = 0x82,
	CVD_T_FREE = 0x03, CVD_T_FREE_OK = 0x83,
	CVD_T_REGISTER = 0x04, CVD_T_REGISTER_OK = 0x84,
	CVD_T_CALL = 0x05, CVD_T_CALL_OK = 0x85,
	CVD_T_STATUS = 0x06, CVD_T_STATUS_OK = 0x86,
	CVD_T_LANE = 0x10, CVD_T_LANE_OK = 0x90,     /* version 2 */
	CVD_T_WAKE = 0x11, CVD_T_WAKE_CLIENT = 0x91, /* version 2 */
	CVD_T_ERROR = 0xff
};

#define CVD_FLAG_FATAL 0x01     /* ERROR header flag */
#define CVD_HELLO_OBSERVER 0x01 /* HELLO payload flag */
#define CVD_CALL_SHM 0x01       /* CALL payload flag */
#define CVD_CALL_EXT 0x02       /* CALL payload flag: the extension follows the name (version 3) */
#define CVD_CALL_NAMED 0x04     /* CALL payload flag: matched by its name, in any order (version 4) */
#define CVD_X_COUNTS 0x01       /* extension xflags */
#define CVD_X_SCALE 0x02
#define CVD_X_OUT 0x04

typedef struct cvd_frame {
	uint8_t type;
	uint8_t frame_flags;
	uint64_t id;
	/* HELLO */
	char magic[4];
	uint16_t version;        /* HELLO, HELLO_OK */
	uint16_t flags;          /* HELLO and CALL payload flags */
	int32_t local_rank;      /* HELLO's requested local rank */
	uint32_t pid;
	const uint8_t *job;
	size_t job_len;
	const uint8_t *label;
	size_t label_len;
	/* HELLO_OK (and `size`: its first_call_timeout_ms in versions 3 and 4, 0 in
	 * versions 1 and 2; kept there, not in cvd_info or a new member, so
	 * that neither struct changes layout for programs built before it) */
	cvd_info info;
	/* ALLOC, REGISTER (size); ALLOC_OK, REGISTER_OK (segment, size); FREE (segment) */
	uint32_t segment;        /* also CALL with CVD_CALL_SHM */
	uint64_t size;
	/* CALL */
	uint8_t op, dtype, reduce;
	uint32_t root;
	uint64_t count;
	const uint8_t *name;
	size_t name_len;
	uint64_t offset;         /* CALL with CVD_CALL_SHM */
	/* CALL inline data, CALL_OK result, STATUS_OK JSON, ERROR message */
	const uint8_t *data;
	size_t data_len;
	/* CALL_OK */
	uint32_t generation;
	uint64_t seq;
	/* ERROR */
	uint16_t code;
} cvd_frame;

/* A version-3 CALL's extension (flag CVD_CALL_EXT), kept apart from
 * cvd_frame so that cvd_frame keeps its layout. */
typedef struct cvd_call_ext {
	uint8_t ndim;                  /* 0..CVD_MAX_NDIM */
	uint8_t xflags;                /* CVD_X_COUNTS | CVD_X_SCALE | CVD_X_OUT */
	uint64_t dims[CVD_MAX_NDIM];
	uint32_t ncounts;              /* with CVD_X_COUNTS */
	const uint64_t *counts;        /* encoding: ncounts counts; NULL: counts_le */
	const uint8_t *counts_le;      /* decoding: the frame's 8 * ncounts bytes (little-endian
					* u64s, maybe unaligned: read them with cvd_call_ext_count) */
	double prescale, postscale;    /* with CVD_X_SCALE */
	uint32_t out_segment;          /* with CVD_X_OUT (shared-memory calls only) */
	uint64_t out_offset;
} cvd_call_ext;

/* Count i of x (from counts, else from counts_le). */
uint64_t cvd_call_ext_count(const cvd_call_ext *x, uint32_t i);

/* Name of a frame type ("HELLO", ...), NULL if unknown. */
const char *cvd_frame_type_name(uint8_t type);
/* Element size of a dtype code, 0 for none/unknown. */
size_t cvd_dtype_size(int dtype);
/* Check a 16-byte header against the bound max_len; on success store the
 * payload length, type, flags and id in *f (and length in *length). */
int cvd_frame_header(const uint8_t *hdr, uint32_t max_len, cvd_frame *f, uint32_t *length,
		     cvd_error *err);
/* Decode one payload whose header passed cvd_frame_header. */
int cvd_frame_payload(cvd_frame *f, const uint8_t *payload, size_t len, cvd_error *err);
/* Decode exactly one whole frame. Failures: CVD_E_PROTOCOL, err->check set. */
int cvd_frame_decode(const uint8_t *buf, size_t len, uint32_t max_len, cvd_frame *f,
		     cvd_error *err);
/* Encode *f. Returns the frame's length; writes it only if it fits in cap.
 * Returns 0 for an unencodable frame (unknown type, string over 255 bytes,
 * a CALL with CVD_CALL_EXT: use cvd_frame_encode_ext). */
size_t cvd_frame_encode(const cvd_frame *f, uint8_t *out, size_t cap);
/* The same with a CALL's extension, as on a connection of protocol version
 * `version` (0: the newest), which decides whether CVD_CALL_EXT and
 * CVD_CALL_NAMED are defined flags (bad_flags before 3 and before 4). x
 * receives the extension of a CALL with CVD_CALL_EXT (zeroed otherwise);
 * x may be NULL: the extension is then checked but not kept (f->flags
 * still shows it). The plain functions above decode as on a connection
 * of the newest version (CVD_PROTOCOL_VERSION). A shape of more
 * than CVD_MAX_NDIM dimensions fails with check "bad_ndim". */
int cvd_frame_payload_ext(cvd_frame *f, const uint8_t *payload, size_t len, unsigned version,
			  cvd_call_ext *x, cvd_error *err);
int cvd_frame_decode_ext(const uint8_t *buf, size_t len, uint32_t max_len, unsigned version,
			 cvd_frame *f, cvd_call_ext *x, cvd_error *err);
/* Encode *f and, if it is a CALL with CVD_CALL_EXT, *x (which must not be
 * NULL then); as cvd_frame_encode otherwise. */
size_t cvd_frame_encode_ext(const cvd_frame *f, const cvd_call_ext *x, uint8_t *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* COLLECTIVED_H */
