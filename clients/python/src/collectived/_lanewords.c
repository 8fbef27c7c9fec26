/* The lane's shared words, for the Python client (docs/PROTOCOL.md, LANE).
 *
 * Python has no atomic loads or stores on shared memory, nor a fence
 * between a store and a load, and the lane's handshake needs both: "store
 * my seq, then load the other side's parked word" must not be reordered,
 * or each side can miss the other and a call waits for its timeout. This
 * module is those operations, as sequentially consistent 32-bit atomics
 * (the C client's lane_load and lane_store), a poll of one word with the
 * GIL released, and the two halves of a small call on the client's short
 * way: put_call, its frame built from the caller's array and put on the
 * lane, and take_call_ok, its wait and, when the answer is the plain one
 * expected, its taking, each in one step (in Python each of those steps
 * costs microseconds, and a small call is little else). The counts of
 * calls put and answers taken live here too, moved by those steps. What
 * the protocol means, and every check that reports an error, lives in the
 * client in Python.
 *
 * It is optional: built when a C compiler and Python's headers are there,
 * and without it the client speaks protocol version 1 and has no lane.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* The lane's layout and the frames put_call and take_call_ok know
 * (docs/PROTOCOL.md: LANE, the frame header, CALL, CALL_OK). */
#define L_C2D_SEQ 0
#define L_D2C_SEQ 128
#define L_D_PARKED 192
#define L_C_PARKED 256
#define L_C2D 4096
#define L_D2C 8192
#define L_SLOT 4096
#define HDR 16
#define CALL_FIXED 17
#define SEG_REF 16 /* a shared-memory CALL's segment, reserved and offset */
#define CALL_SHM 0x01
#define CALL_EXT 0x02 /* version 3: the extension follows the name */
#define EXT_HEAD 4    /* the extension's ndim, xflags and reserved */
#define MAX_DIMS 8
#define T_CALL 0x05
#define T_CALL_OK 0x85
#define DT_FLOAT32 1
#define DT_FLOAT64 2
#define DT_INT32 3
#define DT_INT64 4
#define DT_BYTES 5

typedef struct {
	PyObject_HEAD
	Py_buffer view; /* the mapping, held while open */
	int open;
	int polling; /* polls under way: close waits for them to end */
	int closing;
	/* The client's counts of calls put in the c2d slot and answers taken
	 * from the d2c slot. Kept here so that put_call and take_call_ok move
	 * them in the same step as what they count: a signal handled between
	 * two Python statements (KeyboardInterrupt) cannot part a count from
	 * its frame, and the client can tell afterwards what was done. */
	unsigned int own;
	unsigned int seen;
} Words;

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The word at off, checked: an aligned u32 inside the mapping. */
static uint32_t *word(Words *self, Py_ssize_t off)
{
	if (!self->open) {
		PyErr_SetString(PyExc_ValueError, "lane is closed");
		return NULL;
	}
	if (off < 0 || off % 4 != 0 || off + 4 > self->view.len) {
		PyErr_Format(PyExc_ValueError, "lane word offset %zd is not an aligned u32 inside %zd bytes",
			     off, self->view.len);
		return NULL;
	}
	return (uint32_t *)((char *)self->view.buf + off);
}

static void release(Words *self)
{
	if (self->open) {
		self->open = 0;
		PyBuffer_Release(&self->view);
	}
}

static int Words_init(Words *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"buffer", NULL};
	PyObject *obj;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &obj))
		return -1;
	if (self->open) {
		PyErr_SetString(PyExc_ValueError, "lane already open");
		return -1;
	}
	if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return -1;
	self->open = 1;
	if ((uintptr_t)self->view.buf % 64 != 0) {
		release(self);
		PyErr_SetString(PyExc_ValueError, "lane mapping is not 64-byte aligned");
		return -1;
	}
	return 0;
}

static void Words_dealloc(Words *self)
{
	release(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Words_load(Words *self, PyObject *arg)
{
	Py_ssize_t off = PyLong_AsSsize_t(arg);
	uint32_t *w;
	if (off == -1 && PyErr_Occurred())
		return NULL;
	if (!(w = word(self, off)))
		return NULL;
	return PyLong_FromUnsignedLong(__atomic_load_n(w, __ATOMIC_SEQ_CST));
}

static PyObject *Words_store(Words *self, PyObject *args)
{
	Py_ssize_t off;
	unsigned long v;
	uint32_t *w;
	if (!PyArg_ParseTuple(args, "nk", &off, &v))
		return NULL;
	if (v > UINT32_MAX) {
		PyErr_Format(PyExc_OverflowError, "lane word value %lu does not fit in 32 bits", v);
		return NULL;
	}
	if (!(w = word(self, off)))
		return NULL;
	__atomic_store_n(w, (uint32_t)v, __ATOMIC_SEQ_CST);
	Py_RETURN_NONE;
}

/* watch loads *w until it is not old or spin_ns have passed, yielding the
 * CPU between loads (on a machine with fewer CPUs than pollers, the
 * process being waited for may need this one); the GIL must be released.
 * Returns the last value loaded. */
static uint32_t watch(const uint32_t *w, uint32_t old, long long spin)
{
	int64_t end = now_ns() + (spin > 0 ? spin : 0);
	uint32_t v;
	for (;;) {
		v = __atomic_load_n(w, __ATOMIC_SEQ_CST);
		if (v != old || now_ns() >= end)
			return v;
		sched_yield();
	}
}

/* poll(off, old, spin_ns): watch the word at off, with the GIL released
 * so that the client's reader thread runs. Returns the last value loaded. */
static PyObject *Words_poll(Words *self, PyObject *args)
{
	Py_ssize_t off;
	unsigned long old;
	long long spin;
	uint32_t *w, v;
	if (!PyArg_ParseTuple(args, "nkL", &off, &old, &spin))
		return NULL;
	if (!(w = word(self, off)))
		return NULL;
	self->polling++;
	Py_BEGIN_ALLOW_THREADS
	v = watch(w, (uint32_t)old, spin);
	Py_END_ALLOW_THREADS
	self->polling--;
	if (self->closing && self->polling == 0)
		release(self);
	return PyLong_FromUnsignedLong(v);
}

/* watch_answer is the client's side of the lane's parking: say it does
 * not sleep (c_parked 0), watch d2c_seq for up to spin_ns, say it sleeps
 * again (c_parked 1) and look once more, so that the daemon either sees
 * the sleeper and rings the socket or is seen. Returns d2c_seq as last
 * loaded. The GIL must be released. */
static uint32_t watch_answer(uint32_t *parked, const uint32_t *seqw, uint32_t seen, long long spin)
{
	__atomic_store_n(parked, 0, __ATOMIC_SEQ_CST);
	watch(seqw, seen, spin);
	__atomic_store_n(parked, 1, __ATOMIC_SEQ_CST);
	return __atomic_load_n(seqw, __ATOMIC_SEQ_CST);
}

/* watch_answer(seen, spin_ns) -> int: the parking above, for a call whose
 * answer the client takes in Python. */
static PyObject *Words_watch_answer(Words *self, PyObject *args)
{
	unsigned long seen;
	long long spin;
	uint32_t *seqw, *parked, n;
	if (!PyArg_ParseTuple(args, "kL", &seen, &spin))
		return NULL;
	if (!(seqw = word(self, L_D2C_SEQ)) || !(parked = word(self, L_C_PARKED)))
		return NULL;
	self->polling++;
	Py_BEGIN_ALLOW_THREADS
	n = watch_answer(parked, seqw, (uint32_t)seen, spin);
	Py_END_ALLOW_THREADS
	self->polling--;
	if (self->closing && self->polling == 0)
		release(self);
	return PyLong_FromUnsignedLong(n);
}

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static void put_le32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
	p[2] = (unsigned char)(v >> 16);
	p[3] = (unsigned char)(v >> 24);
}

static void put_le64(unsigned char *p, uint64_t v)
{
	put_le32(p, (uint32_t)v);
	put_le32(p + 4, (uint32_t)(v >> 32));
}

/* The wire dtype of a buffer's struct format (the client's _FORMATS), or
 * 0 for one the lane's short way does not take (the client's general path
 * then says what is wrong with it, if anything). */
static int wire_dtype(const char *fmt, Py_ssize_t itemsize)
{
	if (fmt == NULL)
		return itemsize == 1 ? DT_BYTES : 0;
	if (*fmt == '<' || *fmt == '=' || *fmt == '@')
		fmt++;
	if (fmt[0] == '\0' || fmt[1] != '\0')
		return 0;
	switch (fmt[0]) {
	case 'f': return itemsize == 4 ? DT_FLOAT32 : 0;
	case 'd': return itemsize == 8 ? DT_FLOAT64 : 0;
	case 'i': return itemsize == 4 ? DT_INT32 : 0;
	case 'q': return itemsize == 8 ? DT_INT64 : 0;
	case 'l': return itemsize == 4 ? DT_INT32 : itemsize == 8 ? DT_INT64 : 0;
	case 'B': case 'b': case 'c': return itemsize == 1 ? DT_BYTES : 0;
	}
	return 0;
}

/* put_call(rid, op, reduce, root, name, data, numeric, max_data[, scratch,
 * segment, shape]) -> int: a small call's frame, built here and put in the c2d
 * slot, then published as the next call (own + 1, and own moves with it):
 * a CALL of data inline, its dtype and count from data's buffer format,
 * saying first that the client does not sleep (c_parked 0: the caller
 * watches for the answer next, with take_call_ok). In Python building the
 * frame and copying it in take several steps of a microsecond each. With
 * scratch (a writable mapping of the client's segment number segment) the
 * data is copied there instead and the CALL refers to it (SHM, offset 0):
 * the way for data too long for the slot. With shape true (a connection of
 * protocol version 3) a buffer of one dimension or more carries its shape
 * in the CALL extension (EXT, ndim and the dimensions, no other xflags),
 * as the client's encoder writes it.
 *
 * Returns 1 if the daemon sleeps on the socket (the client must then send
 * WAKE), 0 if not, and -1 with nothing put if the call is not one for this
 * short way: data is not a writable C-contiguous buffer of a wire dtype
 * (bytes only if not numeric), is empty, is longer than max_data or than
 * scratch, the name is longer than 255 bytes, the shape has more than 8
 * dimensions, or the frame would not fit the slot. The client's general
 * path takes those, and names what is wrong. */
static PyObject *Words_put_call(Words *self, PyObject *args)
{
	unsigned long root;
	unsigned int segment = 0;
	uint32_t own = (uint32_t)(self->own + 1);
	unsigned long long rid;
	int op, red, numeric, dtype, shm, with_shape = 0, ndim = 0, i;
	const char *name;
	Py_ssize_t name_len, max_data, frame_len, ext_len = 0;
	PyObject *data, *scratch = Py_None;
	Py_buffer view, sv;
	uint32_t *seqw, *parked, *cparked;
	unsigned char *f, *p;
	if (!PyArg_ParseTuple(args, "Kiiky#Opn|OIp", &rid, &op, &red, &root, &name, &name_len, &data, &numeric,
			      &max_data, &scratch, &segment, &with_shape))
		return NULL;
	if (root > UINT32_MAX || op < 0 || op > 255 || red < 0 || red > 255) {
		PyErr_SetString(PyExc_ValueError, "put_call: a field does not fit its wire width");
		return NULL;
	}
	if (!(seqw = word(self, L_C2D_SEQ)) || !(parked = word(self, L_D_PARKED)) || !(cparked = word(self, L_C_PARKED)))
		return NULL;
	if (self->view.len < L_C2D + L_SLOT) {
		PyErr_SetString(PyExc_ValueError, "lane mapping too short for its c2d slot");
		return NULL;
	}
	if (name_len > 255)
		return PyLong_FromLong(-1);
	shm = scratch != Py_None;
	if (shm && PyObject_GetBuffer(scratch, &sv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
		return NULL; /* the client's own segment, not the caller's data: an error */
	if (PyObject_GetBuffer(data, &view, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
		PyErr_Clear();
		if (shm)
			PyBuffer_Release(&sv);
		return PyLong_FromLong(-1);
	}
	dtype = wire_dtype(view.format, view.itemsize);
	if (with_shape && view.ndim > 0) {
		ndim = view.ndim;
		ext_len = EXT_HEAD + 8 * (Py_ssize_t)ndim;
	}
	frame_len = HDR + CALL_FIXED + name_len + ext_len + (shm ? SEG_REF : view.len);
	if (dtype == 0 || (numeric && dtype == DT_BYTES) || view.len == 0 || view.len > max_data ||
	    ndim > MAX_DIMS || (ndim > 0 && view.shape == NULL) || frame_len > L_SLOT ||
	    (shm && view.len > sv.len)) {
		PyBuffer_Release(&view);
		if (shm)
			PyBuffer_Release(&sv);
		return PyLong_FromLong(-1);
	}
	f = (unsigned char *)self->view.buf + L_C2D;
	put_le32(f, (uint32_t)(frame_len - HDR));
	f[4] = T_CALL;
	f[5] = f[6] = f[7] = 0;
	put_le64(f + 8, rid);
	f[16] = (unsigned char)op;
	f[17] = (unsigned char)dtype;
	f[18] = (unsigned char)red;
	f[19] = (shm ? CALL_SHM : 0) | (ext_len ? CALL_EXT : 0);
	put_le32(f + 20, (uint32_t)root);
	put_le64(f + 24, (uint64_t)(view.len / view.itemsize));
	f[32] = (unsigned char)name_len;
	memcpy(f + HDR + CALL_FIXED, name, name_len);
	p = f + HDR + CALL_FIXED + name_len;
	if (ext_len) {
		/* The extension: ndim, xflags 0, reserved 0, the dimensions. */
		p[0] = (unsigned char)ndim;
		p[1] = p[2] = p[3] = 0;
		for (i = 0; i < ndim; i++)
			put_le64(p + EXT_HEAD + 8 * i, (uint64_t)view.shape[i]);
		p += ext_len;
	}
	if (shm) {
		/* Through the client's scratch segment, from its offset 0. */
		memcpy(sv.buf, view.buf, view.len);
		PyBuffer_Release(&sv);
		put_le32(p, segment);
		put_le32(p + 4, 0);
		put_le64(p + 8, 0);
	} else {
		memcpy(p, view.buf, view.len);
	}
	PyBuffer_Release(&view);
	/* The caller watches for the answer next (take_call_ok): a daemon that
	 * answers before the watch begins need not ring the reader thread. */
	__atomic_store_n(cparked, 0, __ATOMIC_SEQ_CST);
	__atomic_store_n(seqw, own, __ATOMIC_SEQ_CST);
	self->own = own;
	return PyLong_FromLong(__atomic_load_n(parked, __ATOMIC_SEQ_CST) != 0);
}

/* take_call_ok(rid, result, spin_ns) -> (code, generation, seq): a
 * small call's whole wait in one step, the caller's side of the lane:
 * watch_answer past seen, then, if the answer is the plain one expected
 * (the next seq, a CALL_OK for request rid, a result exactly as long as
 * the writable buffer result), it is copied into result, seen moves to it,
 * and code is 1. Anything else that
 * waits is left in the slot, code 2, for the client's own checks (which
 * name what is wrong); 0 if nothing came. The checks here only decide
 * what to leave: the client reports. Reads the slot once into a copy. */
static PyObject *Words_take_call_ok(Words *self, PyObject *args)
{
	uint32_t seen = self->seen;
	unsigned long long rid;
	long long spin;
	Py_buffer res;
	unsigned char copy[L_SLOT];
	uint32_t *seqw, *parked, n = 0, len = 0;
	int code = 0;
	uint32_t gen = 0;
	uint64_t cseq = 0;
	if (!PyArg_ParseTuple(args, "Kw*L", &rid, &res, &spin))
		return NULL;
	if (!(seqw = word(self, L_D2C_SEQ)) || !(parked = word(self, L_C_PARKED)) || self->view.len < L_D2C + L_SLOT) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "lane mapping too short for its d2c slot");
		PyBuffer_Release(&res);
		return NULL;
	}
	self->polling++;
	Py_BEGIN_ALLOW_THREADS
	n = watch_answer(parked, seqw, seen, spin);
	if (n != seen) {
		code = 2;
		memcpy(copy, (const unsigned char *)self->view.buf + L_D2C, HDR);
		len = le32(copy);
		if (n == seen + 1 && copy[4] == T_CALL_OK && copy[5] == 0 && copy[6] == 0 && copy[7] == 0 &&
		    le64(copy + 8) == rid && len >= 16 && len <= L_SLOT - HDR && (Py_ssize_t)(len - 16) == res.len) {
			memcpy(copy + HDR, (const unsigned char *)self->view.buf + L_D2C + HDR, len);
			if (le32(copy + HDR + 4) == 0) {
				gen = le32(copy + HDR);
				cseq = le64(copy + HDR + 8);
				memcpy(res.buf, copy + HDR + 16, len - 16);
				code = 1;
			}
		}
	}
	Py_END_ALLOW_THREADS
	if (code == 1)
		self->seen = seen + 1;
	PyBuffer_Release(&res);
	self->polling--;
	if (self->closing && self->polling == 0)
		release(self);
	return Py_BuildValue("(ikK)", code, (unsigned long)gen, (unsigned long long)cseq);
}

/* close(): give the mapping back (the mmap can be closed then). A poll
 * under way in another thread still reads it: the last one gives it back. */
static PyObject *Words_close(Words *self, PyObject *Py_UNUSED(ignored))
{
	if (self->polling > 0)
		self->closing = 1;
	else
		release(self);
	Py_RETURN_NONE;
}

static PyMethodDef Words_methods[] = {
	{"load", (PyCFunction)Words_load, METH_O, "load(off) -> int: the u32 at off (sequentially consistent)"},
	{"store", (PyCFunction)Words_store, METH_VARARGS, "store(off, v): store the u32 v at off (sequentially consistent)"},
	{"poll", (PyCFunction)Words_poll, METH_VARARGS,
	 "poll(off, old, spin_ns) -> int: load the u32 at off until it is not old or spin_ns passed; the GIL is released"},
	{"watch_answer", (PyCFunction)Words_watch_answer, METH_VARARGS,
	 "watch_answer(seen, spin_ns) -> int: say the client polls, watch d2c_seq until it is not seen or spin_ns "
	 "passed, say it sleeps and look once more; the GIL is released"},
	{"put_call", (PyCFunction)Words_put_call, METH_VARARGS,
	 "put_call(rid, op, reduce, root, name, data, numeric, max_data[, scratch, segment, shape]) -> int: build a "
	 "CALL of data inline (or copied into scratch, the client's segment number segment; with shape, data's shape "
	 "in the CALL extension) in the c2d slot and publish it as "
	 "call own + 1 (own moves); 1 if the daemon sleeps (send WAKE), 0 if not, -1 (nothing put) if "
	 "data is not for this short way"},
	{"take_call_ok", (PyCFunction)Words_take_call_ok, METH_VARARGS,
	 "take_call_ok(rid, result, spin_ns) -> (code, generation, seq): watch for a call's answer past seen and take "
	 "it into result if it is the plain CALL_OK expected (1, seen moves); 2 if something else waits, 0 if nothing came"},
	{"close", (PyCFunction)Words_close, METH_NOARGS, "close(): release the mapping (idempotent)"},
	{NULL, NULL, 0, NULL},
};

static PyMemberDef Words_members[] = {
	{"own", T_UINT, offsetof(Words, own), 0, "calls put in the c2d slot (put_call moves it; the client's other puts too)"},
	{"seen", T_UINT, offsetof(Words, seen), 0, "answers taken from the d2c slot (take_call_ok moves it; the client's other takes too)"},
	{NULL, 0, 0, 0, NULL},
};

static PyTypeObject WordsType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "collectived._lanewords.Words",
	.tp_doc = "Words(buffer): the lane's u32 words in a writable mapping, as atomics",
	.tp_basicsize = sizeof(Words),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Words_init,
	.tp_dealloc = (destructor)Words_dealloc,
	.tp_methods = Words_methods,
	.tp_members = Words_members,
};

static struct PyModuleDef wordsmodule = {
	PyModuleDef_HEAD_INIT, "collectived._lanewords",
	"Sequentially consistent u32 loads and stores on the lane (docs/PROTOCOL.md, LANE).", -1, NULL,
	NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__lanewords(void)
{
	PyObject *m;
	if (PyType_Ready(&WordsType) < 0)
		return NULL;
	m = PyModule_Create(&wordsmodule);
	if (!m)
		return NULL;
	Py_INCREF(&WordsType);
	if (PyModule_AddObject(m, "Words", (PyObject *)&WordsType) < 0) {
		Py_DECREF(&WordsType);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
