/*
 * collectived.h - C client of collectived (client protocol version 3,
 * docs/PROTOCOL.md). C99, libc only; usable from C++.
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
 *     cvd_close(c);
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

#define CVD_PROTOCOL_VERSION 3 /* the newest spoken; a daemon that refuses it is asked in 2, then 1 (no lane) */
/* The slack on the daemon's timeout bound (docs/PROTOCOL.md, Timeouts):
 * the same 5 s as every client's. */
#define CVD_TIMEOUT_MARGIN_MS 5000
#define CVD_DEFAULT_SOCKET "/run/collectived/collectived.sock"
#define CVD_DEFAULT_JOB "default"
#define CVD_HEADER_SIZE 16
#define CVD_PRE_HELLO_MAX_FRAME 4096u

/* Element types (wire codes). */
typedef enum cvd_dtype {
	CVD_DTYPE_NONE = 0,
	CVD_FLOAT32 = 1,
	CVD_FLOAT64 = 2,
	CVD_INT32 = 3,
	CVD_INT64 = 4,
	CVD_BYTES = 5
} cvd_dtype;

/* Reduce operations (wire codes). */
typedef enum cvd_op {
	CVD_OP_NONE = 0,
	CVD_SUM = 1,
	CVD_PROD = 2,
	CVD_MAX = 3,
	CVD_MIN = 4
} cvd_op;

/* Collectives (wire codes). */
typedef enum cvd_collective {
	CVD_ALLREDUCE = 1,
	CVD_BROADCAST = 2,
	CVD_ALLGATHER = 3, /* reserved in protocol version 1 */
	CVD_BARRIER = 4
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
 * releases them with cvd_wait() or cvd_request_free(). NULL is a no-op. */
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
	cvd_op reduce;    /* allreduce only, else CVD_OP_NONE */
	uint32_t root;    /* broadcast only */
	void *buf;        /* in place; untouched until the request completes */
	size_t count;     /* elements */
	const char *name; /* NULL or at most 255 bytes; part of matching */
} cvd_call;

/* Start a call; NULL on error. Complete it with cvd_wait(). */
cvd_request *cvd_call_async(cvd_client *c, const cvd_call *call, cvd_error *err);
cvd_request *cvd_allreduce_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype,
				 cvd_op op, cvd_error *err);
/* Wait at most timeout_ms (< 0: the client's default). Returns 0 or an
 * error code. Except on CVD_E_WAIT_TIMEOUT (the request is still in flight
 * and may be waited on again), the request is freed. */
int cvd_wait(cvd_request *req, int64_t timeout_ms, cvd_error *err);
/* Nonzero once the request completed (reads what has arrived, never blocks). */
int cvd_test(cvd_request *req);
/* Generation and sequence number of a completed collective. */
uint32_t cvd_request_generation(const cvd_request *req);
uint64_t cvd_request_seq(const cvd_request *req);
/* Forget a request without waiting (its buffer must stay valid until the
 * client closes, as the reply may still arrive). */
void cvd_request_free(cvd_request *req);

int cvd_allreduce(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
		  cvd_error *err);
int cvd_broadcast(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, uint32_t root,
		  cvd_error *err);
int cvd_barrier(cvd_client *c, cvd_error *err);
/* Any call, synchronously. */
int cvd_call_sync(cvd_client *c, const cvd_call *call, cvd_error *err);

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
	/* HELLO_OK (and `size`: its first_call_timeout_ms in version 3, 0 in
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
 * Returns 0 for an unencodable frame (unknown type, string over 255 bytes). */
size_t cvd_frame_encode(const cvd_frame *f, uint8_t *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* COLLECTIVED_H */
