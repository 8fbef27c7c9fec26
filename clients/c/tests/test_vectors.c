/* The C codec against clients/testdata/vectors.txt (format: README.md there). */
#define _POSIX_C_SOURCE 200809L
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

/* A field of a decoded frame: an integer, or bytes. Returns 0 if the key
 * does not apply to the frame's type. */
static int get_field(const cvd_frame *f, const char *k, int *is_int, int64_t *sv, uint64_t *uv,
		     const uint8_t **bp, size_t *bn)
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

/* Set a field on a frame being built from the vector's fields. */
static int set_field(cvd_frame *f, const char *k, const char *v, blob *keep)
{
	uint64_t u = 0;
	int64_t s = 0;
	int hok = f->type == CVD_T_HELLO_OK;
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

static void test_valid(const char *name, const char *fd, const char *hexs, char *fields)
{
	blob raw, keep[32];
	cvd_frame f, g;
	cvd_error err;
	char *tok, *save = NULL;
	size_t nkeep = 0, n, i;
	uint8_t out[8192];
	char hexout[16400];
	memset(keep, 0, sizeof keep);
	if (unhex(hexs, strlen(hexs), &raw) != 0) {
		CHECK(0, "%s: bad hex in vector", name);
		return;
	}
	memset(&err, 0, sizeof err);
	CHECK(cvd_frame_decode(raw.p, raw.n, CVD_PRE_HELLO_MAX_FRAME, &f, &err) == 0,
	      "%s: decode failed: %s", name, err.message);
	memset(&g, 0, sizeof g);
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
		if (!get_field(&f, k, &is_int, &sv, &uv, &bp, &bn)) {
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
			CHECK(set_field(&g, k, v, &keep[nkeep++]) == 0, "%s: cannot set %s", name, k);
	}
	/* the frames an fd travels with (SCM_RIGHTS): this client passes one with
	 * REGISTER and gets one with ALLOC_OK and LANE_OK */
	CHECK(strcmp(fd, (g.type == CVD_T_ALLOC_OK || g.type == CVD_T_REGISTER ||
			  g.type == CVD_T_LANE_OK) ? "1" : "0") == 0,
	      "%s: vector's fd column %s disagrees with the frame type", name, fd);
	/* encode from the vector's own fields, compare with the vector's bytes */
	n = cvd_frame_encode(&g, out, sizeof out);
	CHECK(n == raw.n, "%s: encoded %lu bytes, want %lu", name, (unsigned long)n, (unsigned long)raw.n);
	if (n == raw.n) {
		tohex(out, n, hexout);
		CHECK(strcmp(hexout, hexs) == 0, "%s: encoded\n  %s\nwant\n  %s", name, hexout, hexs);
	}
	for (i = 0; i < nkeep; i++)
		free(keep[i].p);
	free(raw.p);
}

static void test_invalid(const char *name, const char *hexs, const char *error)
{
	blob raw;
	cvd_frame f;
	cvd_error err;
	const char *want = strncmp(error, "error=", 6) == 0 ? error + 6 : error;
	if (unhex(hexs, strlen(hexs), &raw) != 0) {
		CHECK(0, "%s: bad hex in vector", name);
		return;
	}
	memset(&err, 0, sizeof err);
	CHECK(cvd_frame_decode(raw.p, raw.n, CVD_PRE_HELLO_MAX_FRAME, &f, &err) == CVD_E_PROTOCOL,
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
	f.dtype = 9;
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
	CHECK(cvd_frame_decode(buf, n, 4096, &g, &err) == 0 && g.dtype == 9, "unknown dtype, count 0: %s",
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
	buf[16] = 4;
	CHECK(cvd_frame_decode(buf, 16 + 68, 4096, &g, &err) == CVD_E_PROTOCOL &&
	      strcmp(err.check, "bad_version") == 0 &&
	      strstr(err.message, "HELLO_OK is in protocol version 4, whose layout this client does not know"),
	      "v4 HELLO_OK: %s", err.message);
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
	CHECK(cvd_frame_encode(&f, buf, sizeof buf) == 0, "a HELLO_OK of version 4 was encoded");
}

int run_vector_tests(const char *path)
{
	test_hello_ok_versions();
	test_extra_codec();
	FILE *fp = fopen(path, "r");
	char line[8192];
	int nvalid = 0, ninvalid = 0;
	if (!fp) {
		CHECK(0, "cannot open %s", path);
		return -1;
	}
	while (fgets(line, sizeof line, fp)) {
		char *col[6], *save = NULL, *t;
		int n = 0;
		line[strcspn(line, "\r\n")] = '\0';
		if (line[0] == '#' || line[0] == '\0')
			continue;
		for (t = strtok_r(line, "\t", &save); t && n < 6; t = strtok_r(NULL, "\t", &save))
			col[n++] = t;
		if (n != 6) {
			CHECK(0, "malformed vector line (%d columns)", n);
			continue;
		}
		if (strcmp(col[0], "valid") == 0) {
			test_valid(col[1], col[3], col[4], col[5]);
			nvalid++;
		} else {
			test_invalid(col[1], col[4], col[5]);
			ninvalid++;
		}
	}
	fclose(fp);
	CHECK(nvalid > 30 && ninvalid > 20, "only %d valid and %d invalid vectors", nvalid, ninvalid);
	printf("vectors: %d valid, %d invalid checked\n", nvalid, ninvalid);
	return 0;
}
