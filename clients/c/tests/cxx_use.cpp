// Built and run by `make test` with the C++ compiler, linked against
// libcollectived.so: "usable from C++" means the header's extern "C" names
// resolve to the library's symbols, not only that the header parses as C++.
#include <cstdio>
#include <cstring>
#include <vector>

#include "collectived.h"

static int fail(const char *what, const cvd_error &err)
{
	std::fprintf(stderr, "C++ use: %s (%s)\n", what, err.message);
	return 1;
}

int main()
{
	cvd_error err;
	std::memset(&err, 0, sizeof err);

	// A CALL frame through the codec: encode, decode, compare.
	const float data[2] = {1.5f, -2.0f};
	cvd_frame f;
	std::memset(&f, 0, sizeof f);
	f.type = CVD_T_CALL;
	f.id = 7;
	f.op = CVD_ALLREDUCE;
	f.dtype = CVD_FLOAT32;
	f.reduce = CVD_SUM;
	f.count = 2;
	f.data = reinterpret_cast<const uint8_t *>(data);
	f.data_len = sizeof data;
	std::vector<uint8_t> buf(cvd_frame_encode(&f, nullptr, 0));
	if (buf.empty() || cvd_frame_encode(&f, buf.data(), buf.size()) != buf.size())
		return fail("cvd_frame_encode", err);
	cvd_frame g;
	if (cvd_frame_decode(buf.data(), buf.size(), CVD_PRE_HELLO_MAX_FRAME, &g, &err) != 0)
		return fail("cvd_frame_decode", err);
	if (g.type != CVD_T_CALL || g.id != 7 || g.count != 2 || g.data_len != sizeof data ||
	    std::memcmp(g.data, data, sizeof data) != 0)
		return fail("decoded CALL differs from the encoded one", err);

	// Version 3: a CALL with its extension, and the 16-bit float helpers.
	const uint64_t counts[2] = {2, 0};
	cvd_call_ext x;
	std::memset(&x, 0, sizeof x);
	x.xflags = CVD_X_COUNTS;
	x.ncounts = 2;
	x.counts = counts;
	f.op = CVD_ALLGATHER;
	f.reduce = CVD_OP_NONE;
	f.flags = CVD_CALL_EXT;
	std::vector<uint8_t> ext(cvd_frame_encode_ext(&f, &x, nullptr, 0));
	cvd_call_ext y;
	if (ext.empty() || cvd_frame_encode_ext(&f, &x, ext.data(), ext.size()) != ext.size() ||
	    cvd_frame_decode_ext(ext.data(), ext.size(), CVD_PRE_HELLO_MAX_FRAME, 3, &g, &y, &err) != 0 ||
	    y.ncounts != 2 || cvd_call_ext_count(&y, 0) != 2)
		return fail("CALL with counts", err);
	if (cvd_f32_to_bf16(1.0f) != 0x3f80 || cvd_f16_to_f32(cvd_f32_to_f16(-2.5f)) != -2.5f)
		return fail("16-bit float helpers", err);

	// A socket that does not exist: a named error, no crash.
	cvd_options o;
	cvd_options_init(&o);
	o.connect_timeout_ms = 1000;
	cvd_client *c = cvd_connect("/nonexistent/collectived.sock", &o, &err);
	if (c != nullptr || err.code != CVD_E_CONNECT ||
	    std::strcmp(cvd_strerror(err.code), "CONNECT") != 0 ||
	    std::strstr(err.message, "/nonexistent/collectived.sock") == nullptr)
		return fail("cvd_connect to a missing socket", err);
	std::printf("C++ use: codec, version-3 extension, 16-bit floats and connect error OK\n");
	return 0;
}
