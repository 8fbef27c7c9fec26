/*
 * collectived.c - C client of collectived, protocol version 4 (3, 2 or 1 with an older daemon).
 * See collectived.h for the API and docs/PROTOCOL.md for the wire format.
 */
#define _GNU_SOURCE /* memfd_create, MSG_CMSG_CLOEXEC, F_ADD_SEALS */
#include "collectived.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 32
#define SCRATCH_MIN ((size_t)1 << 20)
#define FALLBACK_TIMEOUT_MS 600000
#define DEFAULT_CONNECT_TIMEOUT_MS 10000

/* ------------------------------------------------------------------ errors */

static void set_err(cvd_error *err, int code, const char *fmt, ...)
{
	va_list ap;
	if (!err)
		return;
	err->code = code;
	err->fatal = 0;
	err->check[0] = '\0';
	va_start(ap, fmt);
	vsnprintf(err->message, sizeof err->message, fmt, ap);
	va_end(ap);
}

/* A codec error: message "check: detail", err->check = check. */
static int frame_err(cvd_error *err, const char *check, const char *fmt, ...)
{
	va_list ap;
	size_t n;
	if (!err)
		return CVD_E_PROTOCOL;
	err->code = CVD_E_PROTOCOL;
	err->fatal = 0;
	snprintf(err->check, sizeof err->check, "%s", check);
	n = (size_t)snprintf(err->message, sizeof err->message, "%s: ", check);
	va_start(ap, fmt);
	vsnprintf(err->message + n, sizeof err->message - n, fmt, ap);
	va_end(ap);
	return CVD_E_PROTOCOL;
}

/* Put pre in front of msg, truncating the end of msg to fit. */
static void prefix_msg(char *msg, size_t cap, const char *pre)
{
	size_t p = strlen(pre), m = strlen(msg);
	if (p >= cap)
		return;
	if (p + m >= cap)
		m = cap - 1 - p;
	memmove(msg + p, msg, m);
	memcpy(msg, pre, p);
	msg[p + m] = '\0';
}

static void copy_err(cvd_error *dst, const cvd_error *src)
{
	if (dst && src && dst != src)
		memcpy(dst, src, sizeof *dst);
}

static const char *const code_names[] = {
	"OK", "BAD_FRAME", "VERSION", "JOB", "RANK_TAKEN", "RANK_RANGE", "FULL",
	"PERMISSION", "QUOTA", "BAD_SEGMENT", "BUSY", "BAD_FD", "BAD_REQUEST",
	"TOO_LARGE", "TOO_MANY", "MISMATCH", "TIMEOUT", "PEER_LOST", "TRAINER_LOST",
	"ABORTED", "SHUTDOWN", "UNSUPPORTED", "INTERNAL", "CORRUPT"};
static const char *const client_code_names[] = {
	"OK", "CONNECT", "CLOSED", "WAIT_TIMEOUT", "PROTOCOL", "INVALID", "NOMEM", "SYSTEM"};

const char *cvd_strerror(int code)
{
	if (code >= 0 && code <= CVD_E_CORRUPT)
		return code_names[code];
	if (code < 0 && code >= CVD_E_SYSTEM)
		return client_code_names[-code];
	return "UNKNOWN";
}

/* ------------------------------------------------------------------ codec */

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { put16(p, (uint16_t)v); put16(p + 2, (uint16_t)(v >> 16)); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) | ((uint32_t)get16(p + 2) << 16); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32); }

const char *cvd_frame_type_name(uint8_t type)
{
	switch (type) {
	case CVD_T_HELLO: return "HELLO";
	case CVD_T_HELLO_OK: return "HELLO_OK";
	case CVD_T_ALLOC: return "ALLOC";
	case CVD_T_ALLOC_OK: return "ALLOC_OK";
	case CVD_T_FREE: return "FREE";
	case CVD_T_FREE_OK: return "FREE_OK";
	case CVD_T_REGISTER: return "REGISTER";
	case CVD_T_REGISTER_OK: return "REGISTER_OK";
	case CVD_T_CALL: return "CALL";
	case CVD_T_CALL_OK: return "CALL_OK";
	case CVD_T_STATUS: return "STATUS";
	case CVD_T_STATUS_OK: return "STATUS_OK";
	case CVD_T_LANE: return "LANE";
	case CVD_T_LANE_OK: return "LANE_OK";
	case CVD_T_WAKE: return "WAKE";
	case CVD_T_WAKE_CLIENT: return "WAKE_CLIENT";
	case CVD_T_ERROR: return "ERROR";
	}
	return NULL;
}

size_t cvd_dtype_size(int dtype)
{
	static const size_t sizes[] = {0, 4, 8, 4, 8, 1, 2, 2, 1, 1};
	return (dtype >= 0 && dtype <= CVD_UINT8) ? sizes[dtype] : 0;
}

static const char *dtype_name(int dtype)
{
	static const char *const names[] = {"none", "float32", "float64", "int32", "int64", "bytes",
					    "float16", "bfloat16", "int8", "uint8"};
	return (dtype >= 0 && dtype <= CVD_UINT8) ? names[dtype] : "unknown";
}

static const char *op_name(int op)
{
	static const char *const names[] = {"none", "allreduce", "broadcast", "allgather", "barrier",
					    "reduce_scatter", "reduce"};
	return (op >= 0 && op <= CVD_REDUCE) ? names[op] : "unknown";
}

static const char *reduce_name(int r)
{
	static const char *const names[] = {"none", "sum", "prod", "max", "min", "avg"};
	return (r >= 0 && r <= CVD_AVG) ? names[r] : "unknown";
}

uint64_t cvd_call_ext_count(const cvd_call_ext *x, uint32_t i)
{
	if (x->counts)
		return x->counts[i];
	return x->counts_le ? get64(x->counts_le + 8 * (size_t)i) : 0;
}

static double get_f64(const uint8_t *p)
{
	uint64_t u = get64(p);
	double d;
	memcpy(&d, &u, sizeof d);
	return d;
}

static void put_f64(uint8_t *p, double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof u);
	put64(p, u);
}

/* Bytes of an extension (without the SHM spans), or (size_t)-1 if it
 * cannot be encoded. */
static size_t ext_len(const cvd_call_ext *x)
{
	size_t n;
	if (!x || x->ndim > CVD_MAX_NDIM || (x->xflags & ~(CVD_X_COUNTS | CVD_X_SCALE | CVD_X_OUT)))
		return (size_t)-1;
	n = 4 + 8 * (size_t)x->ndim;
	if (x->xflags & CVD_X_COUNTS) {
		if (x->ncounts && !x->counts && !x->counts_le)
			return (size_t)-1;
		if ((size_t)x->ncounts > ((size_t)-1 - 64) / 8 - n)
			return (size_t)-1;
		n += 8 + 8 * (size_t)x->ncounts;
	}
	if (x->xflags & CVD_X_SCALE)
		n += 16;
	return n;
}

/* Write the extension at o; returns its length. */
static size_t put_ext(uint8_t *o, const cvd_call_ext *x)
{
	size_t off = 4, i;
	o[0] = x->ndim;
	o[1] = x->xflags;
	put16(o + 2, 0);
	for (i = 0; i < x->ndim; i++, off += 8)
		put64(o + off, x->dims[i]);
	if (x->xflags & CVD_X_COUNTS) {
		put32(o + off, x->ncounts);
		put32(o + off + 4, 0);
		off += 8;
		for (i = 0; i < x->ncounts; i++, off += 8)
			put64(o + off, cvd_call_ext_count(x, (uint32_t)i));
	}
	if (x->xflags & CVD_X_SCALE) {
		put_f64(o + off, x->prescale);
		put_f64(o + off + 8, x->postscale);
		off += 16;
	}
	return off;
}

int cvd_frame_header(const uint8_t *hdr, uint32_t max_len, cvd_frame *f, uint32_t *length,
		     cvd_error *err)
{
	uint32_t len = get32(hdr);
	uint8_t type = hdr[4], flags = hdr[5];
	uint16_t reserved = get16(hdr + 6);
	const char *name = cvd_frame_type_name(type);
	/* The bound comes first: nothing is read or allocated for a hostile length. */
	if (len > max_len)
		return frame_err(err, "frame_too_long", "frame length %lu over the bound of %lu bytes",
				 (unsigned long)len, (unsigned long)max_len);
	if (!name)
		return frame_err(err, "unknown_type", "unknown frame type 0x%02x", type);
	if (reserved)
		return frame_err(err, "reserved_nonzero", "%s header reserved field is %u, must be 0",
				 name, reserved);
	if (flags & ~(type == CVD_T_ERROR ? CVD_FLAG_FATAL : 0))
		return frame_err(err, "bad_flags", "%s header flags 0x%02x not defined", name, flags);
	memset(f, 0, sizeof *f);
	f->type = type;
	f->frame_flags = flags;
	f->id = get64(hdr + 8);
	if (length)
		*length = len;
	return 0;
}

/* HELLO_OK's payload length in protocol version v (versions 1 and 2 end
 * with timeout_ms, 3 and 4 add first_call_timeout_ms); 0 for a version whose
 * layout this client does not know. */
static size_t hello_ok_len(unsigned v)
{
	if (v < 1 || v > CVD_PROTOCOL_VERSION)
		return 0;
	return v >= 3 ? 68 : 60;
}

#define NEED(n, what) do { if (len < (size_t)(n)) return frame_err(err, "payload_length", \
	"%s payload is %lu bytes, too short for %s", name, (unsigned long)len, what); } while (0)
#define EXACT(n) do { if (len != (size_t)(n)) return frame_err(err, "payload_length", \
	"%s payload is %lu bytes, must be %lu", name, (unsigned long)len, (unsigned long)(n)); } while (0)
#define ZERO(v, what) do { if (v) return frame_err(err, "reserved_nonzero", \
	"%s %s is %lu, must be 0", name, what, (unsigned long)(v)); } while (0)

int cvd_frame_payload(cvd_frame *f, const uint8_t *p, size_t len, cvd_error *err)
{
	return cvd_frame_payload_ext(f, p, len, CVD_PROTOCOL_VERSION, NULL, err);
}

int cvd_frame_payload_ext(cvd_frame *f, const uint8_t *p, size_t len, unsigned version,
			  cvd_call_ext *xout, cvd_error *err)
{
	const char *name = cvd_frame_type_name(f->type);
	size_t off, esize, i;
	cvd_call_ext xlocal, *x = xout ? xout : &xlocal;
	unsigned defined;
	if (version == 0)
		version = CVD_PROTOCOL_VERSION;
	memset(x, 0, sizeof *x);
	switch (f->type) {
	case CVD_T_HELLO:
		NEED(17, "the fixed fields and job length");
		memcpy(f->magic, p, 4);
		if (memcmp(p, "CLVD", 4) != 0)
			return frame_err(err, "bad_magic", "HELLO magic is %02x%02x%02x%02x, must be \"CLVD\"",
					 p[0], p[1], p[2], p[3]);
		f->version = get16(p + 4);
		f->flags = get16(p + 6);
		if (f->flags & ~CVD_HELLO_OBSERVER)
			return frame_err(err, "bad_flags", "HELLO flags 0x%04x not defined", f->flags);
		f->local_rank = (int32_t)get32(p + 8);
		f->pid = get32(p + 12);
		f->job_len = p[16];
		NEED(17 + f->job_len + 1, "the job name and label length");
		f->job = p + 17;
		off = 17 + f->job_len;
		f->label_len = p[off];
		EXACT(off + 1 + f->label_len);
		f->label = p + off + 1;
		return 0;
	case CVD_T_HELLO_OK:
		/* The version decides the layout, so it is read first. */
		NEED(2, "the version");
		f->version = get16(p);
		esize = hello_ok_len(f->version);
		if (!esize)
			return frame_err(err, "bad_version", "HELLO_OK is in protocol version %u, whose layout "
					 "this client does not know (it speaks 1 to %d)", f->version,
					 CVD_PROTOCOL_VERSION);
		if (len != esize)
			return frame_err(err, "payload_length", "HELLO_OK payload is %lu bytes, must be %lu in "
					 "protocol version %u", (unsigned long)len, (unsigned long)esize, f->version);
		ZERO(get16(p + 2), "reserved field");
		f->info.version = f->version;
		f->info.world_rank = get32(p + 4);
		f->info.world_size = get32(p + 8);
		f->info.node_rank = get32(p + 12);
		f->info.node_count = get32(p + 16);
		f->info.local_rank = get32(p + 20);
		f->info.local_size = get32(p + 24);
		f->info.inline_limit = get32(p + 28);
		f->info.max_frame = get32(p + 32);
		f->info.max_in_flight = get32(p + 36);
		f->info.generation = get32(p + 40);
		f->info.shm_quota = get64(p + 44);
		f->info.timeout_ms = get64(p + 52);
		f->size = f->version >= 3 ? get64(p + 60) : 0; /* first_call_timeout_ms */
		return 0;
	case CVD_T_ALLOC:
	case CVD_T_REGISTER:
		EXACT(8);
		f->size = get64(p);
		return 0;
	case CVD_T_ALLOC_OK:
	case CVD_T_REGISTER_OK:
		EXACT(16);
		f->segment = get32(p);
		ZERO(get32(p + 4), "reserved field");
		f->size = get64(p + 8);
		return 0;
	case CVD_T_FREE:
		EXACT(8);
		f->segment = get32(p);
		ZERO(get32(p + 4), "reserved field");
		return 0;
	case CVD_T_FREE_OK:
	case CVD_T_STATUS:
		EXACT(0);
		return 0;
	case CVD_T_CALL:
		NEED(17, "the description");
		f->op = p[0];
		f->dtype = p[1];
		f->reduce = p[2];
		f->flags = p[3];
		defined = CVD_CALL_SHM | (version >= 3 ? CVD_CALL_EXT : 0) | (version >= 4 ? CVD_CALL_NAMED : 0);
		if (f->flags & ~defined) {
			if (f->flags & ~(CVD_CALL_SHM | CVD_CALL_EXT | CVD_CALL_NAMED))
				return frame_err(err, "bad_flags", "CALL flags 0x%02x not defined", f->flags);
			if ((f->flags & CVD_CALL_EXT) && version < 3)
				return frame_err(err, "bad_flags", "CALL flag EXT (0x02) needs protocol version 3; "
						 "this connection speaks %u", version);
			return frame_err(err, "bad_flags", "CALL flag NAMED (0x04) needs protocol version 4; "
					 "this connection speaks %u", version);
		}
		f->root = get32(p + 4);
		f->count = get64(p + 8);
		f->name_len = p[16];
		NEED(17 + f->name_len, "the name");
		f->name = p + 17;
		off = 17 + f->name_len;
		if (f->flags & CVD_CALL_EXT) {
			if (len < off + 4)
				return frame_err(err, "payload_length", "CALL payload is %lu bytes, too short for "
						 "the extension (4 bytes after the name)", (unsigned long)len);
			x->ndim = p[off];
			x->xflags = p[off + 1];
			if (x->xflags & ~(CVD_X_COUNTS | CVD_X_SCALE | CVD_X_OUT))
				return frame_err(err, "bad_flags", "CALL extension xflags 0x%02x not defined",
						 x->xflags);
			ZERO(get16(p + off + 2), "extension reserved field");
			if (x->ndim > CVD_MAX_NDIM) /* well formed perhaps, but no shape has them */
				return frame_err(err, "bad_ndim", "CALL shape has %u dimensions, at most %d",
						 x->ndim, CVD_MAX_NDIM);
			off += 4;
			if (len - off < 8 * (size_t)x->ndim)
				return frame_err(err, "payload_length", "CALL shape of %u dimensions runs past "
						 "the %lu-byte payload", x->ndim, (unsigned long)len);
			for (i = 0; i < x->ndim; i++, off += 8)
				x->dims[i] = get64(p + off);
			if (x->xflags & CVD_X_COUNTS) {
				if (len - off < 8)
					return frame_err(err, "payload_length", "CALL payload is %lu bytes, too "
							 "short for ncounts", (unsigned long)len);
				x->ncounts = get32(p + off);
				ZERO(get32(p + off + 4), "counts reserved field");
				off += 8;
				/* by division: no 8 * ncounts is formed that could wrap */
				if ((len - off) / 8 < x->ncounts)
					return frame_err(err, "payload_length", "CALL counts (%lu) run past the "
							 "%lu-byte payload", (unsigned long)x->ncounts,
							 (unsigned long)len);
				x->counts_le = p + off;
				off += 8 * (size_t)x->ncounts;
			}
			if (x->xflags & CVD_X_SCALE) {
				if (len - off < 16)
					return frame_err(err, "payload_length", "CALL payload is %lu bytes, too "
							 "short for prescale and postscale", (unsigned long)len);
				x->prescale = get_f64(p + off);
				x->postscale = get_f64(p + off + 8);
				off += 16;
			}
		}
		if (f->flags & CVD_CALL_SHM) {
			/* the input span, then with OUT the result's */
			int out = (f->flags & CVD_CALL_EXT) && (x->xflags & CVD_X_OUT);
			if (len != off + (out ? 32 : 16))
				return frame_err(err, "payload_length", "CALL payload is %lu bytes, must be %lu "
						 "(a shared-memory call ends with %s)", (unsigned long)len,
						 (unsigned long)(off + (out ? 32 : 16)),
						 out ? "its input and OUT spans" : "its span");
			f->segment = get32(p + off);
			ZERO(get32(p + off + 4), "segment reserved field");
			f->offset = get64(p + off + 8);
			if (out) {
				x->out_segment = get32(p + off + 16);
				ZERO(get32(p + off + 20), "OUT segment reserved field");
				x->out_offset = get64(p + off + 24);
			}
			return 0;
		}
		/* Inline: the rest is data (an inline call has no OUT block;
		 * OUT set there is the daemon's BAD_REQUEST, not a frame error). */
		esize = cvd_dtype_size(f->dtype);
		if (f->dtype > CVD_UINT8 && f->count != 0) /* well formed, length uncheckable */
			return frame_err(err, "bad_dtype", "CALL dtype code %u unknown", f->dtype);
		f->data = p + off;
		f->data_len = len - off;
		/* count * esize without overflow: compare by division. */
		if ((esize == 0 && f->data_len != 0) ||
		    (esize != 0 && (f->data_len % esize != 0 || f->data_len / esize != f->count)))
			return frame_err(err, "inline_data_length",
					 "CALL inline data is %lu bytes, count %llu x element size %lu",
					 (unsigned long)f->data_len, (unsigned long long)f->count,
					 (unsigned long)esize);
		return 0;
	case CVD_T_CALL_OK:
		NEED(16, "generation, reserved and seq");
		f->generation = get32(p);
		ZERO(get32(p + 4), "reserved field");
		f->seq = get64(p + 8);
		f->data = p + 16;
		f->data_len = len - 16;
		return 0;
	case CVD_T_STATUS_OK:
		f->data = p;
		f->data_len = len;
		return 0;
	case CVD_T_LANE: case CVD_T_WAKE: case CVD_T_WAKE_CLIENT:
		EXACT(0);
		return 0;
	case CVD_T_LANE_OK:
		EXACT(8);
		f->size = get64(p);
		return 0;
	case CVD_T_ERROR:
		NEED(4, "code and reserved");
		f->code = get16(p);
		ZERO(get16(p + 2), "reserved field");
		f->data = p + 4;
		f->data_len = len - 4;
		return 0;
	}
	return frame_err(err, "unknown_type", "unknown frame type 0x%02x", f->type);
}

int cvd_frame_decode(const uint8_t *buf, size_t len, uint32_t max_len, cvd_frame *f,
		     cvd_error *err)
{
	return cvd_frame_decode_ext(buf, len, max_len, CVD_PROTOCOL_VERSION, f, NULL, err);
}

int cvd_frame_decode_ext(const uint8_t *buf, size_t len, uint32_t max_len, unsigned version,
			 cvd_frame *f, cvd_call_ext *x, cvd_error *err)
{
	uint32_t plen;
	int rc;
	if (len < CVD_HEADER_SIZE)
		return frame_err(err, "payload_length", "frame is %lu bytes, shorter than a header",
				 (unsigned long)len);
	if ((rc = cvd_frame_header(buf, max_len, f, &plen, err)) != 0)
		return rc;
	if (len - CVD_HEADER_SIZE != plen)
		return frame_err(err, "payload_length", "header says %lu payload bytes, frame has %lu",
				 (unsigned long)plen, (unsigned long)(len - CVD_HEADER_SIZE));
	return cvd_frame_payload_ext(f, buf + CVD_HEADER_SIZE, plen, version, x, err);
}

/* Payload length of *f (with x, its extension), or (size_t)-1 if it
 * cannot be encoded. */
static size_t payload_len(const cvd_frame *f, const cvd_call_ext *x)
{
	size_t xl = 0;
	switch (f->type) {
	case CVD_T_HELLO:
		if (f->job_len > 255 || f->label_len > 255)
			return (size_t)-1;
		return 18 + f->job_len + f->label_len;
	case CVD_T_HELLO_OK: return hello_ok_len(f->version) ? hello_ok_len(f->version) : (size_t)-1;
	case CVD_T_ALLOC: case CVD_T_REGISTER: case CVD_T_FREE: return 8;
	case CVD_T_ALLOC_OK: case CVD_T_REGISTER_OK: return 16;
	case CVD_T_FREE_OK: case CVD_T_STATUS: return 0;
	case CVD_T_LANE: case CVD_T_WAKE: case CVD_T_WAKE_CLIENT: return 0;
	case CVD_T_LANE_OK: return 8;
	case CVD_T_CALL:
		if (f->name_len > 255 || (f->flags & ~(CVD_CALL_SHM | CVD_CALL_EXT | CVD_CALL_NAMED)))
			return (size_t)-1;
		if (f->flags & CVD_CALL_EXT) {
			if ((xl = ext_len(x)) == (size_t)-1)
				return (size_t)-1;
			if ((f->flags & CVD_CALL_SHM) && (x->xflags & CVD_X_OUT))
				xl += 16;
		}
		return 17 + f->name_len + xl + ((f->flags & CVD_CALL_SHM) ? 16 : f->data_len);
	case CVD_T_CALL_OK: return 16 + f->data_len;
	case CVD_T_STATUS_OK: return f->data_len;
	case CVD_T_ERROR: return 4 + f->data_len;
	}
	return (size_t)-1;
}

/* Header and payload up to (not including) the CALL inline data; x is
 * the CALL's extension (with CVD_CALL_EXT). */
static size_t encode_prefix(const cvd_frame *f, const cvd_call_ext *x, uint8_t *o, size_t plen)
{
	size_t off;
	put32(o, (uint32_t)plen);
	o[4] = f->type;
	o[5] = f->frame_flags;
	put16(o + 6, 0);
	put64(o + 8, f->id);
	o += CVD_HEADER_SIZE;
	switch (f->type) {
	case CVD_T_HELLO:
		memcpy(o, f->magic, 4);
		put16(o + 4, f->version);
		put16(o + 6, f->flags);
		put32(o + 8, (uint32_t)f->local_rank);
		put32(o + 12, f->pid);
		o[16] = (uint8_t)f->job_len;
		if (f->job_len)
			memcpy(o + 17, f->job, f->job_len);
		off = 17 + f->job_len;
		o[off] = (uint8_t)f->label_len;
		if (f->label_len)
			memcpy(o + off + 1, f->label, f->label_len);
		return CVD_HEADER_SIZE + plen;
	case CVD_T_HELLO_OK:
		put16(o, f->version);
		put16(o + 2, 0);
		put32(o + 4, f->info.world_rank);
		put32(o + 8, f->info.world_size);
		put32(o + 12, f->info.node_rank);
		put32(o + 16, f->info.node_count);
		put32(o + 20, f->info.local_rank);
		put32(o + 24, f->info.local_size);
		put32(o + 28, f->info.inline_limit);
		put32(o + 32, f->info.max_frame);
		put32(o + 36, f->info.max_in_flight);
		put32(o + 40, f->info.generation);
		put64(o + 44, f->info.shm_quota);
		put64(o + 52, f->info.timeout_ms);
		if (f->version >= 3)
			put64(o + 60, f->size); /* first_call_timeout_ms */
		return CVD_HEADER_SIZE + plen;
	case CVD_T_ALLOC: case CVD_T_REGISTER: case CVD_T_LANE_OK:
		put64(o, f->size);
		return CVD_HEADER_SIZE + plen;
	case CVD_T_ALLOC_OK: case CVD_T_REGISTER_OK:
		put32(o, f->segment);
		put32(o + 4, 0);
		put64(o + 8, f->size);
		return CVD_HEADER_SIZE + plen;
	case CVD_T_FREE:
		put32(o, f->segment);
		put32(o + 4, 0);
		return CVD_HEADER_SIZE + plen;
	case CVD_T_CALL:
		o[0] = f->op;
		o[1] = f->dtype;
		o[2] = f->reduce;
		o[3] = (uint8_t)f->flags;
		put32(o + 4, f->root);
		put64(o + 8, f->count);
		o[16] = (uint8_t)f->name_len;
		if (f->name_len)
			memcpy(o + 17, f->name, f->name_len);
		off = 17 + f->name_len;
		if (f->flags & CVD_CALL_EXT)
			off += put_ext(o + off, x);
		if (f->flags & CVD_CALL_SHM) {
			put32(o + off, f->segment);
			put32(o + off + 4, 0);
			put64(o + off + 8, f->offset);
			if ((f->flags & CVD_CALL_EXT) && (x->xflags & CVD_X_OUT)) {
				put32(o + off + 16, x->out_segment);
				put32(o + off + 20, 0);
				put64(o + off + 24, x->out_offset);
			}
			return CVD_HEADER_SIZE + plen;
		}
		return CVD_HEADER_SIZE + off;
	case CVD_T_CALL_OK:
		put32(o, f->generation);
		put32(o + 4, 0);
		put64(o + 8, f->seq);
		return CVD_HEADER_SIZE + 16;
	case CVD_T_ERROR:
		put16(o, f->code);
		put16(o + 2, 0);
		return CVD_HEADER_SIZE + 4;
	}
	return CVD_HEADER_SIZE; /* FREE_OK, STATUS, STATUS_OK: data follows */
}

size_t cvd_frame_encode(const cvd_frame *f, uint8_t *out, size_t cap)
{
	return cvd_frame_encode_ext(f, NULL, out, cap);
}

size_t cvd_frame_encode_ext(const cvd_frame *f, const cvd_call_ext *x, uint8_t *out, size_t cap)
{
	size_t plen = payload_len(f, x), pre;
	if (plen == (size_t)-1 || plen > 0xffffffffu)
		return 0;
	if (cap < CVD_HEADER_SIZE + plen)
		return CVD_HEADER_SIZE + plen;
	pre = encode_prefix(f, x, out, plen);
	if (pre < CVD_HEADER_SIZE + plen && f->data_len)
		memcpy(out + pre, f->data, f->data_len);
	return CVD_HEADER_SIZE + plen;
}

/* ------------------------------------------------------------------ client */

typedef struct seg {
	uint32_t id;
	uint8_t *base;
	size_t size;
	int scratch; /* library-owned, for copying large plain buffers */
	int busy;    /* scratch in use by a call */
	struct seg *next;
} seg;

struct cvd_request {
	cvd_client *c;
	uint64_t id;
	uint8_t reply_type;
	int done;
	int user;      /* returned to the caller (else internal) */
	int orphan;    /* nobody waits any more: freed when the reply arrives */
	cvd_error err; /* err.code != 0: failed */
	int inline_call;     /* CALL: its data went in the frame, its result comes in CALL_OK */
	uint8_t *copy_back;  /* CALL: the result lands here (NULL: already in place) */
	size_t nbytes;       /* ... this many bytes of it */
	seg *scratch;        /* scratch call: copy back from it, then release */
	size_t scratch_off;  /* where in the scratch segment the result lies */
	uint32_t generation;
	uint64_t seq;
	uint32_t segment;    /* ALLOC_OK/REGISTER_OK */
	uint64_t size;
	void *map;           /* ALLOC_OK mapping */
	char *json;          /* STATUS_OK */
	size_t json_len;
	uint64_t call_bytes; /* CALL: its buffer's size, which decides polling */
	char *name;          /* a named CALL (version 4): its name, NUL-terminated; held until
			      * the reply comes (one name in flight at once), never on the lane */
	cvd_request *next;
};

struct cvd_client {
	int fd;
	cvd_info info;
	int observer;
	int64_t timeout_ms;
	uint64_t first_call_timeout_ms; /* HELLO_OK's, version 3 on; 0 before (cvd_info keeps its layout) */
	int64_t spin_ns; /* cvd_options.spin_us; 0: never poll */
	int64_t inline_max; /* cvd_options.inline_max, capped by info.inline_limit; -1: none */
	int small_scratch;  /* scratch segments made for calls that could go inline */
	uint64_t next_id;
	uint64_t bytes_sent;
	uint8_t *rbuf;
	size_t rcap, rstart, rend;
	size_t rbase; /* rbuf's usual size; it grows for a STATUS_OK past it, then shrinks back */
	int fds[MAX_FDS];
	size_t nfds;
	cvd_request *pending;
	size_t in_flight;
	seg *segs;
	int broken;
	cvd_error broken_err;
	pid_t pid; /* the process that connected */
	/* The lane (docs/PROTOCOL.md, LANE): NULL if none. */
	uint8_t *lane;
	uint8_t *lane_buf;  /* a frame taken from the lane */
	uint32_t lane_own;  /* frames put in the c2d slot */
	uint32_t lane_seen; /* frames taken from the d2c slot */
	uint64_t lane_id;   /* the call on the lane, 0 if none */
	int64_t sock_at;    /* while polling a lane: when to poll the socket next */
};

/* The lane's layout (docs/PROTOCOL.md, LANE). */
#define LANE_SIZE 12288
#define LANE_FRAME_MAX 4096
#define L_C2D_SEQ 0
#define L_C2D_TAKEN 64
#define L_D2C_SEQ 128
#define L_D_PARKED 192
#define L_C_PARKED 256
#define L_C2D 4096
#define L_D2C 8192
/* While polling with a lane, the socket is read this often (the lane on
 * every turn): each turn's system call costs other pollers their turn. */
#define LANE_SOCKET_EVERY_NS 20000

/* Calls up to this size poll for their reply (as the daemon's
 * ipc.PollMaxBytes); a longer call outlasts the poll, which would only take
 * CPU from the daemons doing it. */
#define POLL_MAX_BYTES (256u << 10)
#define DEFAULT_SPIN_NS 200000
/* Above this, a call on plain memory costs less copied through a scratch
 * segment than carried through the socket both ways (docs/TUNING.md,
 * section 18). */
#define DEFAULT_INLINE_MAX 2048
/* Scratch segments made for calls the daemon would take inline: one for
 * each of up to eight such calls in flight at once (a trainer overlapping
 * its gradient buckets), as the Go client (docs/TUNING.md, section 30:
 * with two, the third of four 64 KiB calls in flight went inline on the
 * socket both ways); more go inline. */
#define SMALL_SCRATCH 8
#define MAX_SPIN_US 10000

static uint32_t lane_load(const cvd_client *c, size_t off)
{
	return __atomic_load_n((const uint32_t *)(const void *)(c->lane + off), __ATOMIC_SEQ_CST);
}

static void lane_store(cvd_client *c, size_t off, uint32_t v)
{
	__atomic_store_n((uint32_t *)(void *)(c->lane + off), v, __ATOMIC_SEQ_CST);
}

/* The daemon has put an answer on the lane that is not taken yet. */
static int lane_rung(const cvd_client *c) { return c->lane && lane_load(c, L_D2C_SEQ) != c->lane_seen; }

/* The daemon has taken every call put on the lane: only then may a frame
 * follow on the socket (the daemon matches calls in the order it reads
 * them). */
static int lane_free(const cvd_client *c) { return !c->lane || lane_load(c, L_C2D_TAKEN) == c->lane_own; }

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cvd_options_init(cvd_options *opt)
{
	memset(opt, 0, sizeof *opt);
	opt->local_rank = -1;
}

const cvd_info *cvd_get_info(const cvd_client *c) { return &c->info; }
int cvd_rank(const cvd_client *c) { return c->observer ? -1 : (int)c->info.world_rank; }
int cvd_size(const cvd_client *c) { return (int)c->info.world_size; }
int cvd_local_rank(const cvd_client *c) { return c->observer ? -1 : (int)c->info.local_rank; }
int cvd_local_size(const cvd_client *c) { return (int)c->info.local_size; }
int cvd_node_rank(const cvd_client *c) { return (int)c->info.node_rank; }
int cvd_node_count(const cvd_client *c) { return (int)c->info.node_count; }
uint32_t cvd_generation(const cvd_client *c) { return c->info.generation; }
int64_t cvd_default_timeout_ms(const cvd_client *c) { return c->timeout_ms; }
uint64_t cvd_first_call_timeout_ms(const cvd_client *c) { return c->first_call_timeout_ms; }
uint64_t cvd_bytes_sent(const cvd_client *c) { return c->bytes_sent; }
int cvd_has_lane(const cvd_client *c) { return c->lane != NULL; }

/* Write every byte of the iovecs (blocking, bounded by SO_SNDTIMEO). The
 * optional fd rides with the first byte. */
static int send_all(cvd_client *c, struct iovec *iov, int n, int fd, cvd_error *err)
{
	union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
	struct msghdr mh;
	size_t total = 0;
	int i;
	for (i = 0; i < n; i++)
		total += iov[i].iov_len;
	c->bytes_sent += total;
	while (n > 0) {
		ssize_t w;
		memset(&mh, 0, sizeof mh);
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)n;
		if (fd >= 0) {
			struct cmsghdr *cm;
			memset(&u, 0, sizeof u);
			mh.msg_control = u.buf;
			mh.msg_controllen = sizeof u.buf;
			cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		}
		w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			set_err(err, CVD_E_CLOSED, "sending to the daemon: %s", strerror(errno));
			return CVD_E_CLOSED;
		}
		fd = -1;
		while (n > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			n--;
		}
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

static void free_req(cvd_request *r);

static void req_fail(cvd_request *r, const cvd_error *e)
{
	copy_err(&r->err, e);
	if (r->err.code == 0)
		r->err.code = CVD_E_CLOSED;
	if (r->scratch) {
		r->scratch->busy = 0;
		r->scratch = NULL;
	}
	r->done = 1;
}

static void unlink_req(cvd_client *c, cvd_request *r)
{
	cvd_request **pp;
	for (pp = &c->pending; *pp; pp = &(*pp)->next) {
		if (*pp == r) {
			*pp = r->next;
			r->next = NULL;
			if (c->in_flight)
				c->in_flight--;
			return;
		}
	}
}

/* The connection is unusable from now on: every request in flight fails. */
static void break_conn(cvd_client *c, const cvd_error *e)
{
	cvd_request *r, *next;
	if (!c->broken) {
		c->broken = 1;
		copy_err(&c->broken_err, e);
	}
	for (r = c->pending; r; r = next) {
		next = r->next;
		r->next = NULL;
		req_fail(r, e);
		if (r->orphan)
			free_req(r);
	}
	c->pending = NULL;
	c->in_flight = 0;
	c->lane_id = 0;
	while (c->nfds)
		close(c->fds[--c->nfds]);
}

static cvd_request *find_req(cvd_client *c, uint64_t id)
{
	cvd_request *r;
	for (r = c->pending; r; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

static int pop_fd(cvd_client *c)
{
	int fd;
	if (!c->nfds)
		return -1;
	fd = c->fds[0];
	memmove(c->fds, c->fds + 1, (c->nfds - 1) * sizeof(int));
	c->nfds--;
	return fd;
}

/* Handle one decoded frame from the daemon. Nonzero: the connection broke. */
static int dispatch(cvd_client *c, const cvd_frame *f)
{
	cvd_error e;
	cvd_request *r;
	memset(&e, 0, sizeof e);
	if (f->type == CVD_T_WAKE_CLIENT) {
		/* The daemon's ring: its answer is on the lane, looked at next. */
		if (f->id == 0)
			return 0;
		set_err(&e, CVD_E_PROTOCOL, "WAKE_CLIENT carries id %llu, want 0", (unsigned long long)f->id);
		break_conn(c, &e);
		return -1;
	}
	if (c->lane_id != 0 && f->id == c->lane_id)
		c->lane_id = 0; /* answered, whichever way: the lane is free */
	r = find_req(c, f->id);
	if (f->type == CVD_T_ERROR) {
		e.code = f->code;
		e.fatal = (f->frame_flags & CVD_FLAG_FATAL) != 0;
		snprintf(e.message, sizeof e.message, "%s: %.*s", cvd_strerror(f->code),
			 (int)f->data_len, (const char *)f->data);
		if (r) {
			unlink_req(c, r);
			req_fail(r, &e);
			if (r->orphan)
				free_req(r);
		}
		if (e.fatal || f->id == 0) {
			break_conn(c, &e);
			return -1;
		}
		if (!r)
			goto unmatched;
		return 0;
	}
	if (!r)
		goto unmatched;
	if (f->type != r->reply_type) {
		set_err(&e, CVD_E_PROTOCOL, "daemon answered request %llu with %s, expected %s",
			(unsigned long long)f->id, cvd_frame_type_name(f->type),
			cvd_frame_type_name(r->reply_type));
		break_conn(c, &e);
		return -1;
	}
	unlink_req(c, r);
	switch (f->type) {
	case CVD_T_ALLOC_OK: case CVD_T_LANE_OK: {
		int fd = pop_fd(c);
		struct stat st;
		void *m;
		if (fd < 0) {
			set_err(&e, CVD_E_PROTOCOL, "%s (id %llu) arrived without an fd",
				cvd_frame_type_name(f->type), (unsigned long long)f->id);
			req_fail(r, &e);
			break_conn(c, &e);
			return -1;
		}
		memset(&st, 0, sizeof st);
		if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < f->size) {
			/* Mapping past the memfd's end would fault on first touch. */
			set_err(&e, CVD_E_PROTOCOL, "%s (id %llu) says %llu bytes, its memfd has %lld",
				cvd_frame_type_name(f->type), (unsigned long long)f->id,
				(unsigned long long)f->size, (long long)st.st_size);
			close(fd);
			req_fail(r, &e);
			goto out;
		}
		m = mmap(NULL, (size_t)f->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		close(fd);
		if (m == MAP_FAILED) {
			set_err(&e, CVD_E_SYSTEM, "mmap of segment %lu (%llu bytes): %s",
				(unsigned long)f->segment, (unsigned long long)f->size, strerror(errno));
			req_fail(r, &e);
			goto out;
		}
		r->map = m;
		r->segment = f->segment;
		r->size = f->size;
		break;
	}
	case CVD_T_REGISTER_OK:
		r->segment = f->segment;
		r->size = f->size;
		break;
	case CVD_T_CALL_OK:
		c->info.generation = f->generation;
		r->generation = f->generation;
		r->seq = f->seq;
		if (r->inline_call) {
			/* the result: as long as the op table says (the request's
			 * data length, but for allgather and reduce_scatter) */
			if (f->data_len != r->nbytes) {
				set_err(&e, CVD_E_PROTOCOL, "CALL_OK result is %lu bytes, the call expects %lu",
					(unsigned long)f->data_len, (unsigned long)r->nbytes);
				req_fail(r, &e);
				goto out;
			}
			if (r->nbytes)
				memcpy(r->copy_back, f->data, r->nbytes);
			break;
		}
		if (f->data_len) {
			set_err(&e, CVD_E_PROTOCOL, "CALL_OK for a shared-memory call carries %lu bytes",
				(unsigned long)f->data_len);
			req_fail(r, &e);
			goto out;
		}
		if (r->scratch) { /* the result is in the scratch segment: copy it out */
			if (r->copy_back && r->nbytes)
				memcpy(r->copy_back, r->scratch->base + r->scratch_off, r->nbytes);
			r->scratch->busy = 0;
			r->scratch = NULL;
		}
		break;
	case CVD_T_STATUS_OK:
		r->json = (char *)malloc(f->data_len + 1);
		if (!r->json) {
			set_err(&e, CVD_E_NOMEM, "no memory for a %lu-byte status", (unsigned long)f->data_len);
			req_fail(r, &e);
			goto out;
		}
		memcpy(r->json, f->data, f->data_len);
		r->json[f->data_len] = '\0';
		r->json_len = f->data_len;
		break;
	default:
		break;
	}
	r->done = 1;
out:
	if (r->orphan)
		free_req(r);
	return 0;
unmatched:
	set_err(&e, CVD_E_PROTOCOL, "%s carries id %llu, which matches no request in flight",
		cvd_frame_type_name(f->type), (unsigned long long)f->id);
	break_conn(c, &e);
	return -1;
}

/* Take the answer waiting on the lane, check it as a frame from the socket
 * would be, and dispatch it. 0, or the broken connection's code. */
static int lane_take(cvd_client *c, cvd_error *err)
{
	uint32_t n = lane_load(c, L_D2C_SEQ), plen;
	cvd_frame f;
	cvd_error e;
	memset(&e, 0, sizeof e);
	if (n != c->lane_seen + 1) {
		set_err(&e, CVD_E_PROTOCOL, "lane: %lu answers put since the last taken, want 1",
			(unsigned long)(n - c->lane_seen));
		goto bad;
	}
	c->lane_seen = n;
	/* Check the copy, never the slot: the daemon could still write to it. */
	memcpy(c->lane_buf, c->lane + L_D2C, LANE_FRAME_MAX);
	if (cvd_frame_header(c->lane_buf, c->info.max_frame, &f, &plen, &e) != 0)
		goto bad;
	if (plen > LANE_FRAME_MAX - CVD_HEADER_SIZE) {
		set_err(&e, CVD_E_PROTOCOL, "lane: %s of %lu bytes does not fit the lane",
			cvd_frame_type_name(f.type), (unsigned long)plen);
		goto bad;
	}
	if (f.type != CVD_T_CALL_OK && f.type != CVD_T_ERROR) {
		set_err(&e, CVD_E_PROTOCOL, "lane: %s (id %llu): only CALL_OK and ERROR may travel the lane",
			cvd_frame_type_name(f.type), (unsigned long long)f.id);
		goto bad;
	}
	if (cvd_frame_payload(&f, c->lane_buf + CVD_HEADER_SIZE, plen, &e) != 0)
		goto bad;
	if (dispatch(c, &f) != 0) {
		copy_err(err, &c->broken_err);
		return c->broken_err.code;
	}
	return 0;
bad:
	prefix_msg(e.message, sizeof e.message, "frame from the daemon: ");
	break_conn(c, &e);
	copy_err(err, &e);
	return e.code;
}

/* Put a call, given as iovecs, on the lane and ring the daemon if it
 * sleeps on the socket. The caller checked that it fits and the lane is
 * free. */
static int lane_put(cvd_client *c, const struct iovec *iov, int n, cvd_error *err)
{
	static const uint8_t wake[CVD_HEADER_SIZE] = {0, 0, 0, 0, CVD_T_WAKE};
	struct iovec w;
	size_t off = 0;
	int i;
	for (i = 0; i < n; i++) {
		memcpy(c->lane + L_C2D + off, iov[i].iov_base, iov[i].iov_len);
		off += iov[i].iov_len;
	}
	c->bytes_sent += off;
	lane_store(c, L_C2D_SEQ, ++c->lane_own);
	if (!lane_load(c, L_D_PARKED))
		return 0;
	w.iov_base = (void *)wake;
	w.iov_len = sizeof wake;
	return send_all(c, &w, 1, -1, err);
}

/* Read what is there (waiting until deadline_ms; polling without sleeping
 * until spin_until_ns first, if that is later than now) and dispatch whole
 * frames. Returns 0 after progress, CVD_E_WAIT_TIMEOUT, or the broken
 * connection's code. */
static int grow_rbuf(cvd_client *c, size_t need, cvd_error *err);

static int progress(cvd_client *c, int64_t deadline_ms, int64_t spin_until_ns, cvd_error *err)
{
	union { char buf[CMSG_SPACE(MAX_FDS * sizeof(int))]; struct cmsghdr align; } u;
	struct pollfd pfd;
	struct msghdr mh;
	struct iovec iov;
	struct cmsghdr *cm;
	cvd_error e;
	ssize_t n;
	size_t got;
	int left;
	if (c->broken) {
		copy_err(err, &c->broken_err);
		return c->broken_err.code ? c->broken_err.code : CVD_E_CLOSED;
	}
	for (;;) {
		int64_t rem = deadline_ms - now_ms();
		int spinning = rem > 0 && spin_until_ns > 0 && now_ns() < spin_until_ns, parked = 0;
		left = rem < 0 ? 0 : (rem > 1000000000 ? 1000000000 : (int)rem);
		if (spinning)
			left = 0; /* poll: look, yield the CPU, look again */
		if (c->lane && c->rstart == c->rend) {
			/* Between frames of the socket, the lane comes first. */
			if (lane_rung(c))
				return lane_take(c, err);
			if (spinning) {
				int64_t t = now_ns();
				if (t < c->sock_at) {
					sched_yield();
					continue;
				}
				c->sock_at = t + LANE_SOCKET_EVERY_NS;
			} else if (left > 0) {
				/* About to sleep on the socket: say so, then look once
				 * more, so that the daemon either rings or is seen. */
				lane_store(c, L_C_PARKED, 1);
				if (lane_rung(c)) {
					lane_store(c, L_C_PARKED, 0);
					return lane_take(c, err);
				}
				parked = 1;
			}
		}
		pfd.fd = c->fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		n = poll(&pfd, 1, left);
		if (parked)
			lane_store(c, L_C_PARKED, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			set_err(&e, CVD_E_SYSTEM, "poll: %s", strerror(errno));
			break_conn(c, &e);
			copy_err(err, &e);
			return e.code;
		}
		if (n == 0 && rem > 0 && spin_until_ns > 0 && now_ns() < spin_until_ns) {
			sched_yield();
			continue;
		}
		if (n == 0 && rem > 0 && spin_until_ns > 0) {
			spin_until_ns = 0; /* the poll ran out: sleep until readable */
			continue;
		}
		if (n == 0) {
			set_err(err, CVD_E_WAIT_TIMEOUT, "no reply from the daemon in time");
			return CVD_E_WAIT_TIMEOUT;
		}
		break;
	}
	if (c->rend == c->rcap) { /* keep the partial frame, move it to the front */
		memmove(c->rbuf, c->rbuf + c->rstart, c->rend - c->rstart);
		c->rend -= c->rstart;
		c->rstart = 0;
	}
	memset(&mh, 0, sizeof mh);
	iov.iov_base = c->rbuf + c->rend;
	iov.iov_len = c->rcap - c->rend;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof u.buf;
	do
		n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	got = 0;
	for (cm = CMSG_FIRSTHDR(&mh); n >= 0 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
			size_t k, nf = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			got += nf;
			for (k = 0; k < nf; k++) {
				int fd;
				memcpy(&fd, CMSG_DATA(cm) + k * sizeof(int), sizeof fd);
				if (c->nfds < MAX_FDS)
					c->fds[c->nfds++] = fd;
				else
					close(fd);
			}
		}
	}
	if (n < 0) {
		set_err(&e, CVD_E_CLOSED, "reading from the daemon: %s", strerror(errno));
	} else if (n == 0) {
		set_err(&e, CVD_E_CLOSED, "the daemon closed the connection");
	} else if ((mh.msg_flags & MSG_CTRUNC) && got < MAX_FDS) {
		/* Room was left: the kernel could not install an fd here. */
		set_err(&e, CVD_E_SYSTEM, "an fd the daemon sent could not be received: this process is out of file descriptors (MSG_CTRUNC)");
	} else if (mh.msg_flags & MSG_CTRUNC) {
		set_err(&e, CVD_E_PROTOCOL, "control message truncated (MSG_CTRUNC): surplus fds");
	} else {
		c->rend += (size_t)n;
		while (c->rend - c->rstart >= CVD_HEADER_SIZE) {
			cvd_frame f;
			uint32_t plen, bound = c->info.max_frame;
			/* STATUS_OK alone may pass max_frame, up to CVD_MAX_STATUS_FRAME. */
			if (c->rbuf[c->rstart + 4] == CVD_T_STATUS_OK && bound < CVD_MAX_STATUS_FRAME)
				bound = CVD_MAX_STATUS_FRAME;
			if (cvd_frame_header(c->rbuf + c->rstart, bound, &f, &plen, &e) != 0)
				goto bad;
			if (c->rend - c->rstart < CVD_HEADER_SIZE + (size_t)plen) {
				if (grow_rbuf(c, CVD_HEADER_SIZE + (size_t)plen, &e) != 0)
					goto bad;
				break;
			}
			if (cvd_frame_payload(&f, c->rbuf + c->rstart + CVD_HEADER_SIZE, plen, &e) != 0)
				goto bad;
			c->rstart += CVD_HEADER_SIZE + plen;
			if (dispatch(c, &f) != 0) {
				copy_err(err, &c->broken_err);
				return c->broken_err.code;
			}
		}
		if (c->rstart == c->rend) {
			c->rstart = c->rend = 0;
			if (c->rcap > c->rbase) { /* a large STATUS_OK has gone: shrink back */
				uint8_t *nb = (uint8_t *)realloc(c->rbuf, c->rbase);
				if (nb) {
					c->rbuf = nb;
					c->rcap = c->rbase;
				}
			}
		}
		return 0;
	}
bad:
	if (e.code == CVD_E_PROTOCOL && e.check[0])
		prefix_msg(e.message, sizeof e.message, "frame from the daemon: ");
	break_conn(c, &e);
	copy_err(err, &e);
	return e.code;
}

/* Make room in rbuf for a whole frame of need bytes from rstart (only a
 * STATUS_OK can be larger than rbuf's usual size). */
static int grow_rbuf(cvd_client *c, size_t need, cvd_error *err)
{
	uint8_t *nb;
	if (need <= c->rcap)
		return 0;
	memmove(c->rbuf, c->rbuf + c->rstart, c->rend - c->rstart);
	c->rend -= c->rstart;
	c->rstart = 0;
	nb = (uint8_t *)realloc(c->rbuf, need);
	if (!nb) {
		set_err(err, CVD_E_NOMEM, "no memory for a %lu-byte frame from the daemon", (unsigned long)need);
		return -1;
	}
	c->rbuf = nb;
	c->rcap = need;
	return 0;
}

static cvd_request *new_req(cvd_client *c, uint8_t reply_type, cvd_error *err)
{
	cvd_request *r;
	if (getpid() != c->pid) {
		/* A forked child shares the socket: its frames would interleave
		 * with the parent's. */
		set_err(err, CVD_E_INVALID, "this client was made in process %ld; connect anew after fork()",
			(long)c->pid);
		return NULL;
	}
	if (c->broken) {
		copy_err(err, &c->broken_err);
		if (err)
			prefix_msg(err->message, sizeof err->message, "connection unusable: ");
		return NULL;
	}
	r = (cvd_request *)calloc(1, sizeof *r);
	if (!r) {
		set_err(err, CVD_E_NOMEM, "no memory for a request");
		return NULL;
	}
	r->c = c;
	r->reply_type = reply_type;
	r->id = c->next_id++;
	return r;
}

/* Wait for a free in-flight slot, then send; the request joins pending. */
static int submit(cvd_client *c, cvd_request *r, struct iovec *iov, int n, int fd, cvd_error *err)
{
	int rc;
	if (c->info.max_in_flight) {
		int64_t deadline = now_ms() + c->timeout_ms;
		while (c->in_flight >= c->info.max_in_flight) {
			rc = progress(c, deadline, 0, err);
			if (rc == CVD_E_WAIT_TIMEOUT)
				set_err(err, rc, "%lu requests already in flight for %lld ms",
					(unsigned long)c->in_flight, (long long)c->timeout_ms);
			if (rc)
				return rc;
		}
	}
	/* The lane carries calls matched by order only: never a named one. */
	if (c->lane && fd < 0 && r->reply_type == CVD_T_CALL_OK && r->call_bytes <= POLL_MAX_BYTES &&
	    c->in_flight == 0 && !r->name) {
		size_t total = 0;
		int i;
		for (i = 0; i < n; i++)
			total += iov[i].iov_len;
		if (total <= LANE_FRAME_MAX) {
			r->next = c->pending;
			c->pending = r;
			c->in_flight++;
			c->lane_id = r->id;
			rc = lane_put(c, iov, n, err);
			goto sent;
		}
	}
	if (!lane_free(c)) {
		/* The call on the lane must be read before anything that follows. */
		int64_t deadline = now_ms() + c->timeout_ms;
		while (!lane_free(c)) {
			if (now_ms() > deadline) {
				set_err(err, CVD_E_WAIT_TIMEOUT, "the daemon did not take the call on the lane within %lld ms",
					(long long)c->timeout_ms);
				return CVD_E_WAIT_TIMEOUT;
			}
			sched_yield();
		}
	}
	r->next = c->pending;
	c->pending = r;
	c->in_flight++;
	rc = send_all(c, iov, n, fd, err);
sent:
	if (rc) {
		cvd_error e;
		copy_err(&e, err);
		break_conn(c, &e);
		return rc;
	}
	return 0;
}

static int wait_req(cvd_request *r, int64_t timeout_ms, cvd_error *err)
{
	cvd_client *c = r->c;
	int64_t deadline, spin_until = 0;
	if (c == NULL || r->done)
		goto done;
	deadline = now_ms() + (timeout_ms < 0 ? c->timeout_ms : timeout_ms);
	if (c->spin_ns > 0 && r->reply_type == CVD_T_CALL_OK && r->call_bytes <= POLL_MAX_BYTES)
		spin_until = now_ns() + c->spin_ns;
	while (!r->done) {
		int rc = progress(c, deadline, spin_until, err);
		if (rc != 0 && rc != CVD_E_WAIT_TIMEOUT && !r->done) {
			cvd_error e;
			copy_err(&e, err);
			unlink_req(c, r);
			req_fail(r, &e);
			break;
		}
		if (rc == CVD_E_WAIT_TIMEOUT && !r->done) {
			set_err(err, CVD_E_WAIT_TIMEOUT,
				"no reply from the daemon within %lld ms; request %llu is still in flight "
				"and its buffer must not be touched",
				(long long)(timeout_ms < 0 ? c->timeout_ms : timeout_ms),
				(unsigned long long)r->id);
			return CVD_E_WAIT_TIMEOUT;
		}
	}
done:
	if (r->err.code) {
		copy_err(err, &r->err);
		return r->err.code;
	}
	if (err)
		err->code = 0;
	return 0;
}

static void free_req(cvd_request *r)
{
	if (!r)
		return;
	if (r->c && !r->done)
		unlink_req(r->c, r);
	if (r->map && r->map != MAP_FAILED)
		munmap(r->map, (size_t)r->size);
	free(r->json);
	free(r->name);
	free(r);
}

/* The default wait from HELLO_OK (docs/PROTOCOL.md, Timeouts): the
 * daemon's bound on any call, max(timeout_ms, first_call_timeout_ms), plus
 * two margins, so that its TIMEOUT (which names who has not called) always
 * comes first. A HELLO_OK older than version 3 does not state the first
 * call's bound: then 2 * timeout_ms plus two margins, or what this client
 * waited before (timeout_ms plus 10%, at least 5 s) if more. Capped at
 * INT64_MAX / 2 ms, so that adding it to a clock cannot overflow. */
static int64_t default_timeout(const cvd_info *info, uint64_t first_call_ms)
{
	const uint64_t cap = (uint64_t)INT64_MAX / 2, margins = 2 * CVD_TIMEOUT_MARGIN_MS;
	uint64_t t = info->timeout_ms, bound, old;
	if (info->version >= 3) {
		bound = t > first_call_ms ? t : first_call_ms;
		if (bound == 0)
			return FALLBACK_TIMEOUT_MS;
		return (int64_t)(bound > cap - margins ? cap : bound + margins);
	}
	if (t == 0)
		return FALLBACK_TIMEOUT_MS;
	if (t > (cap - margins) / 2)
		return (int64_t)cap;
	old = t + (t / 10 > 5000 ? t / 10 : 5000);
	bound = 2 * t + margins;
	return (int64_t)(bound > old ? bound : old);
}

/* Read exactly n bytes before the deadline (HELLO exchange only). */
static int read_full(int fd, uint8_t *buf, size_t n, int64_t deadline, cvd_error *err)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd pfd;
		int64_t rem = deadline - now_ms();
		ssize_t k;
		pfd.fd = fd;
		pfd.events = POLLIN;
		if (rem <= 0 || poll(&pfd, 1, (int)(rem > 1000000000 ? 1000000000 : rem)) == 0) {
			set_err(err, CVD_E_WAIT_TIMEOUT, "no reply to HELLO in time");
			return CVD_E_WAIT_TIMEOUT;
		}
		k = read(fd, buf + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			set_err(err, CVD_E_CLOSED, "daemon closed the connection during HELLO%s%s",
				k < 0 ? ": " : "", k < 0 ? strerror(errno) : "");
			return CVD_E_CLOSED;
		}
		got += (size_t)k;
	}
	return 0;
}

static int hello(cvd_client *c, const cvd_options *o, uint16_t version, int64_t deadline, cvd_error *err)
{
	uint8_t buf[16 + CVD_PRE_HELLO_MAX_FRAME];
	struct iovec iov;
	cvd_frame f;
	uint32_t plen;
	const char *job = o->job ? o->job : getenv("COLLECTIVED_JOB");
	const char *label = o->label ? o->label : "";
	size_t n;
	int rc;
	if (!job || !*job)
		job = CVD_DEFAULT_JOB;
	memset(&f, 0, sizeof f);
	f.type = CVD_T_HELLO;
	f.id = 1;
	memcpy(f.magic, "CLVD", 4);
	f.version = version;
	f.flags = o->observer ? CVD_HELLO_OBSERVER : 0;
	f.local_rank = o->observer ? -1 : o->local_rank;
	f.pid = (uint32_t)getpid();
	f.job = (const uint8_t *)job;
	f.job_len = strlen(job);
	f.label = (const uint8_t *)label;
	f.label_len = strlen(label);
	if (f.job_len > 255 || f.label_len > 255) {
		set_err(err, CVD_E_INVALID, "job name (%lu bytes) and label (%lu bytes) are limited to 255",
			(unsigned long)f.job_len, (unsigned long)f.label_len);
		return CVD_E_INVALID;
	}
	n = cvd_frame_encode(&f, buf, sizeof buf);
	iov.iov_base = buf;
	iov.iov_len = n;
	rc = send_all(c, &iov, 1, -1, err);
	/* A daemon refusing our credentials answers before reading anything
	 * and closes: even if the send failed, its ERROR may be waiting. */
	if (rc != 0 && read_full(c->fd, buf, CVD_HEADER_SIZE, now_ms() + 1000, NULL) != 0)
		return rc;
	if (rc == 0 && (rc = read_full(c->fd, buf, CVD_HEADER_SIZE, deadline, err)) != 0)
		return rc;
	if (cvd_frame_header(buf, CVD_PRE_HELLO_MAX_FRAME, &f, &plen, err) != 0 ||
	    read_full(c->fd, buf + CVD_HEADER_SIZE, plen, deadline, err) != 0 ||
	    cvd_frame_payload(&f, buf + CVD_HEADER_SIZE, plen, err) != 0)
		return err ? err->code : CVD_E_PROTOCOL;
	if (f.type == CVD_T_ERROR) {
		set_err(err, f.code, "HELLO (protocol version %u): %s: %.*s", version, cvd_strerror(f.code), (int)f.data_len,
			(const char *)f.data);
		if (err)
			err->fatal = (f.frame_flags & CVD_FLAG_FATAL) != 0;
		return f.code;
	}
	if (f.type != CVD_T_HELLO_OK || f.id != 1) {
		set_err(err, CVD_E_PROTOCOL, "daemon answered HELLO with %s id %llu",
			cvd_frame_type_name(f.type), (unsigned long long)f.id);
		return CVD_E_PROTOCOL;
	}
	/* A later version than asked would speak frames we did not ask for
	 * (a lane in 2). */
	if (f.version < 1 || f.version > version) {
		set_err(err, CVD_E_PROTOCOL, "daemon answers HELLO (protocol version %u) in version %u",
			version, f.version);
		return CVD_E_PROTOCOL;
	}
	c->info = f.info;
	c->first_call_timeout_ms = f.size;
	return 0;
}

static cvd_client *connect_once(const char *socket_path, const cvd_options *opt, uint16_t version,
				cvd_error *err);
static int open_lane(cvd_client *c, cvd_error *err);

cvd_client *cvd_connect(const char *socket_path, const cvd_options *opt, cvd_error *err)
{
	cvd_error local;
	int64_t until;
	uint16_t version = CVD_PROTOCOL_VERSION;
	if (!err)
		err = &local;
	until = now_ms() + (opt && opt->rank_retry_ms > 0 ? opt->rank_retry_ms : 0);
	for (;;) {
		cvd_client *c = connect_once(socket_path, opt, version, err);
		struct timespec ts;
		/* A daemon older than this client refuses its version: ask again
		 * one version lower, on a new connection each time (VERSION is
		 * fatal to the old one), and keep to the version answered while
		 * retrying for a rank. What an older version lacks (named calls in
		 * 3, the first-call timeout too in 2, the lane too in 1) the client
		 * does without. */
		while (!c && err->code == CVD_E_VERSION && version > 1) {
			version--;
			c = connect_once(socket_path, opt, version, err);
		}
		if (c || (err->code != CVD_E_RANK_TAKEN && err->code != CVD_E_FULL) || now_ms() >= until)
			return c;
		ts.tv_sec = 0;
		ts.tv_nsec = 100000000L;
		nanosleep(&ts, NULL);
	}
}

static cvd_client *connect_once(const char *socket_path, const cvd_options *opt, uint16_t version,
				cvd_error *err)
{
	cvd_options defaults;
	struct sockaddr_un sa;
	cvd_client *c;
	int64_t deadline, cto;
	struct timeval tv;
	int rc;
	if (!opt) {
		cvd_options_init(&defaults);
		opt = &defaults;
	}
	if (!socket_path || !*socket_path)
		socket_path = getenv("COLLECTIVED_SOCKET");
	if (!socket_path || !*socket_path)
		socket_path = CVD_DEFAULT_SOCKET;
	if (strlen(socket_path) >= sizeof sa.sun_path) {
		set_err(err, CVD_E_INVALID, "socket path %s is longer than %lu bytes", socket_path,
			(unsigned long)sizeof sa.sun_path - 1);
		return NULL;
	}
	c = (cvd_client *)calloc(1, sizeof *c);
	if (!c) {
		set_err(err, CVD_E_NOMEM, "no memory for a client");
		return NULL;
	}
	c->next_id = 2;
	c->pid = getpid();
	c->observer = opt->observer != 0;
	cto = opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
	deadline = now_ms() + cto;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		set_err(err, CVD_E_SYSTEM, "socket: %s", strerror(errno));
		free(c);
		return NULL;
	}
	memset(&sa, 0, sizeof sa);
	sa.sun_family = AF_UNIX;
	memcpy(sa.sun_path, socket_path, strlen(socket_path));
	/* connect() on a Unix socket does not block for long; the HELLO reply
	 * is bounded by the deadline below. */
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
		set_err(err, CVD_E_CONNECT, "cannot connect to collectived at %s: %s", socket_path,
			strerror(errno));
		close(c->fd);
		free(c);
		return NULL;
	}
	/* Sends give up after the connect timeout until HELLO_OK tells the real one. */
	tv.tv_sec = (time_t)(cto / 1000);
	tv.tv_usec = (long)(cto % 1000) * 1000;
	setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	rc = hello(c, opt, version, deadline, err);
	if (rc != 0) {
		close(c->fd);
		free(c);
		return NULL;
	}
	c->timeout_ms = opt->timeout_ms > 0 ? opt->timeout_ms : default_timeout(&c->info, c->first_call_timeout_ms);
	if (opt->spin_us == 0)
		c->spin_ns = DEFAULT_SPIN_NS;
	else if (opt->spin_us > 0)
		c->spin_ns = (opt->spin_us > MAX_SPIN_US ? MAX_SPIN_US : opt->spin_us) * 1000;
	c->inline_max = opt->inline_max == 0 ? DEFAULT_INLINE_MAX : opt->inline_max < 0 ? -1 : opt->inline_max;
	if (c->inline_max > (int64_t)c->info.inline_limit)
		c->inline_max = (int64_t)c->info.inline_limit;
	tv.tv_sec = (time_t)(c->timeout_ms / 1000);
	tv.tv_usec = (long)(c->timeout_ms % 1000) * 1000;
	setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	c->rcap = 2 * ((size_t)c->info.max_frame + CVD_HEADER_SIZE);
	if (c->rcap < 65536)
		c->rcap = 65536;
	c->rbase = c->rcap;
	c->rbuf = (uint8_t *)malloc(c->rcap);
	if (!c->rbuf) {
		set_err(err, CVD_E_NOMEM, "no memory for a %lu-byte read buffer", (unsigned long)c->rcap);
		close(c->fd);
		free(c);
		return NULL;
	}
	if (c->info.version >= 2 && !c->observer && !opt->no_lane && open_lane(c, err) != 0) {
		prefix_msg(err->message, sizeof err->message, "lane: ");
		cvd_close(c);
		return NULL;
	}
	if (err)
		err->code = 0;
	return c;
}

/* A graceful end: half-close, then read (discarding) until the daemon closes
 * its side, at most ms milliseconds. The daemon closes once it has released
 * this trainer's local rank, so a clean exit is never mistaken for a crash
 * mid-collective, and a trainer restarted at once finds its rank free. */
static void drain_until_closed(int fd, int ms)
{
	char buf[4096];
	int64_t deadline = now_ms() + ms;
	if (shutdown(fd, SHUT_WR) != 0)
		return;
	for (;;) {
		struct pollfd p;
		int64_t left = deadline - now_ms();
		int rc;
		ssize_t n;
		if (left <= 0)
			return;
		p.fd = fd;
		p.events = POLLIN;
		p.revents = 0;
		rc = poll(&p, 1, (int)left);
		if (rc < 0 && errno == EINTR)
			continue;
		if (rc <= 0)
			return;
		n = read(fd, buf, sizeof buf); /* fds riding on discarded bytes are closed by the kernel */
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			return;
	}
}

void cvd_close(cvd_client *c)
{
	cvd_error e;
	cvd_request *r;
	seg *s, *next;
	if (!c)
		return;
	set_err(&e, CVD_E_CLOSED, "client closed");
	/* The caller still owns its requests: fail and detach them. Orphans go. */
	while ((r = c->pending) != NULL) {
		c->pending = r->next;
		r->next = NULL;
		req_fail(r, &e);
		r->c = NULL;
		if (r->orphan)
			free_req(r);
	}
	drain_until_closed(c->fd, 2000);
	close(c->fd);
	while (c->nfds)
		close(c->fds[--c->nfds]);
	for (s = c->segs; s; s = next) {
		next = s->next;
		munmap(s->base, s->size);
		free(s);
	}
	if (c->lane)
		munmap(c->lane, LANE_SIZE);
	free(c->lane_buf);
	free(c->rbuf);
	free(c);
}

/* ------------------------------------------------------------------ segments */

static int request_sync(cvd_client *c, cvd_request *r, struct iovec *iov, int n, int fd,
			cvd_error *err)
{
	int rc = submit(c, r, iov, n, fd, err);
	if (rc == 0)
		rc = wait_req(r, -1, err);
	if (rc == CVD_E_WAIT_TIMEOUT && !r->done)
		r->orphan = 1; /* the caller returns now; the reply frees it */
	return rc;
}

static seg *add_seg(cvd_client *c, uint32_t id, void *base, size_t size, int scratch, cvd_error *err)
{
	seg *s = (seg *)calloc(1, sizeof *s);
	if (!s) {
		set_err(err, CVD_E_NOMEM, "no memory for a segment record");
		return NULL;
	}
	s->id = id;
	s->base = (uint8_t *)base;
	s->size = size;
	s->scratch = scratch;
	s->next = c->segs;
	c->segs = s;
	return s;
}

/* control_request sends f, a request of fixed fields only (its id is set
 * here), with fd attached when fd >= 0, and waits for the reply. On success
 * it returns 0 and *out is the finished request, which the caller frees. On
 * failure it returns the error code; the request is freed, or, if the wait
 * timed out, left for its late reply to free. */
static int control_request(cvd_client *c, cvd_frame *f, uint8_t reply, int fd, cvd_request **out,
			   cvd_error *err)
{
	uint8_t buf[CVD_HEADER_SIZE + 16];
	struct iovec iov;
	cvd_request *r;
	int rc;
	*out = NULL;
	if (!(r = new_req(c, reply, err)))
		return err ? err->code : CVD_E_CLOSED;
	f->id = r->id;
	iov.iov_base = buf;
	iov.iov_len = cvd_frame_encode(f, buf, sizeof buf);
	rc = request_sync(c, r, &iov, 1, fd, err);
	if (rc != 0) {
		if (!r->orphan)
			free_req(r);
		return rc;
	}
	*out = r;
	return 0;
}

/* Ask the daemon for the connection's lane (LANE) and map it. */
static int open_lane(cvd_client *c, cvd_error *err)
{
	cvd_frame f;
	cvd_request *r;
	int rc;
	memset(&f, 0, sizeof f);
	f.type = CVD_T_LANE;
	if ((rc = control_request(c, &f, CVD_T_LANE_OK, -1, &r, err)) != 0)
		return rc;
	if ((rc = r->err.code) != 0) {
		copy_err(err, &r->err);
		free_req(r);
		return rc;
	}
	if (r->size != LANE_SIZE) {
		set_err(err, CVD_E_PROTOCOL, "LANE_OK says %llu bytes, want %d", (unsigned long long)r->size,
			LANE_SIZE);
		free_req(r);
		return CVD_E_PROTOCOL;
	}
	c->lane_buf = (uint8_t *)malloc(LANE_FRAME_MAX);
	if (!c->lane_buf) {
		set_err(err, CVD_E_NOMEM, "no memory for the lane's frame buffer");
		free_req(r);
		return CVD_E_NOMEM;
	}
	c->lane = (uint8_t *)r->map; /* the request gives the mapping up */
	r->map = NULL;
	free_req(r);
	return 0;
}

static seg *alloc_seg(cvd_client *c, size_t size, int scratch, cvd_error *err)
{
	cvd_frame f;
	cvd_request *r;
	seg *s;
	if (size == 0) {
		set_err(err, CVD_E_INVALID, "cvd_alloc: size 0");
		return NULL;
	}
	memset(&f, 0, sizeof f);
	f.type = CVD_T_ALLOC;
	f.size = size;
	if (control_request(c, &f, CVD_T_ALLOC_OK, -1, &r, err) != 0)
		return NULL;
	s = add_seg(c, r->segment, r->map, (size_t)r->size, scratch, err);
	if (s)
		r->map = NULL; /* now owned by the segment list */
	free_req(r);
	return s;
}

void *cvd_alloc(cvd_client *c, size_t size, cvd_error *err)
{
	seg *s = alloc_seg(c, size, 0, err);
	return s ? s->base : NULL;
}

void *cvd_register(cvd_client *c, size_t size, cvd_error *err)
{
	cvd_frame f;
	cvd_request *r;
	void *m;
	int fd, rc;
	if (size == 0) {
		set_err(err, CVD_E_INVALID, "cvd_register: size 0");
		return NULL;
	}
	fd = memfd_create("collectived", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		set_err(err, CVD_E_SYSTEM, "memfd_create: %s", strerror(errno));
		return NULL;
	}
	if (ftruncate(fd, (off_t)size) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
		set_err(err, CVD_E_SYSTEM, "sizing and sealing a %lu-byte memfd: %s",
			(unsigned long)size, strerror(errno));
		close(fd);
		return NULL;
	}
	m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		set_err(err, CVD_E_SYSTEM, "mmap of a %lu-byte memfd: %s", (unsigned long)size,
			strerror(errno));
		close(fd);
		return NULL;
	}
	memset(&f, 0, sizeof f);
	f.type = CVD_T_REGISTER;
	f.size = size;
	rc = control_request(c, &f, CVD_T_REGISTER_OK, fd, &r, err);
	close(fd);
	if (rc != 0) {
		munmap(m, size);
		return NULL;
	}
	if (!add_seg(c, r->segment, m, size, 0, err)) {
		munmap(m, size);
		m = NULL;
	}
	free_req(r);
	return m;
}

static int free_seg(cvd_client *c, seg *s, cvd_error *err)
{
	cvd_frame f;
	cvd_request *r;
	seg **pp;
	int rc;
	memset(&f, 0, sizeof f);
	f.type = CVD_T_FREE;
	f.segment = s->id;
	rc = control_request(c, &f, CVD_T_FREE_OK, -1, &r, err);
	if (r)
		free_req(r);
	if (rc == 0 || rc == CVD_E_BAD_SEGMENT) {
		for (pp = &c->segs; *pp; pp = &(*pp)->next) {
			if (*pp == s) {
				*pp = s->next;
				break;
			}
		}
		munmap(s->base, s->size);
		free(s);
	}
	return rc;
}

int cvd_free(cvd_client *c, void *ptr, cvd_error *err)
{
	seg *s;
	for (s = c->segs; s; s = s->next)
		if (!s->scratch && s->base == (uint8_t *)ptr)
			return free_seg(c, s, err);
	set_err(err, CVD_E_INVALID, "cvd_free: %p is not the start of a segment of this client", ptr);
	return CVD_E_INVALID;
}

static seg *find_seg(cvd_client *c, const uint8_t *p, size_t n, size_t esize)
{
	seg *s;
	for (s = c->segs; s; s = s->next) {
		if (s->scratch || p < s->base || p > s->base + s->size || n > (size_t)(s->base + s->size - p))
			continue;
		if (esize && (size_t)(p - s->base) % esize)
			return NULL; /* misaligned for the protocol: take the copy path */
		return s;
	}
	return NULL;
}

/* A free scratch segment of at least n bytes, made if need be. For a call
 * the daemon would take inline (n <= inline_limit) it returns NULL with
 * err->code 0 when the client has made its SMALL_SCRATCH segments and none
 * is free, or cannot make one: that call goes inline. */
static seg *take_scratch(cvd_client *c, size_t n, cvd_error *err)
{
	seg *s, *best = NULL;
	size_t size;
	for (s = c->segs; s; s = s->next)
		if (s->scratch && !s->busy && s->size >= n && (!best || s->size < best->size))
			best = s;
	if (!best && n <= c->info.inline_limit) {
		if (c->small_scratch < SMALL_SCRATCH) {
			c->small_scratch++;
			/* one size for all of them, so that any serves any such call */
			best = alloc_seg(c, c->info.inline_limit, 1, err);
			if (!best)
				c->small_scratch = SMALL_SCRATCH; /* do not ask on every call */
		}
		if (!best) {
			if (err)
				err->code = 0;
			return NULL;
		}
	}
	if (!best) {
		for (size = SCRATCH_MIN; size < n; size *= 2)
			;
		best = alloc_seg(c, size, 1, err);
		if (!best && err && err->code == CVD_E_QUOTA) {
			/* drop idle scratch and try the exact size */
			seg *next;
			for (s = c->segs; s; s = next) {
				next = s->next;
				if (s->scratch && !s->busy)
					free_seg(c, s, NULL);
			}
			best = alloc_seg(c, n, 1, err);
		}
	}
	if (best)
		best->busy = 1;
	return best;
}

/* ------------------------------------------------------------------ calls */

void cvd_call_opts_init(cvd_call_opts *o) { memset(o, 0, sizeof *o); }

static int is_float(int dtype)
{
	return dtype == CVD_FLOAT32 || dtype == CVD_FLOAT64 || dtype == CVD_FLOAT16 || dtype == CVD_BFLOAT16;
}

/* What of this call needs protocol version 3 (NULL: nothing). */
static const char *needs_v3(const cvd_call *call, int reduces, const uint64_t *counts, int shape, int scale,
			    char *buf, size_t cap)
{
	if (call->op == CVD_ALLGATHER || call->op == CVD_REDUCE_SCATTER || call->op == CVD_REDUCE)
		snprintf(buf, cap, "%s", op_name(call->op));
	else if (call->op != CVD_BARRIER && call->dtype >= CVD_FLOAT16)
		snprintf(buf, cap, "dtype %s", dtype_name(call->dtype));
	else if (reduces && call->reduce == CVD_AVG)
		snprintf(buf, cap, "reduce op avg");
	else if (counts)
		snprintf(buf, cap, "per-rank counts");
	else if (shape)
		snprintf(buf, cap, "a shape");
	else if (scale)
		snprintf(buf, cap, "prescale and postscale");
	else
		return NULL;
	return buf;
}

/* The offset, in elements, of rank r's block: counts[0] + ... + counts[r-1]
 * (the caller checked that the sum does not wrap), or r * each. */
static uint64_t block_start(const uint64_t *counts, uint64_t each, uint32_t r)
{
	uint64_t sum = 0;
	uint32_t i;
	if (!counts)
		return each * r;
	for (i = 0; i < r; i++)
		sum += counts[i];
	return sum;
}

/* A named call (version 4) needs a name, a daemon of version 4, and no
 * call of its name in flight on this client: the daemon would refuse it
 * (docs/PROTOCOL.md, "Named calls"). 0, or an error code (err set). */
static int check_named(cvd_client *c, const char *name, size_t name_len, const char *fn, cvd_error *err)
{
	cvd_request *r;
	if (name_len == 0) {
		set_err(err, CVD_E_INVALID, "%s: a named call needs a name (cvd_call.name or cvd_call_opts.name)", fn);
		return CVD_E_INVALID;
	}
	if (c->info.version < 4) {
		set_err(err, CVD_E_UNSUPPORTED, "%s: named call \"%s\": named calls need protocol version 4; "
			"the daemon speaks %u", fn, name, (unsigned)c->info.version);
		return CVD_E_UNSUPPORTED;
	}
	for (r = c->pending; r; r = r->next) {
		if (r->name && strcmp(r->name, name) == 0) {
			set_err(err, CVD_E_INVALID, "%s: named call \"%s\": this client's call of that name "
				"(request %llu) is still in flight; a name may be in flight only once", fn, name,
				(unsigned long long)r->id);
			return CVD_E_INVALID;
		}
	}
	return 0;
}

/* Start any call. fn names the caller's function in error messages. */
static cvd_request *start_call(cvd_client *c, const cvd_call *call, void *out, const uint64_t *counts,
			       const cvd_call_opts *opts, const char *fn, cvd_error *err)
{
	uint8_t pre_stack[CVD_HEADER_SIZE + 17 + 255 + 4 + 8 * CVD_MAX_NDIM + 8 + 16 + 32 + 8 * 16];
	uint8_t *pre = pre_stack, *heap = NULL;
	struct iovec iov[2];
	cvd_frame f;
	cvd_call_ext x;
	cvd_request *r;
	const char *name = call->name ? call->name : (opts ? opts->name : NULL);
	size_t esize, in_bytes, out_bytes = 0, name_len = name ? strlen(name) : 0, plen, prefix_len;
	uint64_t out_count = 0, own_start = 0, sum = 0;
	uint32_t w = c->info.world_size, rank = c->info.world_rank, i;
	int op = (int)call->op, has_out = op == CVD_ALLGATHER || op == CVD_REDUCE_SCATTER;
	int reduces = op == CVD_ALLREDUCE || op == CVD_REDUCE || op == CVD_REDUCE_SCATTER;
	int niov = 1, shm = 0, scale = 0, named = opts && opts->named;
	double pre_s = 1, post_s = 1;
	size_t ndim = opts ? opts->ndim : 0;
	seg *in_seg = NULL, *out_seg = NULL, *s = NULL;
	size_t in_part = 0, out_part = 0; /* bytes of input and output copied through scratch */
	char what[64];
	const char *v3;

	if (op < CVD_ALLREDUCE || op > CVD_REDUCE) {
		set_err(err, CVD_E_INVALID, "%s: unknown collective code %d", fn, op);
		return NULL;
	}
	esize = cvd_dtype_size(call->dtype);
	if (op != CVD_BARRIER && esize == 0) {
		set_err(err, CVD_E_INVALID, "%s: unknown dtype code %d", fn, (int)call->dtype);
		return NULL;
	}
	if (name_len > 255) {
		set_err(err, CVD_E_INVALID, "%s: call name is %lu bytes, limit 255", fn, (unsigned long)name_len);
		return NULL;
	}
	if (op == CVD_BARRIER ? call->count != 0 : (call->count && !call->buf)) {
		set_err(err, CVD_E_INVALID, "%s: %s", fn, op == CVD_BARRIER ? "a barrier takes no buffer"
									: "NULL buffer with a nonzero count");
		return NULL;
	}
	if (esize && call->count > (size_t)-1 / esize) {
		set_err(err, CVD_E_INVALID, "%s: count %lu overflows", fn, (unsigned long)call->count);
		return NULL;
	}
	in_bytes = call->count * esize;
	if (opts) {
		pre_s = opts->prescale == 0 ? 1 : opts->prescale;
		post_s = opts->postscale == 0 ? 1 : opts->postscale;
		scale = pre_s != 1 || post_s != 1;
	}
	v3 = needs_v3(call, reduces, counts, ndim != 0, scale, what, sizeof what);
	if (v3 && c->info.version < 3) {
		set_err(err, CVD_E_UNSUPPORTED, "%s: %s needs protocol version 3; the daemon speaks %u", fn, v3,
			(unsigned)c->info.version);
		return NULL;
	}
	if (named && check_named(c, name, name_len, fn, err) != 0)
		return NULL;
	if (!has_out && (out || counts)) {
		set_err(err, CVD_E_INVALID, "%s: %s takes %s", fn, op_name(op),
			out ? "no output buffer (its result is in place)" : "no per-rank counts");
		return NULL;
	}
	if (ndim > CVD_MAX_NDIM || (ndim && !opts->shape)) {
		set_err(err, CVD_E_INVALID, "%s: a shape of %lu dimensions%s (at most %d)", fn, (unsigned long)ndim,
			ndim && !opts->shape ? " without its dimensions" : "", CVD_MAX_NDIM);
		return NULL;
	}
	if (ndim) {
		/* the product, stopping before it could wrap */
		uint64_t prod = 1;
		int zero = 0, big = 0;
		for (i = 0; i < ndim; i++) {
			if (opts->shape[i] == 0)
				zero = 1;
			else if (!big && prod > UINT64_MAX / opts->shape[i])
				big = 1;
			else if (!big)
				prod *= opts->shape[i];
		}
		if (zero ? call->count != 0 : (big || prod != (uint64_t)call->count)) {
			set_err(err, CVD_E_INVALID, "%s: the shape's product is %s%llu, the count %lu", fn,
				!zero && big ? "over " : "", zero ? 0ull : (unsigned long long)prod,
				(unsigned long)call->count);
			return NULL;
		}
	}
	if (scale && (!isfinite(pre_s) || !isfinite(post_s))) {
		set_err(err, CVD_E_INVALID, "%s: prescale %g and postscale %g must be finite", fn, pre_s, post_s);
		return NULL;
	}
	if (has_out) {
		if (c->observer) {
			set_err(err, CVD_E_INVALID, "%s: an observer takes no part in collectives", fn);
			return NULL;
		}
		if (counts) {
			for (i = 0; i < w; i++) {
				if (counts[i] > UINT64_MAX - sum) {
					set_err(err, CVD_E_INVALID, "%s: the counts' sum overflows", fn);
					return NULL;
				}
				sum += counts[i];
			}
			if (op == CVD_ALLGATHER && counts[rank] != (uint64_t)call->count) {
				set_err(err, CVD_E_INVALID, "%s: count %lu disagrees with counts[%lu] = %llu, this "
					"rank's own", fn, (unsigned long)call->count, (unsigned long)rank,
					(unsigned long long)counts[rank]);
				return NULL;
			}
			if (op == CVD_REDUCE_SCATTER && sum != (uint64_t)call->count) {
				set_err(err, CVD_E_INVALID, "%s: the counts sum to %llu, the count is %lu", fn,
					(unsigned long long)sum, (unsigned long)call->count);
				return NULL;
			}
			out_count = op == CVD_ALLGATHER ? sum : counts[rank];
			own_start = block_start(counts, 0, rank);
		} else if (op == CVD_ALLGATHER) {
			if (w && call->count > UINT64_MAX / w) {
				set_err(err, CVD_E_INVALID, "%s: count %lu times %lu ranks overflows", fn,
					(unsigned long)call->count, (unsigned long)w);
				return NULL;
			}
			out_count = (uint64_t)call->count * w;
			own_start = (uint64_t)call->count * rank;
		} else {
			if (w == 0 || call->count % w != 0) {
				set_err(err, CVD_E_INVALID, "%s: count %lu is not a multiple of the world size %lu", fn,
					(unsigned long)call->count, (unsigned long)w);
				return NULL;
			}
			out_count = call->count / w;
			own_start = out_count * rank;
		}
		if (out_count > (uint64_t)((size_t)-1 / esize)) {
			set_err(err, CVD_E_INVALID, "%s: a result of %llu elements overflows", fn,
				(unsigned long long)out_count);
			return NULL;
		}
		out_bytes = (size_t)out_count * esize;
		if (out_bytes && !out) {
			set_err(err, CVD_E_INVALID, "%s: %s needs an output buffer of %llu elements", fn,
				op_name(op), (unsigned long long)out_count);
			return NULL;
		}
	}

	memset(&f, 0, sizeof f);
	memset(&x, 0, sizeof x);
	f.type = CVD_T_CALL;
	f.op = (uint8_t)op;
	f.dtype = (uint8_t)(op == CVD_BARRIER ? 0 : call->dtype);
	f.reduce = (uint8_t)(reduces ? call->reduce : 0);
	f.root = (op == CVD_BROADCAST || op == CVD_REDUCE) ? call->root : 0;
	f.count = call->count;
	f.name = (const uint8_t *)name;
	f.name_len = name_len;
	if (named)
		f.flags |= CVD_CALL_NAMED;
	x.ndim = (uint8_t)ndim;
	for (i = 0; i < ndim; i++)
		x.dims[i] = opts->shape[i];
	if (counts) {
		x.xflags |= CVD_X_COUNTS;
		x.ncounts = w;
		x.counts = counts;
	}
	if (scale) {
		x.xflags |= CVD_X_SCALE;
		x.prescale = pre_s;
		x.postscale = post_s;
	}
	if (ndim || counts || scale)
		f.flags |= CVD_CALL_EXT;

	/* Where the buffers go: both in segments (an empty one anywhere), the
	 * spans only; else inline, or through a scratch segment. */
	if (in_bytes)
		in_seg = find_seg(c, (const uint8_t *)call->buf, in_bytes, esize);
	if (out_bytes)
		out_seg = find_seg(c, (const uint8_t *)out, out_bytes, esize);
	if ((in_seg || out_seg) && (in_seg || !in_bytes) && (out_seg || !out_bytes)) {
		shm = 1;
	} else if (in_bytes || out_bytes) {
		/* inline: the frame (its extension too) within max_frame, the
		 * result within inline_limit */
		int fits = in_bytes <= c->info.inline_limit && out_bytes <= c->info.inline_limit &&
			   CVD_HEADER_SIZE + 17 + name_len + (f.flags & CVD_CALL_EXT ? ext_len(&x) : 0) + in_bytes <=
				   (size_t)c->info.max_frame + CVD_HEADER_SIZE;
		int small = (int64_t)in_bytes <= c->inline_max && (int64_t)out_bytes <= c->inline_max;
		if (!(small && fits)) {
			cvd_error se;
			memset(&se, 0, sizeof se);
			in_part = in_seg ? 0 : in_bytes;
			out_part = out_seg ? 0 : out_bytes;
			/* NULL with code 0: no small scratch segment free, go inline */
			s = take_scratch(c, in_part + out_part, &se);
			if (!s && (se.code != 0 || !fits)) {
				if (se.code == 0)
					set_err(&se, CVD_E_TOO_LARGE, "%lu bytes in and %lu out fit neither the frame "
						"nor a free scratch segment", (unsigned long)in_bytes,
						(unsigned long)out_bytes);
				prefix_msg(se.message, sizeof se.message, ": ");
				prefix_msg(se.message, sizeof se.message, fn);
				copy_err(err, &se);
				return NULL;
			}
			shm = s != NULL;
		}
	}
	if (shm) {
		/* input span: the caller's segment, else scratch from 0; for an
		 * empty input, the caller's own block of the output (in place) */
		f.flags |= CVD_CALL_SHM;
		if (in_seg) {
			f.segment = in_seg->id;
			f.offset = (uint64_t)((const uint8_t *)call->buf - in_seg->base);
		} else if (in_part) {
			f.segment = s->id;
			f.offset = 0;
		} else {
			seg *o = out_seg ? out_seg : s;
			f.segment = o->id;
			f.offset = (out_seg ? (uint64_t)((const uint8_t *)out - out_seg->base) : in_part) +
				   own_start * esize;
		}
		if (has_out) {
			f.flags |= CVD_CALL_EXT;
			x.xflags |= CVD_X_OUT;
			if (out_seg) {
				x.out_segment = out_seg->id;
				x.out_offset = (uint64_t)((const uint8_t *)out - out_seg->base);
			} else if (out_part) {
				x.out_segment = s->id;
				x.out_offset = in_part;
			} else { /* an empty result: the caller's own block of the input */
				seg *o = in_seg ? in_seg : s;
				x.out_segment = o->id;
				x.out_offset = f.offset + own_start * esize;
			}
		}
	}
	if (!shm) {
		f.data = (const uint8_t *)call->buf;
		f.data_len = in_bytes;
	}
	plen = payload_len(&f, &x);
	prefix_len = CVD_HEADER_SIZE + plen - (shm ? 0 : in_bytes);
	if (plen == (size_t)-1 || plen > c->info.max_frame) {
		set_err(err, CVD_E_INVALID, "%s: the call's frame would be %lu bytes, over the daemon's max_frame "
			"%lu (%lu per-rank counts)", fn, (unsigned long)plen, (unsigned long)c->info.max_frame,
			(unsigned long)x.ncounts);
		goto fail;
	}
	if (prefix_len > sizeof pre_stack) {
		if (!(heap = (uint8_t *)malloc(prefix_len))) {
			set_err(err, CVD_E_NOMEM, "%s: no memory for a %lu-byte frame", fn, (unsigned long)prefix_len);
			goto fail;
		}
		pre = heap;
	}
	if (!(r = new_req(c, CVD_T_CALL_OK, err)))
		goto fail;
	r->user = 1;
	r->call_bytes = in_bytes + out_bytes;
	if (named) {
		if (!(r->name = (char *)malloc(name_len + 1))) {
			set_err(err, CVD_E_NOMEM, "%s: no memory for a request", fn);
			free(r);
			goto fail;
		}
		memcpy(r->name, name, name_len + 1);
	}
	f.id = r->id;
	if (!shm) {
		r->inline_call = 1;
		r->copy_back = (uint8_t *)(has_out ? out : call->buf);
		r->nbytes = has_out ? out_bytes : in_bytes;
	} else if (s) {
		if (in_part)
			memcpy(s->base, call->buf, in_part);
		r->scratch = s;
		if (has_out ? out_part != 0 : 1) {
			r->copy_back = (uint8_t *)(has_out ? out : call->buf);
			r->scratch_off = has_out ? in_part : 0;
			r->nbytes = has_out ? out_part : in_bytes;
		}
	}
	iov[0].iov_base = pre;
	iov[0].iov_len = encode_prefix(&f, &x, pre, plen);
	if (!shm && in_bytes) {
		iov[1].iov_base = call->buf;
		iov[1].iov_len = in_bytes;
		niov = 2;
	}
	if (submit(c, r, iov, niov, -1, err) != 0) {
		unlink_req(c, r);
		if (r->scratch)
			r->scratch->busy = 0;
		free(r->name);
		free(r);
		free(heap);
		return NULL;
	}
	free(heap);
	return r;
fail:
	if (s)
		s->busy = 0;
	free(heap);
	return NULL;
}

cvd_request *cvd_call_async(cvd_client *c, const cvd_call *call, cvd_error *err)
{
	return start_call(c, call, NULL, NULL, NULL, "cvd_call_async", err);
}

cvd_request *cvd_call_async_opts(cvd_client *c, const cvd_call *call, void *out, const uint64_t *counts,
				 const cvd_call_opts *opts, cvd_error *err)
{
	return start_call(c, call, out, counts, opts, "cvd_call_async_opts", err);
}

/* The checks of the functions of one op: a reduce op and dtype that
 * reduce (avg and scale factors only on floats); scale factors only on
 * reductions. */
static int check_args(const char *fn, int reduces, cvd_dtype dtype, cvd_op op, const cvd_call_opts *opts,
		      cvd_error *err)
{
	int scale = opts && ((opts->prescale != 0 && opts->prescale != 1) ||
			     (opts->postscale != 0 && opts->postscale != 1));
	if (cvd_dtype_size(dtype) == 0) {
		set_err(err, CVD_E_INVALID, "%s: unknown dtype code %d", fn, (int)dtype);
		return -1;
	}
	if (!reduces) {
		if (scale) {
			set_err(err, CVD_E_INVALID, "%s: prescale and postscale apply to reductions only", fn);
			return -1;
		}
		return 0;
	}
	if (op < CVD_SUM || op > CVD_AVG || dtype == CVD_BYTES) {
		set_err(err, CVD_E_INVALID, "%s: needs a numeric dtype (not bytes) and sum, prod, max, min or avg, "
			"not %s of %s", fn, reduce_name(op), dtype_name(dtype));
		return -1;
	}
	if ((op == CVD_AVG || scale) && !is_float(dtype)) {
		set_err(err, CVD_E_INVALID, "%s: %s needs a float dtype (float16, bfloat16, float32 or float64), "
			"not %s", fn, op == CVD_AVG ? "avg" : "prescale and postscale", dtype_name(dtype));
		return -1;
	}
	if (scale && op != CVD_SUM && op != CVD_AVG) {
		set_err(err, CVD_E_INVALID, "%s: prescale and postscale need sum or avg, not %s", fn,
			reduce_name(op));
		return -1;
	}
	return 0;
}

/* One call of op by the function fn; vform: counts are required. */
static cvd_request *one_op(cvd_client *c, const char *fn, cvd_collective op, const void *buf, size_t count,
			   void *out, const uint64_t *counts, int vform, cvd_dtype dtype, cvd_op reduce,
			   uint32_t root, const cvd_call_opts *opts, cvd_error *err)
{
	cvd_call call;
	int reduces = op == CVD_ALLREDUCE || op == CVD_REDUCE || op == CVD_REDUCE_SCATTER;
	if (check_args(fn, reduces, dtype, reduce, opts, err) != 0)
		return NULL;
	if (vform && !counts) {
		set_err(err, CVD_E_INVALID, "%s: NULL counts (one per rank of the world)", fn);
		return NULL;
	}
	memset(&call, 0, sizeof call);
	call.op = op;
	call.dtype = dtype;
	call.reduce = reduces ? reduce : CVD_OP_NONE;
	call.root = root;
	call.buf = (void *)(uintptr_t)buf; /* read only, for the ops that write to out */
	call.count = count;
	return start_call(c, &call, out, counts, opts, fn, err);
}

static int sync_of(cvd_request *r, cvd_error *err)
{
	if (!r)
		return err ? err->code : CVD_E_INVALID;
	return cvd_wait(r, -1, err);
}

cvd_request *cvd_allreduce_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype,
				 cvd_op op, cvd_error *err)
{
	return one_op(c, "cvd_allreduce", CVD_ALLREDUCE, buf, count, NULL, NULL, 0, dtype, op, 0, NULL, err);
}

cvd_request *cvd_allreduce_opts_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
				      const cvd_call_opts *opts, cvd_error *err)
{
	return one_op(c, "cvd_allreduce", CVD_ALLREDUCE, buf, count, NULL, NULL, 0, dtype, op, 0, opts, err);
}

int cvd_allreduce_opts(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
		       const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_allreduce_opts_async(c, buf, count, dtype, op, opts, err), err);
}

cvd_request *cvd_allgather_async(cvd_client *c, const void *send, void *recv, size_t count, cvd_dtype dtype,
				 const cvd_call_opts *opts, cvd_error *err)
{
	return one_op(c, "cvd_allgather", CVD_ALLGATHER, send, count, recv, NULL, 0, dtype, CVD_OP_NONE, 0, opts,
		      err);
}

int cvd_allgather(cvd_client *c, const void *send, void *recv, size_t count, cvd_dtype dtype,
		  const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_allgather_async(c, send, recv, count, dtype, opts, err), err);
}

cvd_request *cvd_allgatherv_async(cvd_client *c, const void *send, size_t count, void *recv,
				  const uint64_t *counts, cvd_dtype dtype, const cvd_call_opts *opts,
				  cvd_error *err)
{
	return one_op(c, "cvd_allgatherv", CVD_ALLGATHER, send, count, recv, counts, 1, dtype, CVD_OP_NONE, 0, opts,
		      err);
}

int cvd_allgatherv(cvd_client *c, const void *send, size_t count, void *recv, const uint64_t *counts,
		   cvd_dtype dtype, const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_allgatherv_async(c, send, count, recv, counts, dtype, opts, err), err);
}

cvd_request *cvd_reduce_scatter_async(cvd_client *c, const void *send, void *recv, size_t count,
				      cvd_dtype dtype, cvd_op op, const cvd_call_opts *opts, cvd_error *err)
{
	return one_op(c, "cvd_reduce_scatter", CVD_REDUCE_SCATTER, send, count, recv, NULL, 0, dtype, op, 0, opts,
		      err);
}

int cvd_reduce_scatter(cvd_client *c, const void *send, void *recv, size_t count, cvd_dtype dtype,
		       cvd_op op, const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_reduce_scatter_async(c, send, recv, count, dtype, op, opts, err), err);
}

cvd_request *cvd_reduce_scatterv_async(cvd_client *c, const void *send, size_t count, void *recv,
				       const uint64_t *counts, cvd_dtype dtype, cvd_op op,
				       const cvd_call_opts *opts, cvd_error *err)
{
	return one_op(c, "cvd_reduce_scatterv", CVD_REDUCE_SCATTER, send, count, recv, counts, 1, dtype, op, 0,
		      opts, err);
}

int cvd_reduce_scatterv(cvd_client *c, const void *send, size_t count, void *recv, const uint64_t *counts,
			cvd_dtype dtype, cvd_op op, const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_reduce_scatterv_async(c, send, count, recv, counts, dtype, op, opts, err), err);
}

cvd_request *cvd_reduce_async(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
			      uint32_t root, const cvd_call_opts *opts, cvd_error *err)
{
	return one_op(c, "cvd_reduce", CVD_REDUCE, buf, count, NULL, NULL, 0, dtype, op, root, opts, err);
}

int cvd_reduce(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op, uint32_t root,
	       const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_reduce_async(c, buf, count, dtype, op, root, opts, err), err);
}

/* ------------------------------------------------------------------ 16-bit floats */

static uint32_t f32_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, sizeof u);
	return u;
}

static float bits_f32(uint32_t u)
{
	float x;
	memcpy(&x, &u, sizeof x);
	return x;
}

uint16_t cvd_f32_to_bf16(float x)
{
	uint32_t u = f32_bits(x);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, make it quiet */
		return (uint16_t)((u >> 16) | 0x0040u);
	/* round to nearest even at bit 16; a carry moves into the exponent,
	 * up to infinity */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float cvd_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t cvd_f32_to_f16(float x)
{
	uint32_t u = f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, m, r, rem, half;
	unsigned shift;
	if (a > 0x7f800000u) /* NaN: quiet, the payload's top bits kept */
		return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
	if (a >= 0x477ff000u) /* 65520 and up (and infinity): to infinity */
		return (uint16_t)(sign | 0x7c00u);
	if (a >= 0x38800000u) { /* 2^-14 and up: a normal float16 */
		m = a - 0x38000000u; /* exponent rebiased from 127 to 15 */
		m += 0xfffu + ((m >> 13) & 1u);
		return (uint16_t)(sign | (m >> 13));
	}
	if (a < 0x33000000u) /* below 2^-25, half the smallest subnormal: to zero */
		return (uint16_t)sign;
	/* a subnormal float16: the value in units of 2^-24, rounded */
	m = (a & 0x7fffffu) | 0x800000u;
	shift = 126u - (a >> 23); /* 14..24 */
	r = m >> shift;
	rem = m & ((1u << shift) - 1u);
	half = 1u << (shift - 1u);
	if (rem > half || (rem == half && (r & 1u)))
		r++;
	return (uint16_t)(sign | r);
}

float cvd_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
	if (e == 0x1f)
		return bits_f32(sign | 0x7f800000u | (m << 13));
	if (e)
		return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
	if (!m)
		return bits_f32(sign);
	e = 113; /* a subnormal: normalize */
	while (!(m & 0x400u)) {
		m <<= 1;
		e--;
	}
	return bits_f32(sign | (e << 23) | ((m & 0x3ffu) << 13));
}

int cvd_wait(cvd_request *req, int64_t timeout_ms, cvd_error *err)
{
	int rc;
	if (!req) {
		set_err(err, CVD_E_INVALID, "cvd_wait: NULL request");
		return CVD_E_INVALID;
	}
	rc = wait_req(req, timeout_ms, err);
	if (rc == CVD_E_WAIT_TIMEOUT && !req->done)
		return rc;
	free_req(req);
	return rc;
}

int cvd_test(cvd_request *req)
{
	if (!req->done && req->c && !req->c->broken)
		progress(req->c, now_ms(), 0, NULL);
	return req->done;
}

uint32_t cvd_request_generation(const cvd_request *req) { return req->generation; }
uint64_t cvd_request_seq(const cvd_request *req) { return req->seq; }

void cvd_request_free(cvd_request *req)
{
	if (req && req->c && !req->done) {
		req->orphan = 1; /* the reply is still due: it frees the request */
		req->user = 0;
		return;
	}
	free_req(req);
}

int cvd_call_sync(cvd_client *c, const cvd_call *call, cvd_error *err)
{
	cvd_request *r = cvd_call_async(c, call, err);
	if (!r)
		return err ? err->code : CVD_E_INVALID;
	return cvd_wait(r, -1, err);
}

int cvd_call_sync_opts(cvd_client *c, const cvd_call *call, void *out, const uint64_t *counts,
		       const cvd_call_opts *opts, cvd_error *err)
{
	return sync_of(cvd_call_async_opts(c, call, out, counts, opts, err), err);
}

int cvd_allreduce(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, cvd_op op,
		  cvd_error *err)
{
	cvd_request *r = cvd_allreduce_async(c, buf, count, dtype, op, err);
	if (!r)
		return err ? err->code : CVD_E_INVALID;
	return cvd_wait(r, -1, err);
}

int cvd_broadcast(cvd_client *c, void *buf, size_t count, cvd_dtype dtype, uint32_t root,
		  cvd_error *err)
{
	cvd_call call;
	memset(&call, 0, sizeof call);
	call.op = CVD_BROADCAST;
	call.dtype = dtype;
	call.root = root;
	call.buf = buf;
	call.count = count;
	return cvd_call_sync(c, &call, err);
}

int cvd_barrier(cvd_client *c, cvd_error *err)
{
	cvd_call call;
	memset(&call, 0, sizeof call);
	call.op = CVD_BARRIER;
	return cvd_call_sync(c, &call, err);
}

char *cvd_status(cvd_client *c, size_t *len, cvd_error *err)
{
	cvd_frame f;
	cvd_request *r;
	char *json;
	memset(&f, 0, sizeof f);
	f.type = CVD_T_STATUS;
	if (control_request(c, &f, CVD_T_STATUS_OK, -1, &r, err) != 0)
		return NULL;
	json = r->json;
	if (len)
		*len = r->json_len;
	r->json = NULL;
	free_req(r);
	return json;
}
