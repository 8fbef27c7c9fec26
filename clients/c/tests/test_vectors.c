/* The C codec against clients/testdata/vectors.txt (format: README.md there). */
#define _POSIX_C_SOURCE 200809L
#include <math.h> /* signbit */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../collectived.h"
#include "check.h"

typedef struct blob {
	uint8_t *p;
	size_t n;
} blob;

static int unhex(const char *s, size_t len, blob *out)
{
	size_t i;
	if (len % 2)
		return -1;
	out->n = len / 2;
	out->p = (uint8_t *)malloc(out->n + 1);
	if (!out->p)
		return -1;
	for (i = 0; i < out->n; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out->p[i] = (uint8_t)v;
	}
	return 0;
}

static void tohex(const uint8_t *p, size_t n, char *out)
{
	size_t i;
	for (i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", p[i]);
	out[2 * n] = '\0';
}

/* A list field of a decoded CALL's extension (dims, counts) in the
 * vectors' text form: "l" and the decimals, comma-separated. Returns 0 if
 * the key is not a list of this frame. */
static int get_list(const cvd_frame *f, const cvd_call_ext *x, const char *k, char *out, size_t cap)
{
	size_t n = 0, i, len;
	if (f->type != CVD_T_CALL || !(f->flags & CVD_CALL_EXT))
		return 0;
	if (strcmp(k, "dims") == 0)
		n = x->ndim;
	else if (strcmp(k, "counts") == 0 && (x->xflags & CVD_X_COUNTS))
		n = x->ncounts;
	else
		return 0;
	len = (size_t)snprintf(out, cap, "l");
	for (i = 0; i < n && len < cap; i++)
		len += (size_t)snprintf(out + len, cap - len, "%s%llu", i ? "," : "",
					(unsigned long long)(k[0] == 'd' ? x->dims[i] : cvd_call_ext_count(x, (uint32_t)i)));
	return 1;
}

/* A float field of a decoded CALL's extension (prescale, postscale). */
static int get_float(const cvd_frame *f, const cvd_call_ext *x, const char *k, double *d)
{
	if (f->type != CVD_T_CALL || !(f->flags & CVD_CALL_EXT) || !(x->xflags & CVD_X_SCALE))
		return 0;
	if (strcmp(k, "prescale") == 0)
		*d = x->prescale;
	else if (strcmp(k, "postscale") == 0)
		*d = x->postscale;
	else
		return 0;
	return 1;
}

/* A field of a decoded frame: an integer, or bytes. Returns 0 if the key
 * does not apply to the frame's type. */
static int get_field(const cvd_frame *f, const cvd_call_ext *x, const char *k, int *is_int, int64_t *sv,
		     uint64_t *uv, const uint8_t **bp, size_t *bn)
{
	int hok = f->type == CVD_T_HELLO_OK;
	*is_int = 1;
	*sv = 0;
#define U(name, val) if (strcmp(k, name) == 0) { *uv = (uint64_t)(val); *sv = (int64_t)(val); return 1; }
#define B(name, ptr, len) if (strcmp(k, name) == 0) { *is_int = 0; *bp = (ptr); *bn = (len); return 1; }
	U("id", f->id);
	U("frame_flags", f->frame_flags);
	if (f->type == CVD_T_HELLO) {
		B("magic", (const uint8_t *)f->magic, 4);
		U("version", f->version);
		U("flags", f->flags);
		if (strcmp(k, "local_rank") == 0) { *sv = f->local_rank; *uv = (uint64_t)(int64_t)f->local_rank; return 1; }
		U("pid", f->pid);
		B("job", f->job, f->job_len);
		B("label", f->label, f->label_len);
	}
	if (hok) {
		U("version", f->info.version);
		U("world_rank", f->info.world_rank);
		U("world_size", f->info.world_size);
		U("node_rank", f->info.node_rank);
		U("node_count", f->info.node_count);
		U("local_rank", f->info.local_rank);
		U("local_size", f->info.local_size);
		U("inline_limit", f->info.inline_limit);
		U("max_frame", f->info.max_frame);
		U("max_in_flight", f->info.max_in_flight);
		U("generation", f->info.generation);
		U("shm_quota", f->info.shm_quota);
		U("timeout_ms", f->info.timeout_ms);
		if (f->version >= 3)
			U("first_call_timeout_ms", f->size); /* where cvd_frame keeps it */
	}
	U("size", f->size); /* ALLOC, REGISTER, ALLOC_OK, REGISTER_OK, LANE_OK */
	U("segment", f->segment);
	if (f->type == CVD_T_CALL) {
		U("op", f->op);
		U("dtype", f->dtype);
		U("reduce", f->reduce);
		U("flags", f->flags);
		U("root", f->root);
		U("count", f->count);
		B("name", f->name, f->name_len);
		U("offset", f->offset);
		if (f->flags & CVD_CALL_EXT) {
			U("xflags", x->xflags);
			if (x->xflags & CVD_X_OUT) {
				U("out_segment", x->out_segment);
				U("out_offset", x->out_offset);
			}
		}
		B("data", f->data, f->data_len);
	}
	U("generation", f->generation);
	U("seq", f->seq);
	B("result", f->data, f->data_len);
	B("json", f->data, f->data_len);
	U("code", f->code);
	B("message", f->data, f->data_len);
#undef U
#undef B
	return 0;
}

/* Set a field on a frame (and its CALL extension x) being built from the
 * vector's fields; list fields keep their numbers in *nums (malloc'd). */
static int set_field(cvd_frame *f, cvd_call_ext *x, const char *k, const char *v, blob *keep,
		     uint64_t **nums)
{
	uint64_t u = 0;
	int64_t s = 0;
	int hok = f->type == CVD_T_HELLO_OK;
	if (v[0] == 'l') { /* dims, counts */
		const char *p = v + 1;
		size_t n = 0, cap = 8;
		uint64_t *a = (uint64_t *)malloc(cap * sizeof *a);
		if (!a)
			return -1;
		while (*p) {
			char *end;
			if (n == cap) {
				uint64_t *b = (uint64_t *)realloc(a, 2 * cap * sizeof *a);
				if (!b) {
					free(a);
					return -1;
				}
				a = b;
				cap *= 2;
			}
			a[n++] = strtoull(p, &end, 10);
			p = *end == ',' ? end + 1 : end;
			if (end == p && *p) {
				free(a);
				return -1;
			}
		}
		*nums = a;
		if (strcmp(k, "dims") == 0) {
			size_t i;
			if (n > CVD_MAX_NDIM)
				return -1;
			x->ndim = (uint8_t)n;
			for (i = 0; i < n; i++)
				x->dims[i] = a[i];
		} else if (strcmp(k, "counts") == 0) {
			x->ncounts = (uint32_t)n;
			x->counts = a;
		} else
			return -1;
		return 0;
	}
	if (v[0] == 'f') { /* prescale, postscale: strtod reads the decimal back exactly */
		double d = strtod(v + 1, NULL);
		if (strcmp(k, "prescale") == 0)
			x->prescale = d;
		else if (strcmp(k, "postscale") == 0)
			x->postscale = d;
		else
			return -1;
		return 0;
	}
	if (v[0] == 'x') {
		if (unhex(v + 1, strlen(v + 1), keep) != 0)
			return -1;
	} else if (v[0] == '-') {
		s = strtoll(v, NULL, 10);
		u = (uint64_t)s;
	} else {
		u = strtoull(v, NULL, 10);
		s = (int64_t)u;
	}
#define IS(name) (strcmp(k, name) == 0)
	if (IS("id")) f->id = u;
	else if (IS("frame_flags")) f->frame_flags = (uint8_t)u;
	else if (IS("magic")) memcpy(f->magic, keep->p, 4);
	else if (IS("version")) { f->version = (uint16_t)u; f->info.version = (uint32_t)u; }
	else if (IS("flags")) f->flags = (uint16_t)u;
	else if (IS("local_rank") && !hok) f->local_rank = (int32_t)s;
	else if (IS("pid")) f->pid = (uint32_t)u;
	else if (IS("job")) { f->job = keep->p; f->job_len = keep->n; }
	else if (IS("label")) { f->label = keep->p; f->label_len = keep->n; }
	else if (IS("world_rank")) f->info.world_rank = (uint32_t)u;
	else if (IS("world_size")) f->info.world_size = (uint32_t)u;
	else if (IS("node_rank")) f->info.node_rank = (uint32_t)u;
	else if (IS("node_count")) f->info.node_count = (uint32_t)u;
	else if (IS("local_rank")) f->info.local_rank = (uint32_t)u;
	else if (IS("local_size")) f->info.local_size = (uint32_t)u;
	else if (IS("inline_limit")) f->info.inline_limit = (uint32_t)u;
	else if (IS("max_frame")) f->info.max_frame = (uint32_t)u;
	else if (IS("max_in_flight")) f->info.max_in_flight = (uint32_t)u;
	else if (IS("generation")) { f->info.generation = (uint32_t)u; f->generation = (uint32_t)u; }
	else if (IS("shm_quota")) f->info.shm_quota = u;
	else if (IS("timeout_ms")) f->info.timeout_ms = u;
	else if (IS("first_call_timeout_ms") && hok) f->size = u;
	else if (IS("size")) f->size = u;
	else if (IS("segment")) f->segment = (uint32_t)u;
	else if (IS("op")) f->op = (uint8_t)u;
	else if (IS("dtype")) f->dtype = (uint8_t)u;
	else if (IS("reduce")) f->reduce = (uint8_t)u;
	else if (IS("root")) f->root = (uint32_t)u;
	else if (IS("count")) f->count = u;
	else if (IS("name")) { f->name = keep->p; f->name_len = keep->n; }
	else if (IS("offset")) f->offset = u;
	else if (IS("xflags")) x->xflags = (uint8_t)u;
	else if (IS("out_segment")) x->out_segment = (uint32_t)u;
	else if (IS("out_offset")) x->out_offset = u;
	else if (IS("seq")) f->seq = u;
	else if (IS("code")) f->code = (uint16_t)u;
	else if (IS("data") || IS("result") || IS("json") || IS("message")) {
		f->data = keep->p;
		f->data_len = keep->n;
	} else
		return -1;
#undef IS
	return 0;
}

static uint8_t type_code(const char *name)
{
	int t;
	for (t = 0; t < 256; t++) {
		const char *n = cvd_frame_type_name((uint8_t)t);
		if (n && strcmp(n, name) == 0)
			return (uint8_t)t;
	}
	return 0;
}

/* The value of key in a vector's seventh column ("k=v;k=v"), or NULL. */
static const char *context_value(const char *context, const char *key, char *buf, size_t cap)
{
	size_t kl = strlen(key);
	const char *p = context;
	while (p && *p) {
		const char *end = strchr(p, ';');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		if (n > kl && strncmp(p, key, kl) == 0 && p[kl] == '=') {
			snprintf(buf, cap, "%.*s", (int)(n - kl - 1), p + kl + 1);
			return buf;
		}
		p = end ? end + 1 : NULL;
	}
	return NULL;
}

/* The connection's protocol version a vector is decoded in: its context's
 * connection_version, else the newest. */
static unsigned vector_version(const char *context)
{
	char buf[16];
	const char *v = context_value(context, "connection_version", buf, sizeof buf);
	return v ? (unsigned)strtoul(v, NULL, 10) : (unsigned)CVD_PROTOCOL_VERSION;
}

static int nvalid_ext, nrefused, ninvalid_ctx, nvalid_named;

static void test_valid(const char *name, const char *fd, const char *hexs, char *fields, const char *context)
{
	blob raw, keep[32];
	uint64_t *nums[4] = {NULL, NULL, NULL, NULL};
	cvd_frame f, g;
	cvd_call_ext x, gx;
	cvd_error err;
	char *tok, *save = NULL, buf[64];
	size_t nkeep = 0, nnums = 0, n, i;
	uint8_t out[8192];
	char hexout[16400];
	unsigned version = vector_version(context);
	memset(keep, 0, sizeof keep);
	if (unhex(hexs, strlen(hexs), &raw) != 0) {
		CHECK(0, "%s: bad hex in vector", name);
		return;
	}
	memset(&err, 0, sizeof err);
	CHECK(cvd_frame_decode_ext(raw.p, raw.n, CVD_PRE_HELLO_MAX_FRAME, version, &f, &x, &err) == 0,
	      "%s: decode failed: %s", name, err.message);
	if (f.type == CVD_T_CALL && (f.flags & CVD_CALL_EXT))
		nvalid_ext++;
	if (f.type == CVD_T_CALL && (f.flags & CVD_CALL_NAMED))
		nvalid_named++;
	if (context_value(context, "refused", buf, sizeof buf))
		nrefused++;
	memset(&g, 0, sizeof g);
	memset(&gx, 0, sizeof gx);
	for (tok = strtok_r(fields, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
		char *eq = strchr(tok, '=');
		const char *k = tok, *v;
		int is_int;
		int64_t sv;
		uint64_t uv;
		const uint8_t *bp = NULL;
		size_t bn = 0;
		if (!eq) {
			CHECK(0, "%s: field without '=': %s", name, tok);
			continue;
		}
		*eq = '\0';
		v = eq + 1;
		if (strcmp(k, "type") == 0) {
			CHECK(cvd_frame_type_name(f.type) && strcmp(cvd_frame_type_name(f.type), v) == 0,
			      "%s: type %s, want %s", name, cvd_frame_type_name(f.type), v);
			g.type = type_code(v);
			continue;
		}
		if (v[0] == 'l' || v[0] == 'f') { /* the extension's lists and floats */
			char got[2048];
			double d = 0, want;
			if (v[0] == 'l') {
				CHECK(get_list(&f, &x, k, got, sizeof got) && strcmp(got, v) == 0,
				      "%s: %s = %s, want %s", name, k, got, v);
			} else {
				want = strtod(v + 1, NULL);
				CHECK(get_float(&f, &x, k, &d) && memcmp(&d, &want, sizeof d) == 0,
				      "%s: %s = %.17g, want %s (bit for bit)", name, k, d, v + 1);
			}
			if (nnums < 4)
				CHECK(set_field(&g, &gx, k, v, NULL, &nums[nnums++]) == 0, "%s: cannot set %s", name, k);
			continue;
		}
		if (!get_field(&f, &x, k, &is_int, &sv, &uv, &bp, &bn)) {
			CHECK(0, "%s: decoder has no field %s", name, k);
			continue;
		}
		if (is_int) {
			if (v[0] == '-')
				CHECK(sv == strtoll(v, NULL, 10), "%s: %s = %lld, want %s", name, k, (long long)sv, v);
			else
				CHECK(uv == strtoull(v, NULL, 10), "%s: %s = %llu, want %s", name, k,
				      (unsigned long long)uv, v);
		} else {
			char h[600];
			if (bn * 2 + 1 > sizeof h || v[0] != 'x')
				CHECK(0, "%s: %s: unexpected bytes field", name, k);
			else {
				tohex(bp, bn, h);
				CHECK(strcmp(h, v + 1) == 0, "%s: %s = x%s, want %s", name, k, h, v);
			}
		}
		if (nkeep < 32)
			CHECK(set_field(&g, &gx, k, v, &keep[nkeep++], NULL) == 0, "%s: cannot set %s", name, k);
	}
	/* the frames an fd travels with (SCM_RIGHTS): this client passes one with
	 * REGISTER and gets one with ALLOC_OK and LANE_OK */
	CHECK(strcmp(fd, (g.type == CVD_T_ALLOC_OK || g.type == CVD_T_REGISTER ||
			  g.type == CVD_T_LANE_OK) ? "1" : "0") == 0,
	      "%s: vector's fd column %s disagrees with the frame type", name, fd);
	/* encode from the vector's own fields, compare with the vector's bytes */
	n = cvd_frame_encode_ext(&g, &gx, out, sizeof out);
	CHECK(n == raw.n, "%s: encoded %lu bytes, want %lu", name, (unsigned long)n, (unsigned long)raw.n);
	if (n == raw.n) {
		tohex(out, n, hexout);
		CHECK(strcmp(hexout, hexs) == 0, "%s: encoded\n  %s\nwant\n  %s", name, hexout, hexs);
	}
	for (i = 0; i < nkeep; i++)
		free(keep[i].p);
	for (i = 0; i < nnums; i++)
		free(nums[i]);
	free(raw.p);
}

static void test_invalid(const char *name, const char *hexs, const char *error, const char *context)
{
	blob raw;
	cvd_frame f;
	cvd_call_ext x;
	cvd_error err;
	const char *want = strncmp(error, "error=", 6) == 0 ? error + 6 : error;
	unsigned version = vector_version(context);
	if (unhex(hexs, strlen(hexs), &raw) != 0) {
		CHECK(0, "%s: bad hex in vector", name);
		return;
	}
	memset(&err, 0, sizeof err);
	if (version != CVD_PROTOCOL_VERSION) {
		/* the same bytes are a valid frame on a connection of the newest version */
		ninvalid_ctx++;
		CHECK(cvd_frame_decode_ext(raw.p, raw.n, CVD_PRE_HELLO_MAX_FRAME, CVD_PROTOCOL_VERSION, &f, &x, &err) == 0,
		      "%s: not valid on a version-%d connection either: %s", name, CVD_PROTOCOL_VERSION, err.message);
	}
	CHECK(cvd_frame_decode_ext(raw.p, raw.n, CVD_PRE_HELLO_MAX_FRAME, version, &f, &x, &err) == CVD_E_PROTOCOL,
	      "%s: decoding an invalid frame succeeded", name);
	CHECK(strcmp(err.check, want) == 0, "%s: failed check %s (%s), want %s", name, err.check,
	      err.message, want);
	CHECK(strncmp(err.message, want, strlen(want)) == 0, "%s: message %s does not start with %s",
	      name, err.message, want);
	free(raw.p);
}

/* Codec rules that no shared vector pins. */
static void test_extra_codec(void)
{
	static const uint8_t data[8] = {0};
	static const uint8_t longname[300] = {0};
	uint8_t buf[512];
	cvd_frame f, g;
	cvd_error err;
	size_t n;
	memset(&f, 0, sizeof f);
	f.type = CVD_T_CALL;
	f.id = 3;
	f.op = CVD_ALLREDUCE;
	f.dtype = 10; /* no dtype has this code */
	f.reduce = CVD_SUM;
	f.count = 2;
	f.data = data;
	f.data_len = sizeof data;
	n = cvd_frame_encode(&f, buf, sizeof buf);
	CHECK(n == 16 + 17 + 8, "CALL with unknown dtype encodes to %lu bytes", (unsigned long)n);
	CHECK(cvd_frame_decode(buf, n, 4096, &g, &err) == CVD_E_PROTOCOL && strcmp(err.check, "bad_dtype") == 0,
	      "unknown dtype: check %s", err.check);
	f.count = 0;
	f.data_len = 0;
	n = cvd_frame_encode(&f, buf, sizeof buf);
	CHECK(cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && g.dtype == 10, "unknown dtype, count 0: %s",
	      err.message);
	f.name = longname;
	f.name_len = sizeof longname;
	CHECK(cvd_frame_encode(&f, buf, sizeof buf) == 0, "a 300-byte name was encoded");
	f.name_len = 255;
	n = cvd_frame_encode(&f, buf, 8);
	CHECK(n == 16 + 17 + 255, "size query for a too small buffer: %lu", (unsigned long)n);
	CHECK(strcmp(cvd_strerror(CVD_E_MISMATCH), "MISMATCH") == 0 &&
	      strcmp(cvd_strerror(CVD_E_WAIT_TIMEOUT), "WAIT_TIMEOUT") == 0 &&
	      strcmp(cvd_strerror(999), "UNKNOWN") == 0, "cvd_strerror names");
}

/* HELLO_OK's layout is its version's: errors name the version, and a
 * version whose layout is unknown neither decodes nor encodes. */
static void test_hello_ok_versions(void)
{
	uint8_t buf[128];
	cvd_frame f, g;
	cvd_error err;
	size_t n;
	memset(&f, 0, sizeof f);
	f.type = CVD_T_HELLO_OK;
	f.id = 1;
	f.version = 3;
	f.info.version = 3;
	f.info.world_size = f.info.node_count = f.info.local_size = 1;
	f.info.inline_limit = 1024;
	f.info.max_frame = 4096;
	f.info.max_in_flight = 4;
	f.info.timeout_ms = 1000;
	f.size = 60000; /* first_call_timeout_ms */
	n = cvd_frame_encode(&f, buf, sizeof buf);
	CHECK(n == 16 + 68, "HELLO_OK v3 encodes to %lu bytes, want 84", (unsigned long)n);
	memset(&err, 0, sizeof err);
	CHECK(cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && g.size == 60000 && g.info.timeout_ms == 1000,
	      "HELLO_OK v3 round trip: %s, first call %llu", err.message, (unsigned long long)g.size);
	/* 60 bytes claiming version 3 */
	buf[0] = 60;
	CHECK(cvd_frame_decode(buf, 16 + 60, 4096, &g, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "payload_length") == 0 &&
	      strstr(err.message, "HELLO_OK payload is 60 bytes, must be 68 in protocol version 3"),
	      "v3 HELLO_OK of 60 bytes: %s", err.message);
	/* 68 bytes claiming version 2 */
	buf[0] = 68;
	buf[16] = 2;
	CHECK(cvd_frame_decode(buf, 16 + 68, 4096, &g, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "payload_length") == 0 &&
	      strstr(err.message, "HELLO_OK payload is 68 bytes, must be 60 in protocol version 2"),
	      "v2 HELLO_OK of 68 bytes: %s", err.message);
	/* version 4: the layout of 3 */
	buf[16] = 4;
	CHECK(cvd_frame_decode(buf, 16 + 68, 4096, &g, &err) == 0 && g.version == 4 && g.size == 60000,
	      "v4 HELLO_OK: %s", err.message);
	buf[16] = 5;
	CHECK(cvd_frame_decode(buf, 16 + 68, 4096, &g, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "bad_version") == 0 &&
	      strstr(err.message, "HELLO_OK is in protocol version 5, whose layout this client does not know "
			      "(it speaks 1 to 4)"),
	      "v5 HELLO_OK: %s", err.message);
	buf[0] = 1;
	CHECK(cvd_frame_decode(buf, 16 + 1, 4096, &g, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "payload_length") == 0 && strstr(err.message, "too short for the version"),
	      "1-byte HELLO_OK: %s", err.message);
	/* the older layouts leave first_call_timeout_ms out */
	f.version = 2;
	f.info.version = 2;
	n = cvd_frame_encode(&f, buf, sizeof buf);
	CHECK(n == 16 + 60 && cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && g.size == 0,
	      "HELLO_OK v2: %lu bytes, first call %llu", (unsigned long)n, (unsigned long long)g.size);
	f.version = 4;
	n = cvd_frame_encode(&f, buf, sizeof buf);
	CHECK(n == 16 + 68 && cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && g.size == 60000,
	      "HELLO_OK v4: %lu bytes, first call %llu", (unsigned long)n, (unsigned long long)g.size);
	f.version = 5;
	CHECK(cvd_frame_encode(&f, buf, sizeof buf) == 0, "a HELLO_OK of version 5 was encoded");
}

/* NAMED (version 4): what the checks of each version say of it, and
 * that it travels with every other flag. */
static void test_named_codec(void)
{
	static const float data[1] = {1};
	uint8_t buf[256];
	cvd_frame f, g;
	cvd_call_ext x, y;
	cvd_error err;
	size_t n;
	memset(&f, 0, sizeof f);
	memset(&x, 0, sizeof x);
	f.type = CVD_T_CALL;
	f.id = 5;
	f.op = CVD_ALLREDUCE;
	f.dtype = CVD_FLOAT32;
	f.reduce = CVD_SUM;
	f.flags = CVD_CALL_NAMED;
	f.count = 1;
	f.name = (const uint8_t *)"layer3.w";
	f.name_len = 8;
	f.data = (const uint8_t *)data;
	f.data_len = sizeof data;
	n = cvd_frame_encode(&f, buf, sizeof buf);
	CHECK(n == 16 + 17 + 8 + 4 && buf[16 + 3] == CVD_CALL_NAMED, "named CALL: %lu bytes, flags 0x%02x",
	      (unsigned long)n, buf[16 + 3]);
	memset(&err, 0, sizeof err);
	CHECK(cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && g.flags == CVD_CALL_NAMED && g.name_len == 8,
	      "named CALL decodes as on the newest connection: %s", err.message);
	CHECK(cvd_frame_decode_ext(buf, n, 4096, 3, &g, &y, &err) == CVD_E_PROTOCOL && strcmp(err.check, "bad_flags") == 0 &&
	      strstr(err.message, "CALL flag NAMED (0x04) needs protocol version 4; this connection speaks 3"),
	      "NAMED on version 3: %s", err.message);
	/* with EXT on version 2 the extension is named first */
	f.flags = CVD_CALL_NAMED | CVD_CALL_EXT;
	x.ndim = 1;
	x.dims[0] = 1;
	n = cvd_frame_encode_ext(&f, &x, buf, sizeof buf);
	CHECK(n == 16 + 17 + 8 + 12 + 4 && cvd_frame_decode_ext(buf, n, 4096, 0, &g, &y, &err) == 0 &&
	      y.ndim == 1 && (g.flags & CVD_CALL_NAMED), "named CALL with a shape: %s", err.message);
	CHECK(cvd_frame_decode_ext(buf, n, 4096, 2, &g, &y, &err) == CVD_E_PROTOCOL &&
	      strstr(err.message, "CALL flag EXT (0x02) needs protocol version 3; this connection speaks 2"),
	      "NAMED and EXT on version 2: %s", err.message);
	/* bit 3 is defined in no version, and the encoder refuses it */
	buf[16 + 3] = 0x08;
	CHECK(cvd_frame_decode_ext(buf, n, 4096, 0, &g, &y, &err) == CVD_E_PROTOCOL &&
	      strstr(err.message, "CALL flags 0x08 not defined"), "flag 0x08: %s", err.message);
	f.flags = 0x08;
	CHECK(cvd_frame_encode(&f, buf, sizeof buf) == 0, "a CALL with flag 0x08 was encoded");
}

/* The CALL extension's rules that no vector pins: what the plain
 * functions do with it, a shape of more than 8 dimensions, the messages. */
static void test_ext_codec(void)
{
	static const uint64_t counts[3] = {1, 2, 3};
	static const float data[2] = {1, 2};
	uint8_t buf[512];
	cvd_frame f, g;
	cvd_call_ext x, y;
	cvd_error err;
	size_t n;
	memset(&f, 0, sizeof f);
	memset(&x, 0, sizeof x);
	f.type = CVD_T_CALL;
	f.id = 9;
	f.op = CVD_ALLGATHER;
	f.dtype = CVD_FLOAT32;
	f.flags = CVD_CALL_EXT;
	f.count = 2;
	f.data = (const uint8_t *)data;
	f.data_len = sizeof data;
	x.ndim = 1;
	x.dims[0] = 2;
	x.xflags = CVD_X_COUNTS;
	x.ncounts = 3;
	x.counts = counts;
	CHECK(cvd_frame_encode(&f, buf, sizeof buf) == 0, "a CALL with EXT encoded without its extension");
	n = cvd_frame_encode_ext(&f, &x, buf, sizeof buf);
	CHECK(n == 16 + 17 + 4 + 8 + 8 + 24 + 8, "CALL with shape and counts: %lu bytes", (unsigned long)n);
	/* the plain decoder checks the extension and drops it; flags show it */
	memset(&err, 0, sizeof err);
	CHECK(cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && (g.flags & CVD_CALL_EXT) && g.data_len == 8,
	      "plain decode of a CALL with EXT: %s", err.message);
	CHECK(cvd_frame_decode_ext(buf, n, 4096, 0, &g, &y, &err) == 0 && y.ndim == 1 && y.dims[0] == 2 &&
	      y.ncounts == 3 && cvd_call_ext_count(&y, 2) == 3 && y.counts == NULL,
	      "decode of a CALL with EXT: %s", err.message);
	/* a decoded extension re-encodes from the frame's counts */
	CHECK(cvd_frame_encode_ext(&g, &y, buf + 256, 256) == n && memcmp(buf, buf + 256, n) == 0,
	      "re-encoding a decoded extension");
	CHECK(cvd_frame_decode_ext(buf, n, 4096, 2, &g, &y, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "bad_flags") == 0 &&
	      strstr(err.message, "CALL flag EXT (0x02) needs protocol version 3; this connection speaks 2"),
	      "EXT on version 2: %s", err.message);
	/* nine dimensions: a shape no call has */
	x.xflags = 0;
	x.ndim = 9;
	CHECK(cvd_frame_encode_ext(&f, &x, buf, sizeof buf) == 0, "a shape of 9 dimensions was encoded");
	x.ndim = 8;
	n = cvd_frame_encode_ext(&f, &x, buf, sizeof buf);
	CHECK(n == 16 + 17 + 4 + 64 + 8, "8 dimensions: %lu bytes", (unsigned long)n);
	buf[16 + 17] = 9;
	buf[0] += 8; /* and a ninth dimension's bytes */
	memmove(buf + 16 + 17 + 4 + 64 + 8, buf + 16 + 17 + 4 + 64, 8);
	CHECK(cvd_frame_decode_ext(buf, n + 8, 4096, 3, &g, &y, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "bad_ndim") == 0 && strstr(err.message, "CALL shape has 9 dimensions, at most 8"),
	      "ndim 9: %s", err.message);
	/* OUT on an inline call has no block: encoded as the decoder reads it */
	x.ndim = 0;
	x.xflags = CVD_X_OUT;
	x.out_segment = 5;
	n = cvd_frame_encode_ext(&f, &x, buf, sizeof buf);
	CHECK(n == 16 + 17 + 4 + 8 && cvd_frame_decode_ext(buf, n, 4096, 3, &g, &y, &err) == 0 &&
	      y.xflags == CVD_X_OUT && y.out_segment == 0 && g.data_len == 8,
	      "OUT on an inline call: %lu bytes, %s", (unsigned long)n, err.message);
	/* dtype names in an old connection's BAD_REQUEST are the daemon's; the
	 * codec knows the sizes of the new ones */
	CHECK(cvd_dtype_size(CVD_FLOAT16) == 2 && cvd_dtype_size(CVD_BFLOAT16) == 2 && cvd_dtype_size(CVD_INT8) == 1 &&
	      cvd_dtype_size(CVD_UINT8) == 1 && cvd_dtype_size(10) == 0, "element sizes of the version-3 dtypes");
}

/* The nearest value of a 16-bit float type to x, found by search (not by
 * the bit arithmetic of the client): to_f32 widens a code, top is the
 * code of infinity. Ties go to the even code; past the largest finite
 * value, what would round beyond it is infinity. */
static uint16_t nearest16(float x, float (*to_f32)(uint16_t), uint16_t top)
{
	uint16_t sign = signbit(x) ? 0x8000 : 0, lo = 0, hi = top, below, above;
	double a = x < 0 ? -(double)x : (double)x, dlo, dhi;
	if (a >= (double)to_f32(top))
		return sign | top;
	/* the largest code whose value is <= a (codes of positive values are ordered) */
	while (hi - lo > 1) {
		uint16_t mid = (uint16_t)(lo + (hi - lo) / 2);
		if ((double)to_f32(mid) <= a)
			lo = mid;
		else
			hi = mid;
	}
	below = lo;
	above = (uint16_t)(lo + 1);
	dlo = a - (double)to_f32(below);
	/* the step past the largest finite value: as if the exponent went on */
	dhi = above == top ? 2 * (double)to_f32(below) - (double)to_f32((uint16_t)(below - 1)) - a
			   : (double)to_f32(above) - a;
	if (dlo < dhi || (dlo == dhi && !(below & 1)))
		return sign | below;
	return sign | above;
}

static float u32f(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

static void test_half_floats(void)
{
	static const struct { float x; uint16_t f16, bf16; } known[] = {
		{1.0f, 0x3c00, 0x3f80}, {-2.0f, 0xc000, 0xc000}, {65504.0f, 0x7bff, 0x4780},
		{65519.0f, 0x7bff, 0x4780}, {65520.0f, 0x7c00, 0x4780}, {5.9604645e-08f, 0x0001, 0x3380},
		{2.9802322e-08f, 0x0000, 0x3300}, /* 2^-25: a tie, to even zero */
		{1.00048828125f, 0x3c00, 0x3f80}, /* 1 + 2^-11: a tie, to even */
		{1.00146484375f, 0x3c02, 0x3f80}, /* 1 + 3 * 2^-11: a tie, up to even */
		{1.01171875f, 0x3c0c, 0x3f82},     /* 1 + 2^-7 + 2^-8: bfloat16's tie, up to even */
		{1.00390625f, 0x3c04, 0x3f80},     /* 1 + 2^-8: bfloat16's tie, down to even */
		{3.4028235e38f, 0x7c00, 0x7f80},   /* the largest binary32 rounds to infinity */
		{3.3895314e38f, 0x7c00, 0x7f7f},   /* the largest bfloat16 */
	};
	size_t i, bad16 = 0, badbf = 0, n = 0;
	uint32_t h, u;
	for (i = 0; i < sizeof known / sizeof known[0]; i++) {
		CHECK(cvd_f32_to_f16(known[i].x) == known[i].f16, "f16(%.9g) = 0x%04x, want 0x%04x", known[i].x,
		      cvd_f32_to_f16(known[i].x), known[i].f16);
		CHECK(cvd_f32_to_bf16(known[i].x) == known[i].bf16, "bf16(%.9g) = 0x%04x, want 0x%04x", known[i].x,
		      cvd_f32_to_bf16(known[i].x), known[i].bf16);
		CHECK(cvd_f32_to_f16(-known[i].x) == (known[i].f16 ^ 0x8000) &&
		      cvd_f32_to_bf16(-known[i].x) == (known[i].bf16 ^ 0x8000), "narrowing -(%.9g)", known[i].x);
	}
	CHECK(cvd_f16_to_f32(0x0001) == 5.9604645e-08f && cvd_f16_to_f32(0x03ff) == 6.0975552e-05f &&
	      cvd_f16_to_f32(0x7bff) == 65504.0f && cvd_f16_to_f32(0xc000) == -2.0f && cvd_bf16_to_f32(0x3f82) == 1.015625f,
	      "known widenings");
	/* every 16-bit code widens exactly and narrows back to itself (a NaN to a NaN) */
	for (h = 0; h < 0x10000; h++) {
		float a = cvd_f16_to_f32((uint16_t)h), b = cvd_bf16_to_f32((uint16_t)h);
		int nan16 = (h & 0x7c00) == 0x7c00 && (h & 0x3ff), nanbf = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
		if (nan16 ? !(a != a) || (cvd_f32_to_f16(a) & 0x7e00) != 0x7e00 : cvd_f32_to_f16(a) != h)
			bad16++;
		if (nanbf ? !(b != b) || (cvd_f32_to_bf16(b) & 0x7fc0) != 0x7fc0 : cvd_f32_to_bf16(b) != h)
			badbf++;
	}
	CHECK(bad16 == 0 && badbf == 0, "round trips of every 16-bit code: %lu float16, %lu bfloat16 wrong",
	      (unsigned long)bad16, (unsigned long)badbf);
	/* narrowing against a search for the nearest, on binary32 values spread
	 * over every exponent (the low bits varied to land on and near ties) */
	bad16 = badbf = 0;
	for (u = 0; u < 0x7f800000u; u += 0x1f3bu + (u >> 24)) {
		uint32_t k;
		for (k = 0; k < 3; k++) {
			uint32_t v = k == 0 ? u : k == 1 ? (u & ~0x1fffu) | 0x1000u : (u & ~0xffffu) | 0x8000u;
			float x = u32f(v);
			n++;
			if (cvd_f32_to_f16(x) != nearest16(x, cvd_f16_to_f32, 0x7c00))
				bad16++;
			if (cvd_f32_to_bf16(x) != nearest16(x, cvd_bf16_to_f32, 0x7f80))
				badbf++;
		}
	}
	CHECK(n > 500000 && bad16 == 0 && badbf == 0, "narrowing %lu values: %lu float16, %lu bfloat16 not nearest-even",
	      (unsigned long)n, (unsigned long)bad16, (unsigned long)badbf);
	CHECK(cvd_f32_to_f16(u32f(0x7f800000u)) == 0x7c00 && cvd_f32_to_bf16(u32f(0xff800000u)) == 0xff80 &&
	      (cvd_f32_to_f16(u32f(0x7f800001u)) & 0x7e00) == 0x7e00 && (cvd_f32_to_bf16(u32f(0xffc00000u)) & 0xffc0) == 0xffc0,
	      "infinities and NaNs");
}

int run_vector_tests(const char *path)
{
	test_hello_ok_versions();
	test_named_codec();
	test_extra_codec();
	test_ext_codec();
	test_half_floats();
	FILE *fp = fopen(path, "r");
	char line[8192];
	int nvalid = 0, ninvalid = 0;
	if (!fp) {
		CHECK(0, "cannot open %s", path);
		return -1;
	}
	while (fgets(line, sizeof line, fp)) {
		char *col[7], *save = NULL, *t;
		int n = 0;
		line[strcspn(line, "\r\n")] = '\0';
		if (line[0] == '#' || line[0] == '\0')
			continue;
		for (t = strtok_r(line, "\t", &save); t && n < 7; t = strtok_r(NULL, "\t", &save))
			col[n++] = t;
		if (n != 6 && n != 7) {
			CHECK(0, "malformed vector line (%d columns)", n);
			continue;
		}
		if (n == 6)
			col[6] = "";
		if (strcmp(col[0], "valid") == 0) {
			test_valid(col[1], col[3], col[4], col[5], col[6]);
			nvalid++;
		} else {
			test_invalid(col[1], col[4], col[5], col[6]);
			ninvalid++;
		}
	}
	fclose(fp);
	CHECK(nvalid > 30 && ninvalid > 20, "only %d valid and %d invalid vectors", nvalid, ninvalid);
	/* Version 3: CALLs with the extension, refused requests, frames invalid
	 * only on an older connection. */
	CHECK(nvalid_ext >= 20 && nrefused >= 20 && ninvalid_ctx >= 2,
	      "only %d valid CALLs with EXT, %d refused, %d invalid by their connection's version",
	      nvalid_ext, nrefused, ninvalid_ctx);
	/* Version 4: named calls of every op, NAMED on older connections. */
	CHECK(nvalid_named >= 8 && ninvalid_ctx >= 4, "only %d valid named CALLs, %d invalid by their connection's version",
	      nvalid_named, ninvalid_ctx);
	printf("vectors: %d valid (%d with EXT, %d named, %d refused requests), %d invalid checked\n", nvalid,
	       nvalid_ext, nvalid_named, nrefused, ninvalid);
	return 0;
}
