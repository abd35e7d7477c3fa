/* Compiled twins of TideMQ's per-message codec functions (client/protocol/accel.py picks them).

Every function here has a pure-Python twin with the same name, signature and results. A
function handles the common, valid input itself; for anything else (an unusual argument type,
an out-of-range integer, bytes that do not parse, keyword arguments) it calls its twin, which
the Python side registers with set_fallback(). So errors (type and message) are the twin's by
construction, and the compiled code never needs its own error texts.

Rules:
1. Nothing is written to a caller's buffer before every check has passed: a call that falls
   back leaves the buffer as it found it.
2. The public CPython C API only; no library beyond libc (the CRC-32 is our own table code,
   bit-identical to zlib.crc32), so building needs a C compiler and the Python headers only.
*/
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  /* memmem */
#endif
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>  /* T_OBJECT_EX, READONLY: slot descriptors */

static PyObject *fallbacks; /* name -> pure-Python twin */

/* ------------------------------------------------------------------ fallback plumbing */

static PyObject *
fallback(const char *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *fn;
    PyErr_Clear();
    fn = PyDict_GetItemString(fallbacks, name);
    if (fn == NULL) {
        PyErr_Format(PyExc_RuntimeError, "_speedups.%s: no pure-Python twin registered", name);
        return NULL;
    }
    return PyObject_Vectorcall(fn, args, (size_t)nargs, kwnames);
}

static PyObject *
set_fallback(PyObject *self, PyObject *args)
{
    PyObject *name, *fn;
    if (!PyArg_ParseTuple(args, "UO:set_fallback", &name, &fn))
        return NULL;
    if (PyDict_SetItem(fallbacks, name, fn) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* An int (or int subclass) that fits [lo, hi]; 0 on success, -1 (no error set) otherwise. */
static int
as_i64(PyObject *o, long long lo, long long hi, long long *out)
{
    int overflow = 0;
    long long v;
    if (!PyLong_Check(o))
        return -1;
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    if (v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

#define I32_MIN (-2147483647LL - 1)
#define I32_MAX 2147483647LL
#define I64_MIN (-9223372036854775807LL - 1)
#define I64_MAX 9223372036854775807LL

static inline void put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static inline void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)(v >> 8); p[1] = (unsigned char)v;
}

static inline int32_t get32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static inline int16_t get16(const unsigned char *p)
{
    return (int16_t)(((uint16_t)p[0] << 8) | p[1]);
}

/* ------------------------------------------------------------------ CRC-32 (zlib's) */

static uint32_t crc_table[8][256];

static void
crc_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            crc_table[t][n] = crc_table[0][crc_table[t - 1][n] & 0xFF] ^ (crc_table[t - 1][n] >> 8);
}

/* Slicing-by-8 on the inverted CRC state. */
static uint32_t
crc32_table_run(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF]
            ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF]
            ^ crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define CRC_CLMUL 1
static int crc_clmul_ok;  /* the CPU has PCLMULQDQ and SSE4.1: set once by crc_detect() */

/* Carry-less multiplication folding (Intel's "Fast CRC Computation for Generic Polynomials
   Using PCLMULQDQ"; the bit-reflected constants of zlib's polynomial). Takes and returns the
   inverted state, like crc32_table_run; n >= 64 and a multiple of 16. A few times faster
   than the tables on the 1 KiB bodies the store checksums twice per message. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t
crc32_clmul_run(uint32_t crc, const unsigned char *p, size_t n)
{
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5k0 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i mask = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32)), x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    __m128i x0 = k1k2, x5;
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    p += 64;
    n -= 64;
    while (n >= 64) {  /* four lanes of 128 bits, each folded 512 bits forward */
        __m128i x6 = _mm_clmulepi64_si128(x2, x0, 0x00), x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        __m128i x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x5), _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x2, x0, 0x11), x6), _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x3, x0, 0x11), x7), _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x4, x0, 0x11), x8), _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    x0 = k3k4;  /* the four lanes into one, then the 16-byte blocks left */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), x4), x5);
    while (n >= 16) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x1, x0, 0x11), _mm_loadu_si128((const __m128i *)p)), x5);
        p += 16;
        n -= 16;
    }
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);  /* 128 bits to 64 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask), k5k0, 0x00), x2);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, mask), poly, 0x10);  /* Barrett reduction to 32 */
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, mask), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#endif

static void
crc_detect(void)
{
#ifdef CRC_CLMUL
    __builtin_cpu_init();
    crc_clmul_ok = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* Equals zlib.crc32(data, crc): the folding code for whole 16-byte blocks of 64 bytes or
   more when the CPU has it, the tables for the rest. */
static uint32_t
crc32_update(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
#ifdef CRC_CLMUL
    if (crc_clmul_ok && n >= 64) {
        size_t blocks = n & ~(size_t)15;
        crc = crc32_clmul_run(crc, p, blocks);
        p += blocks;
        n -= blocks;
    }
#endif
    return ~crc32_table_run(crc, p, n);
}

/* CRC-32 of a concatenation from the parts' CRCs (zlib's crc32_combine): the store checksums
   a record's body and then the whole record, so the body's bytes are read once, not twice. */
static uint32_t x2n_table[32];  /* x^(2^k) modulo the polynomial */

static uint32_t
multmodp(uint32_t a, uint32_t b)
{
    uint32_t m = 1u << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0)
                break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return p;
}

static void
x2n_init(void)
{
    uint32_t p = 1u << 30;  /* x^1 */
    x2n_table[0] = p;
    for (int n = 1; n < 32; n++)
        x2n_table[n] = p = multmodp(p, p);
}

/* crc32(A + B) from crc1 = crc32(A), crc2 = crc32(B) and len(B). The factor for the last length
   is kept: records of one producer mostly share a body length (the GIL guards the pair). */
static uint32_t
crc32_combine_len(uint32_t crc1, uint32_t crc2, unsigned long long len2)
{
    static unsigned long long last_len = 0;
    static uint32_t last_factor = 1u << 31;  /* x^0: for len2 == 0 */
    if (len2 != last_len) {
        uint32_t p = 1u << 31;
        unsigned long long n = len2;
        for (unsigned k = 3; n; n >>= 1, k++)  /* x^(8 * len2) */
            if (n & 1)
                p = multmodp(x2n_table[k & 31], p);
        last_len = len2;
        last_factor = p;
    }
    return multmodp(last_factor, crc1) ^ crc2;
}

static PyObject *
crc32_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer view;
    long long start = 0;
    uint32_t crc;
    if (nargs < 1 || nargs > 2 || (nargs == 2 && as_i64(args[1], 0, 0xFFFFFFFFLL, &start) < 0)) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0): value must be 0..2**32-1");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    crc = crc32_update((uint32_t)start, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* ------------------------------------------------------------------ record encode */

#define A_BUF 0
#define A_POS 1
#define A_TOPIC 2
#define A_QID 3
#define A_FLAG 4
#define A_QOFF 5
#define A_PHYS 6
#define A_SYSFLAG 7
#define A_BORN_TS 8
#define A_BORN_HOST 9
#define A_STORE_TS 10
#define A_STORE_HOST 11
#define A_RECONSUME 12
#define A_PREP 13
#define A_BODY 14
#define A_PROPS 15
#define A_CRC 16
#define A_TOTAL 17

typedef struct {
    long long pos, qid, flag, qoff, phys, sysflag, born_ts, store_ts, reconsume, prep, total;
    int with_crc;
} enc_args;

static int
parse_enc_ints(PyObject *const *args, Py_ssize_t nargs, enc_args *a)
{
    a->with_crc = 1;
    a->total = 0;
    if (nargs > A_CRC) {
        PyObject *c = args[A_CRC];
        if (c == Py_True || c == Py_False)
            a->with_crc = c == Py_True;
        else
            return -1;
    }
    if (nargs > A_TOTAL && as_i64(args[A_TOTAL], I32_MIN, I32_MAX, &a->total) < 0)
        return -1;
    return (as_i64(args[A_POS], 0, PY_SSIZE_T_MAX, &a->pos) < 0
            || as_i64(args[A_QID], I32_MIN, I32_MAX, &a->qid) < 0
            || as_i64(args[A_FLAG], I32_MIN, I32_MAX, &a->flag) < 0
            || as_i64(args[A_QOFF], I64_MIN, I64_MAX, &a->qoff) < 0
            || as_i64(args[A_PHYS], I64_MIN, I64_MAX, &a->phys) < 0
            || as_i64(args[A_SYSFLAG], I32_MIN, I32_MAX, &a->sysflag) < 0
            || as_i64(args[A_BORN_TS], I64_MIN, I64_MAX, &a->born_ts) < 0
            || as_i64(args[A_STORE_TS], I64_MIN, I64_MAX, &a->store_ts) < 0
            || as_i64(args[A_RECONSUME], I32_MIN, I32_MAX, &a->reconsume) < 0
            || as_i64(args[A_PREP], I64_MIN, I64_MAX, &a->prep) < 0) ? -1 : 0;
}

/* Writes the record; every length and bound was checked by the caller. Returns its size. */
static Py_ssize_t
write_record(unsigned char *out, const enc_args *a, const unsigned char *topic, Py_ssize_t topic_len,
             const unsigned char *born, Py_ssize_t born_len, const unsigned char *store,
             Py_ssize_t store_len, const unsigned char *body, Py_ssize_t body_len,
             const unsigned char *props, Py_ssize_t props_len, long long total)
{
    int v2 = topic_len > 127;
    uint32_t sysflag = ((uint32_t)a->sysflag & ~0x30u) | (born_len == 20 ? 0x10u : 0) | (store_len == 20 ? 0x20u : 0);
    unsigned char *p = out, *body_at;
    uint32_t whole, bcrc = crc32_update(0, body, (size_t)body_len);
    put32(p, (uint32_t)total);
    put32(p + 4, v2 ? 0xDAA320ABu : 0xDAA320A7u);
    put32(p + 8, bcrc & 0x7FFFFFFFu);
    put32(p + 12, (uint32_t)a->qid);
    put32(p + 16, (uint32_t)a->flag);
    put64(p + 20, (uint64_t)a->qoff);
    put64(p + 28, (uint64_t)a->phys);
    put32(p + 36, sysflag);
    put64(p + 40, (uint64_t)a->born_ts);
    p += 48;
    memcpy(p, born, (size_t)born_len);
    p += born_len;
    put64(p, (uint64_t)a->store_ts);
    memcpy(p + 8, store, (size_t)store_len);
    p += 8 + store_len;
    put32(p, (uint32_t)a->reconsume);
    put64(p + 4, (uint64_t)a->prep);
    put32(p + 12, (uint32_t)body_len);
    p += 16;
    body_at = p;
    memcpy(p, body, (size_t)body_len);
    p += body_len;
    if (v2) {
        put16(p, (uint16_t)topic_len);
        p += 2;
    } else {
        *p++ = (unsigned char)topic_len;
    }
    memcpy(p, topic, (size_t)topic_len);
    p += topic_len;
    put16(p, (uint16_t)(props_len + (a->with_crc ? 20 : 0)));
    p += 2;
    memcpy(p, props, (size_t)props_len);
    p += props_len;
    if (a->with_crc) {
        unsigned char *tail = body_at + body_len;
        memcpy(p, "__CRC32#\x01", 9);
        /* up to the trailer: the head, the body (its CRC is known), then the rest */
        whole = crc32_combine_len(crc32_update(0, out, (size_t)(body_at - out)), bcrc,
                                  (unsigned long long)body_len);
        whole = crc32_update(whole, tail, (size_t)(p - tail)) & 0x7FFFFFFFu;
        for (int i = 0; i < 10; i++, whole /= 10)  /* "%010u", least-significant digit first */
            p[9 + i] = (unsigned char)('0' + whole % 10);
        p[19] = 2;
        p += 20;
    }
    return p - out;
}

static PyObject *
encode_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    enc_args a;
    Py_buffer buf, body;
    PyObject *topic, *born, *store, *props, *result = NULL;
    Py_ssize_t topic_len, born_len, store_len, props_len, size;
    long long total;

    if (kwnames != NULL || nargs < 16 || nargs > 18 || parse_enc_ints(args, nargs, &a) < 0)
        return fallback("encode_into", args, nargs, kwnames);
    topic = args[A_TOPIC]; born = args[A_BORN_HOST]; store = args[A_STORE_HOST]; props = args[A_PROPS];
    if (!PyBytes_CheckExact(topic) || !PyBytes_CheckExact(born) || !PyBytes_CheckExact(store)
            || !PyBytes_CheckExact(props))
        return fallback("encode_into", args, nargs, kwnames);
    topic_len = PyBytes_GET_SIZE(topic); born_len = PyBytes_GET_SIZE(born);
    store_len = PyBytes_GET_SIZE(store); props_len = PyBytes_GET_SIZE(props);
    if ((born_len != 8 && born_len != 20) || (store_len != 8 && store_len != 20) || topic_len > 32767
            || props_len + (a.with_crc ? 20 : 0) > 32767)
        return fallback("encode_into", args, nargs, kwnames);
    if (PyObject_GetBuffer(args[A_BODY], &body, PyBUF_SIMPLE) < 0)
        return fallback("encode_into", args, nargs, kwnames);
    if (PyObject_GetBuffer(args[A_BUF], &buf, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&body);
        return fallback("encode_into", args, nargs, kwnames);
    }
    size = 91 + body.len + topic_len + props_len + born_len + store_len - 16
        + (a.with_crc ? 20 : 0) + (topic_len > 127 ? 1 : 0);
    total = a.total ? a.total : size;
    if (body.len > I32_MAX || total > I32_MAX || a.pos > buf.len || size > buf.len - a.pos) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&body);
        return fallback("encode_into", args, nargs, kwnames);
    }
    write_record((unsigned char *)buf.buf + a.pos, &a, (const unsigned char *)PyBytes_AS_STRING(topic),
                 topic_len, (const unsigned char *)PyBytes_AS_STRING(born), born_len,
                 (const unsigned char *)PyBytes_AS_STRING(store), store_len, body.buf, body.len,
                 (const unsigned char *)PyBytes_AS_STRING(props), props_len, total);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&body);
    result = a.total ? Py_NewRef(args[A_TOTAL]) : PyLong_FromSsize_t(size);
    return result;
}

/* ------------------------------------------------------------------ properties */

static PyObject *
decode_replace(const char *p, Py_ssize_t n)
{
    return PyUnicode_DecodeUTF8(p, n, "replace");
}

static PyObject *
decode_properties(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    const char *p, *end;
    PyObject *out;
    if (kwnames != NULL || nargs != 1 || !(PyBytes_CheckExact(args[0]) || PyByteArray_CheckExact(args[0])))
        return fallback("decode_properties", args, nargs, kwnames);
    if (PyBytes_CheckExact(args[0])) {
        p = PyBytes_AS_STRING(args[0]);
        end = p + PyBytes_GET_SIZE(args[0]);
    } else {
        p = PyByteArray_AS_STRING(args[0]);
        end = p + PyByteArray_GET_SIZE(args[0]);
    }
    out = PyDict_New();
    if (out == NULL)
        return NULL;
    /* Split on 0x02, partition on the first 0x01; a pair needs a non-empty name and value
       (which also makes the segment at least 3 characters). ASCII separators end any invalid
       UTF-8 run, so decoding the pieces equals decoding the whole and then splitting. */
    while (p < end) {
        const char *seg_end = memchr(p, 2, (size_t)(end - p));
        const char *sep;
        if (seg_end == NULL)
            seg_end = end;
        sep = memchr(p, 1, (size_t)(seg_end - p));
        if (sep != NULL && sep > p && sep + 1 < seg_end) {
            PyObject *name = decode_replace(p, sep - p);
            PyObject *value = name ? decode_replace(sep + 1, seg_end - sep - 1) : NULL;
            if (value == NULL || PyDict_SetItem(out, name, value) < 0) {
                Py_XDECREF(name);
                Py_XDECREF(value);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(name);
            Py_DECREF(value);
        }
        p = seg_end + 1;
    }
    return out;
}

/* The values of TAGS, KEYS and UNIQ_KEY in raw (name\x01value pairs joined by \x02): the
   first pair of each name, None when absent or empty; one pass over the pairs. 0, or -1 with
   an error set (nothing held). */
static int
named_props(const char *raw, Py_ssize_t n, PyObject **tags, PyObject **keys, PyObject **uniq)
{
    PyObject **out[3] = {tags, keys, uniq};
    const char *span[3] = {NULL, NULL, NULL}, *at = raw, *end = raw + n;
    Py_ssize_t span_len[3] = {0, 0, 0};
    int left = 3, k;
    while (left > 0) {
        const char *pair_end = memchr(at, 2, (size_t)(end - at)), *sep;
        if (pair_end == NULL)
            pair_end = end;
        sep = memchr(at, 1, (size_t)(pair_end - at));
        if (sep != NULL) {
            Py_ssize_t name_len = sep - at;
            k = name_len == 4 && memcmp(at, "TAGS", 4) == 0 ? 0
                : name_len == 4 && memcmp(at, "KEYS", 4) == 0 ? 1
                : name_len == 8 && memcmp(at, "UNIQ_KEY", 8) == 0 ? 2 : -1;
            if (k >= 0 && span[k] == NULL) {
                span[k] = sep + 1;
                span_len[k] = pair_end - sep - 1;
                left--;
            }
        }
        if (pair_end == end)
            break;
        at = pair_end + 1;
    }
    for (k = 0; k < 3; k++) {
        *out[k] = span_len[k] > 0 ? decode_replace(span[k], span_len[k]) : Py_NewRef(Py_None);
        if (*out[k] == NULL) {
            while (--k >= 0)
                Py_CLEAR(*out[k]);
            return -1;
        }
    }
    return 0;
}

/* Java's String.hashCode over the UTF-16 code units of s, as a signed int32. */
static long
java_hash(PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    uint32_t h = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c > 0xFFFF) {
            c -= 0x10000;
            h = 31 * h + (0xD800 + (c >> 10));
            h = 31 * h + (0xDC00 + (c & 0x3FF));
        } else {
            h = 31 * h + c;
        }
    }
    return (long)(int32_t)h;
}

static PyObject *
prop_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *tags, *keys, *uniq;
    const char *raw;
    Py_ssize_t n;
    long code;
    if (kwnames != NULL || nargs != 1 || !PyBytes_CheckExact(args[0]))
        return fallback("prop_fields", args, nargs, kwnames);
    raw = PyBytes_AS_STRING(args[0]);
    n = PyBytes_GET_SIZE(args[0]);
    if (named_props(raw, n, &tags, &keys, &uniq) < 0)
        return NULL;
    code = tags == Py_None ? 0 : java_hash(tags);
    return Py_BuildValue("(NNNl)", tags, keys, uniq, code);
}

/* ------------------------------------------------------------------ batch bodies */

/* Whether any of `marks` (a tuple of bytes, each ending in \x01) occurs in p[0:len]: every
occurrence ends at a \x01, so only the bytes before each \x01 are compared (their first and
last bytes before the whole, since most names share neither with any mark). -1: a mark is not
bytes or does not end in \x01, or there are more than HM_MAX (the caller falls back). */
#define HM_MAX 32
static int
has_mark(const unsigned char *p, Py_ssize_t len, PyObject *marks)
{
    const unsigned char *text[HM_MAX], *at = p, *end = p + len;
    Py_ssize_t size[HM_MAX], nm = PyTuple_GET_SIZE(marks), k;
    int ready = 0;
    while ((at = memchr(at, 1, (size_t)(end - at))) != NULL) {
        Py_ssize_t i = at - p;
        if (!ready) {  /* checked once, at the first \x01 */
            if (nm > HM_MAX)
                return -1;
            for (k = 0; k < nm; k++) {
                PyObject *m = PyTuple_GET_ITEM(marks, k);
                if (!PyBytes_CheckExact(m))
                    return -1;
                size[k] = PyBytes_GET_SIZE(m);
                text[k] = (const unsigned char *)PyBytes_AS_STRING(m);
                if (size[k] == 0 || text[k][size[k] - 1] != 1)
                    return -1;
            }
            ready = 1;
        }
        for (k = 0; k < nm; k++) {
            Py_ssize_t ml = size[k];
            const unsigned char *from = p + i + 1 - ml;
            if (ml <= i + 1 && (ml == 1 || (from[ml - 2] == text[k][ml - 2] && from[0] == text[k][0]))
                    && memcmp(from, text[k], (size_t)ml) == 0)
                return 1;
        }
        at++;
    }
    return 0;
}

/* from_client(raw, cluster[, decoded]): the twin of tidemq.node.system_properties.from_client
   for properties without an owned name (the marks provided as "from_client:owned_marks") and,
   given `decoded`, with one pair per \x01 (what the twin calls clean): the bytes with the
   cluster pair appended. Anything else (an owned name, odd types, keywords): the twin. */
static PyObject *
from_client(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *marks, *decoded, *out;
    const unsigned char *p;
    Py_ssize_t n, c, pairs = 0;
    int sep;
    if (kwnames != NULL || nargs < 2 || nargs > 3 || !PyBytes_CheckExact(args[0])
            || !PyBytes_CheckExact(args[1]))
        return fallback("from_client", args, nargs, kwnames);
    decoded = nargs == 3 ? args[2] : Py_None;
    marks = PyDict_GetItemString(fallbacks, "from_client:owned_marks");
    if ((decoded != Py_None && !PyDict_CheckExact(decoded)) || marks == NULL
            || !PyTuple_CheckExact(marks))
        return fallback("from_client", args, nargs, kwnames);
    p = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    n = PyBytes_GET_SIZE(args[0]);
    if (has_mark(p, n, marks) != 0)
        return fallback("from_client", args, nargs, kwnames);  /* an owned name: the twin strips */
    if (decoded != Py_None) {
        for (Py_ssize_t i = 0; i < n; i++)
            pairs += p[i] == 1;
        if (pairs != PyDict_GET_SIZE(decoded))
            return fallback("from_client", args, nargs, kwnames);
    }
    if (n == 0)
        return Py_NewRef(args[1]);
    c = PyBytes_GET_SIZE(args[1]);
    sep = p[n - 1] != 2;
    out = PyBytes_FromStringAndSize(NULL, n + sep + c);
    if (out == NULL)
        return NULL;
    memcpy(PyBytes_AS_STRING(out), p, (size_t)n);
    if (sep)
        PyBytes_AS_STRING(out)[n] = 2;
    memcpy(PyBytes_AS_STRING(out) + n + sep, PyBytes_AS_STRING(args[1]), (size_t)c);
    return out;
}

/* decode_batch(body, header_props, max_bytes, max_entries[, cluster]): with `cluster`, each
entry's properties are also passed through system_properties.from_client (the cluster pair
appended). A property holding any of the owned marks (provided by the Python side as
"decode_batch:owned_marks") takes the pure twin, which strips; no marks provided: pure. */
static PyObject *
decode_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_buffer view;
    long long max_bytes, max_entries;
    PyObject *mv = NULL, *out = NULL, *hp, *cluster = NULL, *marks = NULL;
    const unsigned char *b;
    Py_ssize_t n, pos = 0, hp_len, cl_len = 0;

    if (kwnames != NULL || (nargs != 4 && nargs != 5) || !PyBytes_CheckExact(args[1])
            || as_i64(args[2], I64_MIN, I64_MAX, &max_bytes) < 0
            || as_i64(args[3], I64_MIN, I64_MAX, &max_entries) < 0)
        return fallback("decode_batch", args, nargs, kwnames);
    if (nargs == 5 && args[4] != Py_None) {
        cluster = args[4];
        marks = PyDict_GetItemString(fallbacks, "decode_batch:owned_marks");
        if (!PyBytes_CheckExact(cluster) || marks == NULL || !PyTuple_CheckExact(marks)
                || has_mark((const unsigned char *)PyBytes_AS_STRING(args[1]),
                            PyBytes_GET_SIZE(args[1]), marks) != 0)
            return fallback("decode_batch", args, nargs, kwnames);
        cl_len = PyBytes_GET_SIZE(cluster);
    }
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return fallback("decode_batch", args, nargs, kwnames);
    hp = args[1];
    hp_len = PyBytes_GET_SIZE(hp);
    b = view.buf;
    n = view.len;
    if (n > max_bytes || n == 0)
        goto slow;
    mv = PyMemoryView_FromObject(args[0]);
    out = mv ? PyList_New(0) : NULL;
    if (out == NULL)
        goto fail;
    while (pos < n) {
        int32_t total, flag, body_len, props_len;
        Py_ssize_t end, b_start, b_end, p_len, extra;
        PyObject *body, *props, *item, *flag_obj;
        char *dst;
        if (PyList_GET_SIZE(out) == max_entries || n - pos < 22)
            goto slow;
        total = get32(b + pos);
        flag = get32(b + pos + 12);
        body_len = get32(b + pos + 16);
        end = pos + total;
        b_start = pos + 20;
        b_end = b_start + body_len;
        if (total < 22 || end > n || body_len < 0 || b_end + 2 > end)
            goto slow;
        props_len = get16(b + b_end);
        if (props_len < 0 || b_end + 2 + props_len != end)
            goto slow;
        p_len = props_len;
        if (marks != NULL && has_mark(b + b_end + 2, p_len, marks) != 0)
            goto slow;  /* an owned name to strip: the pure twin does it */
        extra = hp_len ? hp_len + (p_len && b[end - 1] != 2 ? 1 : 0) : 0;
        if (cluster != NULL) {  /* from_client: a \x02 after the last pair, then the pair */
            int last = hp_len ? PyBytes_AS_STRING(hp)[hp_len - 1] : (p_len ? b[end - 1] : 2);
            extra += cl_len + ((p_len || hp_len) && last != 2 ? 1 : 0);
        }
        props = PyBytes_FromStringAndSize(NULL, p_len + extra);
        if (props == NULL)
            goto fail;
        dst = PyBytes_AS_STRING(props);
        memcpy(dst, b + b_end + 2, (size_t)p_len);
        if (hp_len) {
            if (p_len && b[end - 1] != 2)
                dst[p_len++] = 2;
            memcpy(dst + p_len, PyBytes_AS_STRING(hp), (size_t)hp_len);
            p_len += hp_len;
        }
        if (cluster != NULL) {
            if (p_len && dst[p_len - 1] != 2)
                dst[p_len++] = 2;
            memcpy(dst + p_len, PyBytes_AS_STRING(cluster), (size_t)cl_len);
        }
        body = PySequence_GetSlice(mv, b_start, b_end);
        flag_obj = body ? PyLong_FromLong(flag) : NULL;
        item = flag_obj ? PyTuple_New(3) : NULL;  /* not Py_BuildValue: no format to parse */
        if (item == NULL) {
            Py_XDECREF(flag_obj);
            Py_XDECREF(body);
            Py_DECREF(props);
            goto fail;
        }
        PyTuple_SET_ITEM(item, 0, flag_obj);
        PyTuple_SET_ITEM(item, 1, body);
        PyTuple_SET_ITEM(item, 2, props);
        if (PyList_Append(out, item) < 0) {
            Py_DECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        pos = end;
    }
    Py_DECREF(mv);
    PyBuffer_Release(&view);
    return out;
slow:
    Py_XDECREF(out);
    Py_XDECREF(mv);
    PyBuffer_Release(&view);
    return fallback("decode_batch", args, nargs, kwnames);
fail:
    Py_XDECREF(out);
    Py_XDECREF(mv);
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *
encode_batch_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *seq, *out;
    Py_ssize_t count, size = 0;
    char *dst;
    if (kwnames != NULL || nargs != 1 || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0])))
        return fallback("encode_batch_body", args, nargs, kwnames);  /* iterators: not consumed here */
    seq = args[0];
    count = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < count; i++) {  /* pass 1: check and size */
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i), *body, *props;
        long long flag;
        Py_ssize_t raw_len, entry;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3)
            return fallback("encode_batch_body", args, nargs, kwnames);
        body = PyTuple_GET_ITEM(e, 1);
        props = PyTuple_GET_ITEM(e, 2);
        if (as_i64(PyTuple_GET_ITEM(e, 0), I32_MIN, I32_MAX, &flag) < 0 || !PyBytes_CheckExact(body)
                || !PyUnicode_CheckExact(props) || PyUnicode_AsUTF8AndSize(props, &raw_len) == NULL)
            return fallback("encode_batch_body", args, nargs, kwnames);
        entry = 22 + PyBytes_GET_SIZE(body) + raw_len;
        if (raw_len > 32767 || entry > I32_MAX)
            return fallback("encode_batch_body", args, nargs, kwnames);
        size += entry;
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    dst = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {  /* pass 2: write */
        PyObject *e = PySequence_Fast_GET_ITEM(seq, i), *body = PyTuple_GET_ITEM(e, 1);
        Py_ssize_t raw_len, body_len = PyBytes_GET_SIZE(body);
        const char *raw = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(e, 2), &raw_len);
        unsigned char *p = (unsigned char *)dst;
        put32(p, (uint32_t)(22 + body_len + raw_len));
        put32(p + 4, 0);
        put32(p + 8, 0);
        put32(p + 12, (uint32_t)PyLong_AsLong(PyTuple_GET_ITEM(e, 0)));
        put32(p + 16, (uint32_t)body_len);
        memcpy(p + 20, PyBytes_AS_STRING(body), (size_t)body_len);
        put16(p + 20 + body_len, (uint16_t)raw_len);
        memcpy(p + 22 + body_len, raw, (size_t)raw_len);
        dst += 22 + body_len + raw_len;
    }
    return out;
}

/* bare_batch_body(msgs, topic, max_bytes, keys): the twin of
   tidemq.producer.send_codec.bare_batch_body for lists of messages that are all bare, usual
   batch members (their attributes read once each, nothing built per message); anything else
   (another type, a property, a tag, a limit) goes to the twin, which decides. */
#define BARE_HEAD "WAIT\x01true\x02UNIQ_KEY\x01"
#define BARE_HEAD_LEN 19

static PyObject *bare_names[7];  /* body flag delay_level topic properties tags keys */

static int
bare_intern(void)
{
    static const char *text[7] = {"body", "flag", "delay_level", "topic", "properties", "tags",
                                  "keys"};
    for (int k = 0; k < 7; k++)
        if ((bare_names[k] = PyUnicode_InternFromString(text[k])) == NULL)
            return -1;
    return 0;
}

static int
bare_member(PyObject *m, PyObject *topic, long long max_bytes, PyObject **body, long long *flag)
{
    PyObject *v[7];
    int ok = 1;
    for (int k = 0; k < 7; k++)
        v[k] = NULL;
    for (int k = 0; k < 7 && ok; k++) {
        v[k] = PyObject_GetAttr(m, bare_names[k]);
        ok = v[k] != NULL;
    }
    if (ok) {
        long long delay;
        ok = PyBytes_CheckExact(v[0]) && PyBytes_GET_SIZE(v[0]) > 0
            && PyBytes_GET_SIZE(v[0]) <= max_bytes
            && PyLong_CheckExact(v[1]) && as_i64(v[1], I32_MIN, I32_MAX, flag) == 0
            && PyLong_CheckExact(v[2]) && as_i64(v[2], 0, 0, &delay) == 0
            && PyUnicode_CheckExact(v[3]) && PyUnicode_Compare(v[3], topic) == 0
            && v[4] == Py_None && v[5] == Py_None && v[6] == Py_None;
    }
    *body = ok ? v[0] : NULL;  /* a borrowed view: the message keeps its body alive */
    for (int k = 0; k < 7; k++)
        Py_XDECREF(v[k]);
    return ok;
}

static PyObject *
bare_batch_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *msgs, *keys, *out, **bodies;
    long long max_bytes, *flags;
    Py_ssize_t count, size = 0;
    unsigned char *p;

    if (kwnames != NULL || nargs != 4 || !PyList_CheckExact(args[0])
            || !PyUnicode_CheckExact(args[1]) || !PyList_CheckExact(args[3])
            || as_i64(args[2], I64_MIN, I64_MAX, &max_bytes) < 0
            || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[3]))
        return fallback("bare_batch_body", args, nargs, kwnames);
    msgs = args[0];
    keys = args[3];
    count = PyList_GET_SIZE(msgs);
    bodies = PyMem_Malloc(sizeof(PyObject *) * (size_t)(count ? count : 1));
    flags = PyMem_Malloc(sizeof(long long) * (size_t)(count ? count : 1));
    if (bodies == NULL || flags == NULL)
        goto twin;
    for (Py_ssize_t i = 0; i < count; i++) {  /* pass 1: check and size */
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t key_len;
        if (!bare_member(PyList_GET_ITEM(msgs, i), args[1], max_bytes, &bodies[i], &flags[i])
                || !PyUnicode_CheckExact(key)
                || PyUnicode_AsUTF8AndSize(key, &key_len) == NULL
                || BARE_HEAD_LEN + key_len + 1 > 32767)
            goto twin;
        size += 22 + PyBytes_GET_SIZE(bodies[i]) + BARE_HEAD_LEN + key_len + 1;
    }
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        PyMem_Free(bodies);
        PyMem_Free(flags);
        return NULL;
    }
    p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {  /* pass 2: write, as encode_batch_body */
        Py_ssize_t key_len, body_len = PyBytes_GET_SIZE(bodies[i]), raw_len;
        const char *key = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(keys, i), &key_len);
        raw_len = BARE_HEAD_LEN + key_len + 1;
        put32(p, (uint32_t)(22 + body_len + raw_len));
        put32(p + 4, 0);
        put32(p + 8, 0);
        put32(p + 12, (uint32_t)flags[i]);
        put32(p + 16, (uint32_t)body_len);
        memcpy(p + 20, PyBytes_AS_STRING(bodies[i]), (size_t)body_len);
        put16(p + 20 + body_len, (uint16_t)raw_len);
        p += 22 + body_len;
        memcpy(p, BARE_HEAD, BARE_HEAD_LEN);
        memcpy(p + BARE_HEAD_LEN, key, (size_t)key_len);
        p[BARE_HEAD_LEN + key_len] = 2;
        p += raw_len;
    }
    PyMem_Free(bodies);
    PyMem_Free(flags);
    return out;
twin:
    PyMem_Free(bodies);
    PyMem_Free(flags);
    return fallback("bare_batch_body", args, nargs, kwnames);
}

/* ------------------------------------------------------------------ send frame heads */

/* `v` in decimal into `out` (at least 21 bytes), as "%lld" writes it (no terminator needed):
   the digit count. A send head formats seven integers; snprintf costs several times this. */
static int
format_i64(char *out, long long v)
{
    char tmp[24];
    int n = 0, len = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (v < 0)
        out[len++] = '-';
    while (n)
        out[len++] = tmp[--n];
    return len;
}

/* Writes a checked format: its %d directives take digits[k] (k counting every directive), %s
   takes s, %% a '%'. The caller sized the output and validated fmt. */
static void
fill_format(unsigned char *w, const char *fmt, const char *end, char (*digits)[24], const int *ndig,
            const char *s, Py_ssize_t slen)
{
    int next = 0;
    for (const char *q = fmt; q < end; q++) {
        if (*q != '%') {  /* the literal run up to the next directive, in one copy */
            const char *pct = memchr(q, '%', (size_t)(end - q));
            size_t run = (size_t)((pct ? pct : end) - q);
            memcpy(w, q, run);
            w += run;
            q += run - 1;
            continue;
        }
        q++;
        if (*q == '%') {
            *w++ = '%';
        } else if (*q == 'd') {
            memcpy(w, digits[next], (size_t)ndig[next]);
            w += ndig[next++];
        } else {
            memcpy(w, s, (size_t)slen);
            w += slen;
            next++;
        }
    }
}

/* json_send_head(fmt, opaque, queue_id, sys_flag, born_ms, flag, props, body_len
   [, reconsume_times, frame_flag]): the twin of tidemq.producer.send_codec.json_send_head.
   fmt's directives are %d, %b and %%, filled in the twin's order (opaque, frame_flag, queue_id,
   sys_flag, born_ms, flag, reconsume_times as ints within int64, props as bytes); any other
   directive, count or type, a total outside int32, or keywords: the twin. */
static PyObject *
json_send_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* the twin's %-tuple order, as indexes into args */
    static const int order[8] = {1, 9, 2, 3, 4, 5, 8, 6};
    PyObject *vals[8], *out;
    long long ints[8], body_len, length;
    char digits[8][24];
    int ndig[8] = {0};
    const char *fmt, *end;
    Py_ssize_t fmt_len, hlen = 0, props_len = 0;
    int next = 0;
    unsigned char *w;

    if (kwnames != NULL || (nargs != 8 && nargs != 10) || !PyBytes_CheckExact(args[0])
            || as_i64(args[7], I32_MIN, I32_MAX, &body_len) < 0)
        return fallback("json_send_head", args, nargs, kwnames);
    for (int k = 0; k < 8; k++) {
        int at = order[k];
        vals[k] = at < nargs ? args[at] : NULL;  /* reconsume_times, frame_flag default 0 */
        if (vals[k] == NULL) {
            ints[k] = 0;
            continue;
        }
        if (k != 7 && as_i64(vals[k], I64_MIN, I64_MAX, &ints[k]) < 0)
            return fallback("json_send_head", args, nargs, kwnames);
    }
    if (!PyBytes_CheckExact(args[6]))
        return fallback("json_send_head", args, nargs, kwnames);
    fmt = PyBytes_AS_STRING(args[0]);
    fmt_len = PyBytes_GET_SIZE(args[0]);
    end = fmt + fmt_len;
    /* pass 1: check the directives and size the header */
    for (const char *q = fmt; q < end; q++) {
        if (*q != '%') {  /* a literal run: sized at once */
            const char *pct = memchr(q, '%', (size_t)(end - q));
            hlen += (pct ? pct : end) - q;
            q = (pct ? pct : end) - 1;
            continue;
        }
        if (++q >= end)
            return fallback("json_send_head", args, nargs, kwnames);
        if (*q == '%') {
            hlen++;
        } else if (*q == 'd' && next < 7) {
            ndig[next] = format_i64(digits[next], ints[next]);
            hlen += ndig[next++];
        } else if (*q == 'b' && next == 7) {
            props_len = PyBytes_GET_SIZE(args[6]);
            hlen += props_len;
            next++;
        } else {
            return fallback("json_send_head", args, nargs, kwnames);
        }
    }
    length = 4 + (long long)hlen + body_len;
    if (next != 8 || length < I32_MIN || length > I32_MAX || (long long)hlen > 0xFFFFFFFFLL)
        return fallback("json_send_head", args, nargs, kwnames);
    out = PyBytes_FromStringAndSize(NULL, 8 + hlen);
    if (out == NULL)
        return NULL;
    w = (unsigned char *)PyBytes_AS_STRING(out);
    put32(w, (uint32_t)length);
    put32(w + 4, (uint32_t)hlen);
    fill_format(w + 8, fmt, end, digits, ndig, PyBytes_AS_STRING(args[6]), props_len);
    return out;
}

/* json_reply_frame(fmt, code, opaque, msg_id, queue_id, queue_offset): the twin of tidemq.node.
   processors.send_reply.json_reply_frame. fmt's directives are %d, %s and %%, filled in the
   argument order, %s taking msg_id's ASCII bytes and %d ints within int64; any other
   directive, count or type, a non-ASCII msg_id, or keywords: the twin. */
static PyObject *
json_reply_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    char digits[5][24];
    int ndig[5] = {0}, next = 0;
    long long v;
    const char *fmt, *end, *mid = NULL;
    Py_ssize_t hlen = 0, mid_len = 0;
    PyObject *out;
    unsigned char *w;

    if (kwnames != NULL || nargs != 6 || !PyBytes_CheckExact(args[0]))
        return fallback("json_reply_frame", args, nargs, kwnames);
    fmt = PyBytes_AS_STRING(args[0]);
    end = fmt + PyBytes_GET_SIZE(args[0]);
    for (const char *q = fmt; q < end; q++) {
        PyObject *arg;
        if (*q != '%') {
            hlen++;
            continue;
        }
        if (++q >= end)
            return fallback("json_reply_frame", args, nargs, kwnames);
        if (*q == '%') {
            hlen++;
            continue;
        }
        if (next >= 5)
            return fallback("json_reply_frame", args, nargs, kwnames);
        arg = args[1 + next];
        if (*q == 'd' && next != 2 && as_i64(arg, I64_MIN, I64_MAX, &v) == 0) {
            ndig[next] = format_i64(digits[next], v);
            hlen += ndig[next];
        } else if (*q == 's' && next == 2 && PyUnicode_CheckExact(arg) && PyUnicode_IS_ASCII(arg)) {
            mid = (const char *)PyUnicode_1BYTE_DATA(arg);
            mid_len = PyUnicode_GET_LENGTH(arg);
            hlen += mid_len;
        } else {
            return fallback("json_reply_frame", args, nargs, kwnames);
        }
        next++;
    }
    if (next != 5 || hlen + 4 > I32_MAX)
        return fallback("json_reply_frame", args, nargs, kwnames);
    out = PyBytes_FromStringAndSize(NULL, 8 + hlen);
    if (out == NULL)
        return NULL;
    w = (unsigned char *)PyBytes_AS_STRING(out);
    put32(w, (uint32_t)(hlen + 4));
    put32(w + 4, (uint32_t)hlen);
    fill_format(w + 8, fmt, end, digits, ndig, mid, mid_len);
    return out;
}

/* ------------------------------------------------------------------ typed requests */

/* typed_request(ext, plan, cls): the twin of tidemq.node.requests.parse.typed_request.
   ext: a dict of str; plan: a tuple of (first, other or None, op, arg, required, default)
   tuples; the answer cls(*values), or None where the twin answers None. A plan or argument
   of another shape, or keywords: the twin. */
#define TR_MAX_FIELDS 32
enum { TR_TEXT = 0, TR_NAME = 1, TR_INT = 2, TR_BOOL = 3 };

/* One field's value into *out (a new reference): 1 done, 0 the twin answers None, -1 the
   twin must decide (an odd plan entry). */
static int
tr_field(PyObject *ext, PyObject *entry, PyObject **out)
{
    PyObject *first, *other, *arg, *v, *w;
    long op;
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 6)
        return -1;
    first = PyTuple_GET_ITEM(entry, 0);
    other = PyTuple_GET_ITEM(entry, 1);
    arg = PyTuple_GET_ITEM(entry, 3);
    op = PyLong_CheckExact(PyTuple_GET_ITEM(entry, 2)) ? PyLong_AsLong(PyTuple_GET_ITEM(entry, 2)) : -1;
    if (!PyUnicode_CheckExact(first) || (other != Py_None && !PyUnicode_CheckExact(other))
            || op < TR_TEXT || op > TR_BOOL)
        return -1;
    v = PyDict_GetItemWithError(ext, first);
    if (v == NULL && PyErr_Occurred())
        return -1;
    if (v == Py_None)
        v = NULL;
    if (other != Py_None) {
        w = PyDict_GetItemWithError(ext, other);
        if (w == NULL && PyErr_Occurred())
            return -1;
        if (w != NULL && w != Py_None) {
            if (v != NULL)
                return 0;
            v = w;
        }
    }
    if (v == NULL) {
        int required = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 4));
        if (required != 0)
            return required < 0 ? -1 : 0;
        *out = Py_NewRef(PyTuple_GET_ITEM(entry, 5));
        return 1;
    }
    if (!PyUnicode_CheckExact(v))
        return 0;
    if (op == TR_INT) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(v), safe;
        const unsigned char *d;
        long long value = 0;
        if (!PyLong_CheckExact(arg) || (safe = PyLong_AsSsize_t(arg)) < 0 || safe > 19)
            return -1;
        if (!PyUnicode_IS_ASCII(v) || n == 0 || n >= safe)
            return 0;
        d = PyUnicode_1BYTE_DATA(v);
        for (Py_ssize_t k = 0; k < n; k++) {
            if (d[k] < '0' || d[k] > '9')
                return 0;
            value = value * 10 + (d[k] - '0');  /* under 19 digits: never overflows */
        }
        *out = PyLong_FromLongLong(value);
        return *out == NULL ? -1 : 1;
    }
    if (op == TR_TEXT) {
        Py_ssize_t max;
        if (!PyLong_CheckExact(arg) || ((max = PyLong_AsSsize_t(arg)) == -1 && PyErr_Occurred()))
            return -1;
        if (PyUnicode_GET_LENGTH(v) > max)
            return 0;
    } else if (op == TR_NAME) {
        int known;
        if (!PySet_CheckExact(arg))
            return -1;
        known = PySet_Contains(arg, v);
        if (known <= 0)
            return known < 0 ? -1 : 0;
    } else {
        if (PyUnicode_CompareWithASCIIString(v, "true") == 0)
            v = Py_True;
        else if (PyUnicode_CompareWithASCIIString(v, "false") == 0)
            v = Py_False;
        else
            return 0;
    }
    *out = Py_NewRef(v);
    return 1;
}

static PyObject *
typed_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *vals[TR_MAX_FIELDS] = {NULL}, *plan, *out = NULL;
    Py_ssize_t n, done = 0;
    int r = 1;
    if (kwnames != NULL || nargs != 3 || !PyTuple_CheckExact(args[1]))
        return fallback("typed_request", args, nargs, kwnames);
    if (!PyDict_CheckExact(args[0]))
        Py_RETURN_NONE;  /* the twin's first test */
    plan = args[1];
    n = PyTuple_GET_SIZE(plan);
    if (n > TR_MAX_FIELDS)
        return fallback("typed_request", args, nargs, kwnames);
    while (done < n && (r = tr_field(args[0], PyTuple_GET_ITEM(plan, done), &vals[done])) == 1)
        done++;
    if (r == 1)
        out = PyObject_Vectorcall(args[2], vals, (size_t)n, NULL);
    for (Py_ssize_t k = 0; k < done; k++)
        Py_DECREF(vals[k]);
    if (r == 0)
        Py_RETURN_NONE;
    if (r < 0)
        return fallback("typed_request", args, nargs, kwnames);
    return out;
}

/* ------------------------------------------------------------------ remoting headers */

static PyObject *
decode_binary_ext(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    long long pos, end;
    const unsigned char *raw;
    PyObject *ext;
    if (kwnames != NULL || nargs != 3 || !PyBytes_CheckExact(args[0])
            || as_i64(args[1], 0, PY_SSIZE_T_MAX, &pos) < 0
            || as_i64(args[2], 0, PyBytes_GET_SIZE(args[0]), &end) < 0)
        return fallback("decode_binary_ext", args, nargs, kwnames);
    raw = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    ext = PyDict_New();
    if (ext == NULL)
        return NULL;
    while (pos < end) {
        long long key_len, val_len, key_end, val_start, val_end;
        PyObject *key, *value;
        if (pos + 2 > end)
            goto slow;
        key_len = get16(raw + pos);
        pos += 2;
        key_end = pos + key_len;
        if (key_len < 0 || key_end + 4 > end)
            goto slow;
        val_len = get32(raw + key_end);
        val_start = key_end + 4;
        val_end = val_start + val_len;
        if (val_len < 0 || val_end > end)
            goto slow;
        key = decode_replace((const char *)raw + pos, key_len);
        value = key ? decode_replace((const char *)raw + val_start, val_len) : NULL;
        if (value == NULL || PyDict_SetItem(ext, key, value) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_DECREF(ext);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(value);
        pos = val_end;
    }
    return ext;
slow:
    Py_DECREF(ext);
    return fallback("decode_binary_ext", args, nargs, kwnames);
}

/* ------------------------------------------------------------------ key index entries */

#define IDX_HEADER_BYTES 40
#define IDX_ENTRY_BYTES 20

typedef struct {
    long long slots, base, cap, n, used, begin_ts, begin_phys, index_from, last_ts, last_phys;
    Py_ssize_t at, at_key;
    int wrote_any;
    /* The checking pass (buf NULL) prefetches each name's slot here when set: slots are read
       at random over megabytes, and a cache miss per entry was half the index's cost. */
    const unsigned char *prefetch;
    /* The checking pass keeps the names' hashes here (up to hash_cap) for the writing pass,
       which reads them back in the same order from hash_next on. */
    uint32_t *hashes;
    Py_ssize_t nhashes, hash_cap, hash_next;
} idx_state;

/* One request's fields: 0, or -1 when the twin skips it, -2 when only the twin may decide. */
static int
idx_request(PyObject *r, long long index_from, PyObject **topic, PyObject **keys, PyObject **uniq,
            long long *phys, long long *ts)
{
    if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) < 9)
        return -2;
    *keys = PyTuple_GET_ITEM(r, 7);
    *uniq = PyTuple_GET_ITEM(r, 8);
    if ((*keys != Py_None && !PyUnicode_CheckExact(*keys)) || (*uniq != Py_None && !PyUnicode_CheckExact(*uniq))
            || as_i64(PyTuple_GET_ITEM(r, 3), I64_MIN, I64_MAX, phys) < 0)
        return -2;
    if (((*keys == Py_None || PyUnicode_GET_LENGTH(*keys) == 0)
            && (*uniq == Py_None || PyUnicode_GET_LENGTH(*uniq) == 0)) || *phys < index_from)
        return -1;
    *topic = PyTuple_GET_ITEM(r, 0);
    if (!PyUnicode_CheckExact(*topic) || as_i64(PyTuple_GET_ITEM(r, 6), I64_MIN, I64_MAX, ts) < 0)
        return -2;
    return 0;
}

/* crc32(f"{topic}#") through the caller's cache dict, as the twin keeps it; -1: twin decides. */
static long long
idx_seed(PyObject *seeds, PyObject *topic)
{
    PyObject *cached = PyDict_GetItemWithError(seeds, topic), *v;
    long long seed;
    Py_ssize_t tn;
    const char *tb;
    if (cached != NULL)
        return as_i64(cached, 0, 0xFFFFFFFFLL, &seed) < 0 ? -1 : seed;
    if (PyErr_Occurred() || (tb = PyUnicode_AsUTF8AndSize(topic, &tn)) == NULL)
        return -1;
    seed = crc32_update(crc32_update(0, (const unsigned char *)tb, (size_t)tn), (const unsigned char *)"#", 1);
    v = PyLong_FromLongLong(seed);
    if (v == NULL || PyDict_SetItem(seeds, topic, v) < 0) {
        Py_XDECREF(v);
        return -1;
    }
    Py_DECREF(v);
    return seed;
}

/* One name: 1 when the file is full (stop here), -2 when the twin would raise, else 0. With
   buf == NULL only the state advances (the checking pass). */
static int
idx_put_name(idx_state *st, unsigned char *buf, uint32_t seed, const char *name, Py_ssize_t len,
             long long phys, long long ts)
{
    long long d, diff;
    if (st->n >= st->cap)
        return 1;
    if (st->n == 1) {
        st->begin_ts = ts;
        st->begin_phys = phys;
    }
    if (__builtin_sub_overflow(ts, st->begin_ts, &d))
        return -2;
    diff = d / 1000 - (d % 1000 < 0 ? 1 : 0);  /* Python's floor division */
    if (diff < I32_MIN || diff > I32_MAX)
        return -2;
    if (buf == NULL && st->prefetch != NULL) {
        uint32_t h = crc32_update(seed, (const unsigned char *)name, (size_t)len) & 0x7FFFFFFFu;
        __builtin_prefetch(st->prefetch + IDX_HEADER_BYTES + (h % (uint64_t)st->slots) * 4, 1);
        if (st->nhashes < st->hash_cap)
            st->hashes[st->nhashes++] = h;
    }
    if (buf != NULL) {
        uint32_t h = st->hash_next < st->nhashes ? st->hashes[st->hash_next++]
            : crc32_update(seed, (const unsigned char *)name, (size_t)len) & 0x7FFFFFFFu;
        unsigned char *slot = buf + IDX_HEADER_BYTES + (h % (uint64_t)st->slots) * 4;
        unsigned char *e = buf + st->base + st->n * IDX_ENTRY_BYTES;
        int32_t prev = get32(slot);
        if (prev <= 0 || prev >= st->n) {
            prev = 0;
            st->used++;
        }
        put32(e, h);
        put64(e + 4, (uint64_t)phys);
        put32(e + 12, (uint32_t)diff);
        put32(e + 16, (uint32_t)prev);
        put32(slot, (uint32_t)st->n);
    }
    st->n++;
    st->last_ts = ts;
    st->last_phys = phys;
    st->wrote_any = 1;
    return 0;
}

/* The twin's walk over requests[at:]: names = keys.split(" ") (when keys) + [uniq] (when
   uniq), empty names skipped. 0 when done or the file is full (st->at, st->at_key say where
   to resume), -2 when the twin must decide. */
static int
idx_walk(PyObject *requests, idx_state *st, PyObject *seeds, unsigned char *buf)
{
    Py_ssize_t count = PyList_GET_SIZE(requests);
    for (Py_ssize_t i = st->at; i < count; i++) {
        PyObject *topic, *keys, *uniq;
        long long phys, ts, seed;
        const char *kb = NULL, *ub = NULL;
        Py_ssize_t kn = 0, un = 0, piece = 0, first = i == st->at ? st->at_key : 0;
        int rc = idx_request(PyList_GET_ITEM(requests, i), st->index_from, &topic, &keys, &uniq, &phys, &ts);
        if (rc != 0) {
            if (rc == -2)
                return -2;
            continue;
        }
        if ((keys != Py_None && (kb = PyUnicode_AsUTF8AndSize(keys, &kn)) == NULL)
                || (uniq != Py_None && (ub = PyUnicode_AsUTF8AndSize(uniq, &un)) == NULL)
                || (seed = idx_seed(seeds, topic)) < 0)
            return -2;
        if (kn > 0) {
            const char *p = kb, *end = kb + kn;
            for (;; piece++) {  /* a space is ASCII: splitting the UTF-8 splits the text */
                const char *sp = memchr(p, ' ', (size_t)(end - p)), *stop = sp ? sp : end;
                if (piece >= first && stop > p
                        && (rc = idx_put_name(st, buf, (uint32_t)seed, p, stop - p, phys, ts)) != 0)
                    goto stopped;
                if (sp == NULL)
                    break;
                p = sp + 1;
            }
            piece++;  /* the UNIQ_KEY's index among the names */
        }
        if (un > 0 && piece >= first && (rc = idx_put_name(st, buf, (uint32_t)seed, ub, un, phys, ts)) != 0)
            goto stopped;
        continue;
stopped:
        if (rc == -2)
            return -2;
        st->at = i;
        st->at_key = piece;
        return 0;
    }
    st->at = count;
    st->at_key = 0;
    return 0;
}

static PyObject *
index_entries(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (buf, slots, base, cap, n, used, begin_ts, begin_phys, requests, at, at_key, index_from,
       seeds) -> (at, at_key, n, used, begin_ts, begin_phys, last) */
    idx_state st, check;
    uint32_t hashes[512];  /* a batch's names, hashed once */
    long long at, at_key;
    Py_buffer view;
    PyObject *last;
    memset(&st, 0, sizeof st);
    if (kwnames != NULL || nargs != 13 || !PyList_CheckExact(args[8]) || !PyDict_CheckExact(args[12])
            || as_i64(args[1], 1, I32_MAX, &st.slots) < 0 || as_i64(args[2], 0, I32_MAX, &st.base) < 0
            || as_i64(args[3], 0, I32_MAX, &st.cap) < 0 || as_i64(args[4], 0, I32_MAX, &st.n) < 0
            || as_i64(args[5], I32_MIN, I32_MAX, &st.used) < 0
            || as_i64(args[6], I64_MIN, I64_MAX, &st.begin_ts) < 0
            || as_i64(args[7], I64_MIN, I64_MAX, &st.begin_phys) < 0
            || as_i64(args[9], 0, PyList_GET_SIZE(args[8]), &at) < 0
            || as_i64(args[10], 0, PY_SSIZE_T_MAX, &at_key) < 0
            || as_i64(args[11], I64_MIN, I64_MAX, &st.index_from) < 0)
        return fallback("index_entries", args, nargs, kwnames);
    st.at = (Py_ssize_t)at;
    st.at_key = (Py_ssize_t)at_key;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0)
        return fallback("index_entries", args, nargs, kwnames);
    if (IDX_HEADER_BYTES + st.slots * 4 > view.len || st.base + st.cap * IDX_ENTRY_BYTES > view.len
            || st.base < IDX_HEADER_BYTES + st.slots * 4) {
        PyBuffer_Release(&view);
        return fallback("index_entries", args, nargs, kwnames);
    }
    check = st;
    check.prefetch = view.buf;
    check.hashes = hashes;
    check.hash_cap = sizeof hashes / sizeof hashes[0];
    if (idx_walk(args[8], &check, args[12], NULL) < 0) {
        PyBuffer_Release(&view);
        return fallback("index_entries", args, nargs, kwnames);  /* the twin would raise: let it */
    }
    st.hashes = hashes;
    st.nhashes = check.nhashes;
    idx_walk(args[8], &st, args[12], view.buf);  /* cannot fail: the same walk just passed */
    PyBuffer_Release(&view);
    last = st.wrote_any ? Py_BuildValue("(LL)", st.last_ts, st.last_phys) : Py_NewRef(Py_None);
    if (last == NULL)
        return NULL;
    return Py_BuildValue("(nnLLLLN)", st.at, st.at_key, st.n, st.used, st.begin_ts, st.begin_phys, last);
}

/* ------------------------------------------------------------------ commit-log append */

static PyObject *s_properties, *s_tags, *empty_tuple, *s_qkey, *s_max_queue_offset;
static PyObject *s_size_no_crc, *s_dispatchable, *s_topic, *s_queue_id, *s_topic_bytes, *s_flag,
    *s_sys_flag, *s_born_timestamp, *s_born_host, *s_store_host, *s_reconsume_times,
    *s_prepared_tx_offset, *s_body, *s_properties_raw, *s_tags_code, *s_keys, *s_uniq_key;

static int
intern_names(void)
{
#define INTERN(v, text) if ((v = PyUnicode_InternFromString(text)) == NULL) return -1
    INTERN(s_size_no_crc, "size_no_crc"); INTERN(s_dispatchable, "dispatchable");
    INTERN(s_topic, "topic"); INTERN(s_queue_id, "queue_id"); INTERN(s_topic_bytes, "topic_bytes");
    INTERN(s_flag, "flag"); INTERN(s_sys_flag, "sys_flag"); INTERN(s_born_timestamp, "born_timestamp");
    INTERN(s_born_host, "born_host"); INTERN(s_store_host, "store_host");
    INTERN(s_reconsume_times, "reconsume_times"); INTERN(s_prepared_tx_offset, "prepared_tx_offset");
    INTERN(s_body, "body"); INTERN(s_properties_raw, "properties_raw"); INTERN(s_tags_code, "tags_code");
    INTERN(s_keys, "keys"); INTERN(s_uniq_key, "uniq_key");
    INTERN(s_properties, "properties"); INTERN(s_tags, "tags");
    INTERN(s_qkey, "qkey"); INTERN(s_max_queue_offset, "max_queue_offset");
#undef INTERN
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return -1;
    return 0;
}

/* The attributes of one StoreMessage that append needs (new references). */
typedef struct {
    PyObject *v[17];
} msg_attrs;

enum { M_SIZE, M_DISP, M_TOPIC, M_QID, M_TOPIC_BYTES, M_FLAG, M_SYSFLAG, M_BORN_TS, M_BORN_HOST,
       M_STORE_HOST, M_RECONSUME, M_PREP, M_BODY, M_PROPS, M_TAGS_CODE, M_KEYS, M_UNIQ };

static void
attrs_clear(msg_attrs *a)
{
    for (int k = 0; k < 17; k++)
        Py_CLEAR(a->v[k]);
}

static int attrs_from_slots(PyObject *m, PyObject **v);

static int
attrs_get(PyObject *m, msg_attrs *a)
{
    if (attrs_from_slots(m, a->v) == 0)
        return 0;
    PyObject *names[17] = {s_size_no_crc, s_dispatchable, s_topic, s_queue_id, s_topic_bytes, s_flag,
                           s_sys_flag, s_born_timestamp, s_born_host, s_store_host, s_reconsume_times,
                           s_prepared_tx_offset, s_body, s_properties_raw, s_tags_code, s_keys, s_uniq_key};
    memset(a, 0, sizeof *a);
    for (int k = 0; k < 17; k++) {
        if ((a->v[k] = PyObject_GetAttr(m, names[k])) == NULL) {
            attrs_clear(a);
            return -1;
        }
    }
    return 0;
}

/* Re-enter the twin at message i with the loop's current state. */
static PyObject *
append_fallback(PyObject *const *args, Py_ssize_t i, long long wrote, long long pos)
{
    PyObject *call[13], *result;
    PyObject *oi = PyLong_FromSsize_t(i), *ow = PyLong_FromLongLong(wrote), *op = PyLong_FromLongLong(pos);
    if (oi == NULL || ow == NULL || op == NULL) {
        Py_XDECREF(oi); Py_XDECREF(ow); Py_XDECREF(op);
        return NULL;
    }
    for (int k = 0; k < 13; k++)
        call[k] = args[k];
    call[1] = op; call[3] = oi; call[4] = ow;
    call[12] = i == PyLong_AsSsize_t(args[3]) ? args[12] : Py_False;  /* rolled: first message only */
    result = fallback("append_records", call, 13, NULL);
    Py_DECREF(oi); Py_DECREF(ow); Py_DECREF(op);
    return result;
}

/* The dispatch request (message.py DR_* order) of a message just written; built directly, not
   through Py_BuildValue's format parsing (once per message). */
static PyObject *
request_tuple(msg_attrs *a, long long qoff, long long phys, long long size, PyObject *store_ts)
{
    PyObject *req = PyTuple_New(10);
    PyObject *q = PyLong_FromLongLong(qoff), *p = PyLong_FromLongLong(phys);
    PyObject *n = PyLong_FromLongLong(size), *t = Py_NewRef(store_ts);  /* the batch's one int */
    if (req == NULL || q == NULL || p == NULL || n == NULL) {
        Py_XDECREF(req); Py_XDECREF(q); Py_XDECREF(p); Py_XDECREF(n); Py_XDECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(req, 0, Py_NewRef(a->v[M_TOPIC]));
    PyTuple_SET_ITEM(req, 1, Py_NewRef(a->v[M_QID]));
    PyTuple_SET_ITEM(req, 2, q);
    PyTuple_SET_ITEM(req, 3, p);
    PyTuple_SET_ITEM(req, 4, n);
    PyTuple_SET_ITEM(req, 5, Py_NewRef(a->v[M_TAGS_CODE]));
    PyTuple_SET_ITEM(req, 6, t);
    PyTuple_SET_ITEM(req, 7, Py_NewRef(a->v[M_KEYS]));
    PyTuple_SET_ITEM(req, 8, Py_NewRef(a->v[M_UNIQ]));
    PyTuple_SET_ITEM(req, 9, Py_NewRef(a->v[M_SYSFLAG]));
    return req;
}

/* The next queue offsets of the queues one append_records call writes to, kept in C and
   written back into queue_table (qt_flush) before the call returns or runs any Python code:
   one dict look-up per queue and call, not two per message. */
#define QT_MAX 16
typedef struct {
    PyObject *topic;  /* borrowed from a message of the batch (the list holds it) */
    PyObject *key;    /* new reference: the key as the twin would store it */
    long long qid, next;
} qt_entry;
typedef struct {
    qt_entry e[QT_MAX];
    int n;
} qt_cache;

static int
qt_flush(qt_cache *c, PyObject *queue_table)
{
    int rc = 0;
    for (int k = 0; k < c->n; k++) {
        PyObject *v = rc == 0 ? PyLong_FromLongLong(c->e[k].next) : NULL;
        if (v == NULL || PyDict_SetItem(queue_table, c->e[k].key, v) < 0)
            rc = -1;
        Py_XDECREF(v);
        Py_DECREF(c->e[k].key);
    }
    c->n = 0;
    return rc;
}

/* The entry of (topic, qid), read from queue_table on first use; NULL (no error set) when the
   twin must decide, NULL with *failed set when writing a full cache back failed. A full cache
   is written back and reused, so a put over any number of queues stays compiled. */
static qt_entry *
qt_find(qt_cache *c, PyObject *queue_table, PyObject *topic, PyObject *qid_obj, long long qid, int *failed)
{
    PyObject *key, *cur;
    long long qoff = 0;
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(qid_obj))
        return NULL;  /* (an exact str and int compare in C as they do in the dict) */
    for (int k = 0; k < c->n; k++) {
        qt_entry *e = &c->e[k];
        if (e->qid == qid && (e->topic == topic || PyUnicode_Compare(e->topic, topic) == 0))
            return e;
    }
    if (c->n == QT_MAX && qt_flush(c, queue_table) < 0) {
        *failed = 1;
        return NULL;
    }
    key = PyTuple_Pack(2, topic, qid_obj);
    cur = key ? PyDict_GetItemWithError(queue_table, key) : NULL;
    if (key == NULL || (cur == NULL && PyErr_Occurred()) || (cur != NULL && as_i64(cur, I64_MIN, I64_MAX - 1, &qoff) < 0)) {
        Py_XDECREF(key);
        return NULL;
    }
    c->e[c->n] = (qt_entry){topic, key, qid, qoff};
    return &c->e[c->n++];
}

/* Encodes one message (fields already fetched) at out+pos; -1 when the twin must take over
   (nothing of this message written, its queue offset untouched), 0 when done, 1 when it needs
   a roll. */
static int
append_one(msg_attrs *a, Py_buffer *out, long long *wrote, long long *pos, long long fsize,
           long long start, long long extra, qt_cache *qt, PyObject *queue_table, PyObject *store_ts_obj,
           long long store_ts, int crc, int check_room, PyObject *requests)
{
    enc_args e;
    Py_buffer body;
    long long size, qoff = 0, phys, tags_code;
    Py_ssize_t topic_len, props_len, born_len, store_len, real;
    PyObject *req;
    int disp;
    if (as_i64(a->v[M_SIZE], 0, I32_MAX, &size) < 0 || (size += extra) > I32_MAX || size <= 0)
        return -1;
    if (check_room && size + 8 > fsize - *wrote)
        return 1;
    disp = a->v[M_DISP] == Py_True ? 1 : a->v[M_DISP] == Py_False ? 0 : -1;
    e.with_crc = crc;
    if (disp < 0 || !PyBytes_CheckExact(a->v[M_TOPIC_BYTES]) || !PyBytes_CheckExact(a->v[M_BORN_HOST])
            || !PyBytes_CheckExact(a->v[M_STORE_HOST]) || !PyBytes_CheckExact(a->v[M_PROPS])
            || as_i64(a->v[M_QID], I32_MIN, I32_MAX, &e.qid) < 0 || as_i64(a->v[M_FLAG], I32_MIN, I32_MAX, &e.flag) < 0
            || as_i64(a->v[M_SYSFLAG], I32_MIN, I32_MAX, &e.sysflag) < 0
            || as_i64(a->v[M_BORN_TS], I64_MIN, I64_MAX, &e.born_ts) < 0
            || as_i64(a->v[M_RECONSUME], I32_MIN, I32_MAX, &e.reconsume) < 0
            || as_i64(a->v[M_PREP], I64_MIN, I64_MAX, &e.prep) < 0
            || as_i64(a->v[M_TAGS_CODE], I64_MIN, I64_MAX, &tags_code) < 0)
        return -1;
    topic_len = PyBytes_GET_SIZE(a->v[M_TOPIC_BYTES]); props_len = PyBytes_GET_SIZE(a->v[M_PROPS]);
    born_len = PyBytes_GET_SIZE(a->v[M_BORN_HOST]); store_len = PyBytes_GET_SIZE(a->v[M_STORE_HOST]);
    if ((born_len != 8 && born_len != 20) || (store_len != 8 && store_len != 20) || topic_len > 32767
            || props_len + (crc ? 20 : 0) > 32767 || PyObject_GetBuffer(a->v[M_BODY], &body, PyBUF_SIMPLE) < 0)
        return -1;
    real = 91 + body.len + topic_len + props_len + born_len + store_len - 16 + (crc ? 20 : 0) + (topic_len > 127);
    if (body.len > I32_MAX || real > out->len - *pos) {
        PyBuffer_Release(&body);
        return -1;
    }
    if (disp) {  /* queue_table[(topic, queue_id)] += 1, from 0 */
        int failed = 0;
        qt_entry *q = qt_find(qt, queue_table, a->v[M_TOPIC], a->v[M_QID], e.qid, &failed);
        if (failed) {
            PyBuffer_Release(&body);
            return -2;
        }
        if (q == NULL || q->next == I64_MAX) {
            PyErr_Clear();
            PyBuffer_Release(&body);
            return -1;
        }
        qoff = q->next++;
    }
    phys = start + *wrote;
    e.qoff = qoff; e.phys = phys; e.store_ts = store_ts;
    write_record((unsigned char *)out->buf + *pos, &e, (const unsigned char *)PyBytes_AS_STRING(a->v[M_TOPIC_BYTES]),
                 topic_len, (const unsigned char *)PyBytes_AS_STRING(a->v[M_BORN_HOST]), born_len,
                 (const unsigned char *)PyBytes_AS_STRING(a->v[M_STORE_HOST]), store_len, body.buf, body.len,
                 (const unsigned char *)PyBytes_AS_STRING(a->v[M_PROPS]), props_len, size);
    PyBuffer_Release(&body);
    *wrote += size;
    *pos += size;
    req = request_tuple(a, qoff, phys, size, store_ts_obj);
    if (req == NULL || PyList_Append(requests, req) < 0) {
        Py_XDECREF(req);
        return -2;
    }
    Py_DECREF(req);
    return 0;
}

static PyObject *
append_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (out, pos, msgs, i, wrote, fsize, start, extra, queue_table, store_ts, crc, requests,
       rolled) -> (i, wrote, pos) */
    long long pos, i, wrote, fsize, start, extra, store_ts;
    Py_buffer out;
    Py_ssize_t count;
    if (kwnames != NULL || nargs != 13 || !PyList_CheckExact(args[2]) || !PyDict_CheckExact(args[8])
            || !PyList_CheckExact(args[11]) || !PyBool_Check(args[10]) || !PyBool_Check(args[12])
            || as_i64(args[1], 0, PY_SSIZE_T_MAX, &pos) < 0 || as_i64(args[3], 0, PY_SSIZE_T_MAX, &i) < 0
            || as_i64(args[4], 0, I32_MAX * 1024LL, &wrote) < 0 || as_i64(args[5], 0, I32_MAX * 1024LL, &fsize) < 0
            || as_i64(args[6], 0, I64_MAX / 2, &start) < 0 || as_i64(args[7], 0, 1024, &extra) < 0
            || as_i64(args[9], I64_MIN, I64_MAX, &store_ts) < 0
            || PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0)
        return fallback("append_records", args, nargs, kwnames);
    count = PyList_GET_SIZE(args[2]);
    qt_cache qt;
    qt.n = 0;
    for (Py_ssize_t k = (Py_ssize_t)i; k < count; k++) {
        PyObject *m = PyList_GET_ITEM(args[2], k);
        msg_attrs a;
        int rc;
        if (attrs_from_slots(m, a.v) < 0) {  /* getattr may run Python code: queue_table first */
            if (qt_flush(&qt, args[8]) < 0) {
                PyBuffer_Release(&out);
                return NULL;
            }
            if (attrs_get(m, &a) < 0) {
                PyBuffer_Release(&out);
                return append_fallback(args, k, wrote, pos);
            }
        }
        rc = append_one(&a, &out, &wrote, &pos, fsize, start, extra, &qt, args[8], args[9], store_ts,
                        args[10] == Py_True, !(k == i && args[12] == Py_True), args[11]);
        attrs_clear(&a);
        if (rc != 0) {
            PyBuffer_Release(&out);
            if (qt_flush(&qt, args[8]) < 0)
                return NULL;
            if (rc == 1)
                return Py_BuildValue("(nLL)", k, wrote, pos);
            return rc == -1 ? append_fallback(args, k, wrote, pos) : NULL;
        }
    }
    PyBuffer_Release(&out);
    if (qt_flush(&qt, args[8]) < 0)
        return NULL;
    return Py_BuildValue("(nLL)", count, wrote, pos);
}

/* ------------------------------------------------------------------ consume-queue units of a slice */

#define QU_LINEAR 16  /* up to this many queues a slice's runs are searched in turn, past it by a dict */

typedef struct {
    PyObject *topic, *key, *cq, *qkey;  /* borrowed topic; new references key, cq, qkey */
    long long qid, next, end;
    PyObject *first, *first_phys;       /* borrowed from the request */
} qu_run;

static void
qu_clear(qu_run *runs, Py_ssize_t n, PyObject *rows, PyObject *index)
{
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_XDECREF(runs[k].key); Py_XDECREF(runs[k].cq); Py_XDECREF(runs[k].qkey);
    }
    PyMem_Free(runs);
    Py_XDECREF(rows);
    Py_XDECREF(index);
}

/* Index run k by its key; once the runs outgrow QU_LINEAR, every run is indexed. */
static int
qu_index(qu_run *runs, Py_ssize_t n, PyObject *index)
{
    for (Py_ssize_t k = n == QU_LINEAR + 1 ? 0 : n - 1; k < n; k++) {
        PyObject *at = PyLong_FromSsize_t(k);
        int bad = at == NULL || PyDict_SetItem(index, runs[k].key, at) < 0;
        Py_XDECREF(at);
        if (bad)
            return -1;
    }
    return 0;
}

/* The run of (topic, qid) among the n known, else a new one when `queues` has the queue, it
   is not blocked and qoff is its next unit; -1: the twin decides (or returns None). */
static Py_ssize_t
qu_find(qu_run *runs, Py_ssize_t *n, PyObject *index, PyObject *topic, long long qid,
        PyObject *qid_obj, long long qoff, PyObject *queues, PyObject *blocked)
{
    qu_run *r;
    PyObject *cq, *key = NULL;
    long long next;
    if (*n <= QU_LINEAR) {
        for (Py_ssize_t k = 0; k < *n; k++)
            if (runs[k].qid == qid && (runs[k].topic == topic || PyUnicode_Compare(runs[k].topic, topic) == 0))
                return k;
        if (PyErr_Occurred())
            return -1;
    } else {
        PyObject *hit;
        if ((key = PyTuple_Pack(2, topic, qid_obj)) == NULL)
            return -1;
        if ((hit = PyDict_GetItemWithError(index, key)) != NULL) {  /* borrowed */
            Py_DECREF(key);
            return PyLong_AsSsize_t(hit);
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
    }
    if (key == NULL && (key = PyTuple_Pack(2, topic, qid_obj)) == NULL)
        return -1;
    r = &runs[*n];
    memset(r, 0, sizeof *r);
    r->topic = topic;
    r->qid = qid;
    r->key = key;
    (*n)++;  /* from here qu_clear releases what it holds */
    if (*n > QU_LINEAR && qu_index(runs, *n, index) < 0)
        return -1;
    cq = PyDict_GetItemWithError(queues, r->key);  /* borrowed */
    if (cq == NULL || PyDict_Contains(blocked, r->key) != 0)
        return -1;
    r->cq = Py_NewRef(cq);
    {
        PyObject *nxt = PyObject_GetAttr(r->cq, s_max_queue_offset);
        int bad = nxt == NULL || as_i64(nxt, I64_MIN, I64_MAX - 1, &next) < 0 || next != qoff;
        Py_XDECREF(nxt);
        if (bad || (r->qkey = PyObject_GetAttr(r->cq, s_qkey)) == NULL)
            return -1;
    }
    r->next = qoff;
    return *n - 1;
}

static PyObject *
qu_result(qu_run *runs, Py_ssize_t n, PyObject *rows, PyObject *index)
{
    PyObject *out = PyDict_New(), *result;
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        PyObject *v = Py_BuildValue("(OOOLL)", runs[k].cq, runs[k].first, runs[k].first_phys, runs[k].next,
                                    runs[k].end);
        if (v == NULL || PyDict_SetItem(out, runs[k].key, v) < 0)
            Py_CLEAR(out);
        Py_XDECREF(v);
    }
    result = out ? Py_BuildValue("(ON)", rows, out) : NULL;
    qu_clear(runs, n, rows, index);
    return result;
}

#define QU_NOT_QUEUED (-2)

/* One request of a slice: the index of its run (found, or started as qu_find starts one) with
   the run's next offset and end moved past it, and its phys and size; QU_NOT_QUEUED for a
   PREPARED or ROLLBACK record; -1 when the twin decides. */
static Py_ssize_t
qu_request(PyObject *r, qu_run *runs, Py_ssize_t *n, PyObject *index, PyObject *queues,
           PyObject *blocked, long long *phys, long long *size)
{
    PyObject *topic, *qid_obj;
    long long qid, qoff, sysflag;
    Py_ssize_t k;
    if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 10
            || as_i64(PyTuple_GET_ITEM(r, 9), I64_MIN, I64_MAX, &sysflag) < 0)
        return -1;
    if ((sysflag & 0xC) == 4 || (sysflag & 0xC) == 0xC)  /* PREPARED, ROLLBACK: not queued */
        return QU_NOT_QUEUED;
    topic = PyTuple_GET_ITEM(r, 0);
    qid_obj = PyTuple_GET_ITEM(r, 1);
    if (!PyUnicode_CheckExact(topic) || !PyLong_CheckExact(qid_obj)
            || as_i64(qid_obj, I64_MIN, I64_MAX, &qid) < 0
            || as_i64(PyTuple_GET_ITEM(r, 2), I64_MIN, I64_MAX - 1, &qoff) < 0
            || as_i64(PyTuple_GET_ITEM(r, 3), 0, I64_MAX / 2, phys) < 0
            || as_i64(PyTuple_GET_ITEM(r, 4), 0, I64_MAX / 2, size) < 0
            || (k = qu_find(runs, n, index, topic, qid, qid_obj, qoff, queues, blocked)) < 0
            || runs[k].next != qoff)
        return -1;
    if (runs[k].first == NULL) {
        runs[k].first = PyTuple_GET_ITEM(r, 2);
        runs[k].first_phys = PyTuple_GET_ITEM(r, 3);
    }
    runs[k].next = qoff + 1;
    runs[k].end = *phys + *size;
    return k;
}

static PyObject *
queue_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (requests, queues, blocked) -> (rows, runs) or None */
    qu_run *runs;
    Py_ssize_t n = 0, count;
    PyObject *rows, *index;
    if (kwnames != NULL || nargs != 3 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])
            || !PyDict_CheckExact(args[2]))
        return fallback("queue_units", args, nargs, kwnames);
    count = PyList_GET_SIZE(args[0]);
    /* a slice has at most one run per request */
    if ((runs = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(qu_run))) == NULL)
        return PyErr_NoMemory();
    if ((rows = PyList_New(0)) == NULL || (index = PyDict_New()) == NULL) {
        qu_clear(runs, 0, rows, NULL);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *r = PyList_GET_ITEM(args[0], i), *row;
        long long phys, size;
        Py_ssize_t k = qu_request(r, runs, &n, index, args[1], args[2], &phys, &size);
        if (k == QU_NOT_QUEUED)
            continue;
        if (k < 0)
            goto twin;
        row = PyTuple_Pack(5, runs[k].qkey, PyTuple_GET_ITEM(r, 2), PyTuple_GET_ITEM(r, 3),
                           PyTuple_GET_ITEM(r, 4), PyTuple_GET_ITEM(r, 5));
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            qu_clear(runs, n, rows, index);
            return NULL;
        }
        Py_DECREF(row);
    }
    return qu_result(runs, n, rows, index);
twin:
    PyErr_Clear();
    qu_clear(runs, n, rows, index);
    return fallback("queue_units", args, nargs, kwnames);
}

/* unit_blobs(rows) -> {qkey: bytearray}: queue_units' rows (qkey, qoff, phys, size, tags), each
   queue's units packed big-endian (phys i64, size i32, tags i64), in row order. */
static void
put_be(unsigned char *p, unsigned long long v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)(v & 0xFF);
}

static PyObject *
unit_blobs(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *out;
    Py_ssize_t count;
    if (kwnames != NULL || nargs != 1 || !PyList_CheckExact(args[0]) || (out = PyDict_New()) == NULL)
        return fallback("unit_blobs", args, nargs, kwnames);
    count = PyList_GET_SIZE(args[0]);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *r = PyList_GET_ITEM(args[0], i), *key, *buf;
        long long phys, size, tags;
        Py_ssize_t len;
        unsigned char *p;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 5
                || !PyLong_CheckExact(key = PyTuple_GET_ITEM(r, 0))
                || as_i64(PyTuple_GET_ITEM(r, 2), I64_MIN, I64_MAX, &phys) < 0
                || as_i64(PyTuple_GET_ITEM(r, 3), I32_MIN, I32_MAX, &size) < 0
                || as_i64(PyTuple_GET_ITEM(r, 4), I64_MIN, I64_MAX, &tags) < 0)
            goto twin;
        buf = PyDict_GetItemWithError(out, key);  /* borrowed */
        if (buf == NULL) {
            if (PyErr_Occurred() || (buf = PyByteArray_FromStringAndSize(NULL, 0)) == NULL)
                goto error;
            if (PyDict_SetItem(out, key, buf) < 0) {
                Py_DECREF(buf);
                goto error;
            }
            Py_DECREF(buf);  /* the dict holds it */
        }
        len = PyByteArray_GET_SIZE(buf);
        if (PyByteArray_Resize(buf, len + 20) < 0)
            goto error;
        p = (unsigned char *)PyByteArray_AS_STRING(buf) + len;
        put_be(p, (unsigned long long)phys, 8);
        put_be(p + 8, (unsigned long long)size, 4);
        put_be(p + 12, (unsigned long long)tags, 8);
    }
    return out;
twin:
    PyErr_Clear();
    Py_DECREF(out);
    return fallback("unit_blobs", args, nargs, kwnames);
error:
    Py_DECREF(out);
    return NULL;
}

/* ------------------------------------------------------------------ store messages from the wire */

/* prop_fields' work on bytes: (tags, keys, uniq) new references and the tag code; -1 on error. */
static int
fields_of(PyObject *raw, PyObject **tags, PyObject **keys, PyObject **uniq, long *code)
{
    const char *p = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw);
    if (named_props(p, n, tags, keys, uniq) < 0)
        return -1;
    *code = *tags == Py_None ? 0 : java_hash(*tags);
    return 0;
}

/* Slot offsets of the message class (T_OBJECT_EX member descriptors), looked up once per
   class: a fresh instance's slots are filled directly, as STORE_ATTR on a slot does. */
enum { W_TOPIC, W_TOPIC_BYTES, W_QID, W_BODY, W_PROPS, W_PROPS_RAW, W_FLAG, W_SYSFLAG, W_BORN_TS,
       W_BORN_HOST, W_STORE_HOST, W_RECONSUME, W_PREP, W_TAGS, W_KEYS, W_UNIQ, W_TAGS_CODE, W_SIZE,
       W_DISP, W_SLOTS };
typedef struct {
    PyTypeObject *type;  /* held, so the offsets can never describe another class */
    Py_ssize_t offset[W_SLOTS];
} slot_cache;

static slot_cache store_message_slots, record_view_slots;

static int
slot_offsets(slot_cache *cache, PyTypeObject *cls, PyObject *const *names, int count)
{
    if (cls == cache->type)
        return 0;
    for (int k = 0; k < count; k++) {
        PyObject *d = PyObject_GetAttr((PyObject *)cls, names[k]);  /* the descriptor itself */
        PyMemberDef *def;
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            Py_XDECREF(d);
            PyErr_Clear();
            return -1;
        }
        def = ((PyMemberDescrObject *)d)->d_member;
        Py_DECREF(d);  /* the class keeps it */
        if (def->type != T_OBJECT_EX || (def->flags & READONLY))
            return -1;
        cache->offset[k] = def->offset;
    }
    Py_INCREF(cls);
    Py_XSETREF(cache->type, cls);
    return 0;
}

static int
store_message_offsets(PyTypeObject *cls)
{
    PyObject *names[W_SLOTS] = {s_topic, s_topic_bytes, s_queue_id, s_body, s_properties, s_properties_raw,
                                s_flag, s_sys_flag, s_born_timestamp, s_born_host, s_store_host,
                                s_reconsume_times, s_prepared_tx_offset, s_tags, s_keys, s_uniq_key,
                                s_tags_code, s_size_no_crc, s_dispatchable};
    return slot_offsets(&store_message_slots, cls, names, W_SLOTS);
}

/* attrs_get's attributes (msg_attrs order) read straight from the slots of a message class
   with plain attribute lookup, as getattr would find them; -1 (nothing held): use getattr. */
static int
attrs_from_slots(PyObject *m, PyObject **v)
{
    static const int order[17] = {W_SIZE, W_DISP, W_TOPIC, W_QID, W_TOPIC_BYTES, W_FLAG, W_SYSFLAG,
                                  W_BORN_TS, W_BORN_HOST, W_STORE_HOST, W_RECONSUME, W_PREP, W_BODY,
                                  W_PROPS_RAW, W_TAGS_CODE, W_KEYS, W_UNIQ};
    if (Py_TYPE(m)->tp_getattro != PyObject_GenericGetAttr || store_message_offsets(Py_TYPE(m)) < 0) {
        PyErr_Clear();
        return -1;
    }
    for (int k = 0; k < 17; k++) {
        PyObject *x = *(PyObject **)((char *)m + store_message_slots.offset[order[k]]);
        if (x == NULL) {  /* an unset slot: getattr raises the twin's error */
            while (k--)
                Py_CLEAR(v[k]);
            return -1;
        }
        v[k] = Py_NewRef(x);
    }
    return 0;
}

static inline void
slot_put(const slot_cache *cache, PyObject *m, int k, PyObject *value)  /* steals value */
{
    PyObject **at = (PyObject **)((char *)m + cache->offset[k]);
    Py_XSETREF(*at, value);
}

#define slot_set(m, k, value) slot_put(&store_message_slots, m, k, value)

/* ------------------------------------------------------------------ put-path checks of a batch */

/* Whether m's attributes can be read straight from its slots (StoreMessage's layout, plain
   attribute lookup); then SLOT(m, k) is attribute k, NULL when unset (the twin raises). */
static int
plain_message(PyObject *m)
{
    if (Py_TYPE(m)->tp_getattro == PyObject_GenericGetAttr
            && (Py_TYPE(m) == store_message_slots.type || store_message_offsets(Py_TYPE(m)) == 0))
        return 1;
    PyErr_Clear();
    return 0;
}

#define SLOT(m, k) (*(PyObject **)((char *)(m) + store_message_slots.offset[k]))

/* len(body) of a bytes body or of a memoryview one (a batch's bodies are views of the request
   frame), else -1: the twin decides (len of a released or 0-dim view raises there). */
static Py_ssize_t
body_len(PyObject *body)
{
    Py_ssize_t n;
    if (PyBytes_CheckExact(body))
        return PyBytes_GET_SIZE(body);
    if (!PyMemoryView_Check(body))
        return -1;
    if ((n = PyObject_Size(body)) < 0)
        PyErr_Clear();
    return n;
}

static int
host_len_ok(PyObject *h)
{
    return PyBytes_GET_SIZE(h) == 8 || PyBytes_GET_SIZE(h) == 20;
}

/* 1: message m passes the put path's combined test, 0: it does not, -1: the twin decides. */
static int
message_passes(PyObject *m, PyObject *topics, long long max_body, long long max_props, long long max_queues)
{
    PyObject *body, *topic, *props, *qid, *born, *store;
    long long q;
    Py_ssize_t body_size;
    int in;
    if (!plain_message(m))
        return -1;
    body = SLOT(m, W_BODY); topic = SLOT(m, W_TOPIC); props = SLOT(m, W_PROPS_RAW);
    qid = SLOT(m, W_QID); born = SLOT(m, W_BORN_HOST); store = SLOT(m, W_STORE_HOST);
    if (body == NULL || topic == NULL || props == NULL || qid == NULL || born == NULL || store == NULL
            || (body_size = body_len(body)) < 0 || !PyUnicode_CheckExact(topic)
            || !PyBytes_CheckExact(props)
            || !PyLong_CheckExact(qid) || !PyBytes_CheckExact(born) || !PyBytes_CheckExact(store)
            || as_i64(qid, I64_MIN, I64_MAX, &q) < 0)
        return -1;
    if (body_size > max_body)
        return 0;
    if ((in = PySet_Contains(topics, topic)) < 0) {
        PyErr_Clear();
        return -1;
    }
    return in && PyBytes_GET_SIZE(props) <= max_props && q >= 0 && q < max_queues
        && host_len_ok(born) && host_len_ok(store);
}

static PyObject *
first_unchecked(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (msgs, start, topics, max_body, max_props, max_queues) -> index */
    long long start, max_body, max_props, max_queues;
    Py_ssize_t count;
    if (kwnames != NULL || nargs != 6 || !PyList_CheckExact(args[0]) || !PyAnySet_CheckExact(args[2])
            || as_i64(args[1], 0, PY_SSIZE_T_MAX, &start) < 0 || as_i64(args[3], I64_MIN, I64_MAX, &max_body) < 0
            || as_i64(args[4], I64_MIN, I64_MAX, &max_props) < 0
            || as_i64(args[5], I64_MIN, I64_MAX, &max_queues) < 0)
        return fallback("first_unchecked", args, nargs, kwnames);
    count = PyList_GET_SIZE(args[0]);
    for (Py_ssize_t k = (Py_ssize_t)start; k < count; k++) {
        int rc = message_passes(PyList_GET_ITEM(args[0], k), args[2], max_body, max_props, max_queues);
        if (rc == 0)
            return PyLong_FromSsize_t(k);
        if (rc < 0) {  /* the twin from here (it returns this index or a later one) */
            PyObject *call[6] = {args[0], NULL, args[2], args[3], args[4], args[5]}, *result;
            if ((call[1] = PyLong_FromSsize_t(k)) == NULL)
                return NULL;
            result = fallback("first_unchecked", call, 6, NULL);
            Py_DECREF(call[1]);
            return result;
        }
    }
    return PyLong_FromSsize_t(count);
}

/* The sum over msgs of what `field` (W_SIZE: size_no_crc; W_BODY: len(body)) gives: the twins
   of tidemq.node.store.commit_log.record_bytes and tidemq.node.processors.send.body_bytes.
   NULL without an error when the twin must decide (an odd message or value, an overflow). */
static PyObject *
message_sum(PyObject *msgs, int field)
{
    long long total = 0, v;
    Py_ssize_t count;
    if (!PyList_CheckExact(msgs))
        return NULL;
    count = PyList_GET_SIZE(msgs);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *m = PyList_GET_ITEM(msgs, k), *x;
        if (!plain_message(m) || (x = SLOT(m, field)) == NULL)
            return NULL;
        if (field == W_BODY) {
            if ((v = body_len(x)) < 0)
                return NULL;
        } else if (!PyLong_CheckExact(x) || as_i64(x, I64_MIN, I64_MAX, &v) < 0) {
            return NULL;
        }
        if (__builtin_add_overflow(total, v, &total))
            return NULL;
    }
    return PyLong_FromLongLong(total);
}

static PyObject *
record_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (msgs) -> sum of size_no_crc */
    PyObject *out = kwnames == NULL && nargs == 1 ? message_sum(args[0], W_SIZE) : NULL;
    return out != NULL || PyErr_Occurred() ? out : fallback("record_bytes", args, nargs, kwnames);
}

static PyObject *
body_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (msgs) -> sum of len(body) */
    PyObject *out = kwnames == NULL && nargs == 1 ? message_sum(args[0], W_BODY) : NULL;
    return out != NULL || PyErr_Occurred() ? out : fallback("body_bytes", args, nargs, kwnames);
}

#define BQ_MAX 64  /* distinct queues of one batch kept here; more: the twin */

static PyObject *
batch_queues(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (msgs) -> [(topic, queue_id)] of the dispatchable messages, distinct, first seen first */
    PyObject *topic[BQ_MAX], *qobj[BQ_MAX], *out;
    long long qid[BQ_MAX];
    Py_ssize_t n = 0, count;
    if (kwnames != NULL || nargs != 1 || !PyList_CheckExact(args[0]))
        return fallback("batch_queues", args, nargs, kwnames);
    count = PyList_GET_SIZE(args[0]);
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *m = PyList_GET_ITEM(args[0], k);
        PyObject *disp, *t, *q;
        long long v;
        Py_ssize_t j;
        if (!plain_message(m))
            return fallback("batch_queues", args, nargs, kwnames);
        disp = SLOT(m, W_DISP);
        if (disp == Py_False)
            continue;
        t = SLOT(m, W_TOPIC);
        q = SLOT(m, W_QID);
        if (disp != Py_True || t == NULL || q == NULL || !PyUnicode_CheckExact(t) || !PyLong_CheckExact(q) || as_i64(q, I64_MIN, I64_MAX, &v) < 0)
            return fallback("batch_queues", args, nargs, kwnames);
        for (j = 0; j < n; j++) {
            if (qid[j] == v && (topic[j] == t || PyUnicode_Compare(topic[j], t) == 0))
                break;
        }
        if (j < n)
            continue;
        if (n == BQ_MAX)
            return fallback("batch_queues", args, nargs, kwnames);
        topic[n] = t; qobj[n] = q; qid[n] = v;
        n++;
    }
    if ((out = PyList_New(n)) == NULL)
        return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *key = PyTuple_Pack(2, topic[j], qobj[j]);
        if (key == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, j, key);
    }
    return out;
}

/* One message; NULL with an error set, or NULL without one when the twin must decide. */
static PyObject *
wire_message(PyTypeObject *cls, PyObject *const *args, PyObject *topic_bytes, PyObject *dispatchable,
             long long base, PyObject *entry)
{
    PyObject *m, *tags, *keys, *uniq, *raw, *body, *code_obj, *size_obj;
    Py_ssize_t body_len;
    long code;
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
        return NULL;
    body = PyTuple_GET_ITEM(entry, 1);
    raw = PyTuple_GET_ITEM(entry, 2);
    if (!PyBytes_CheckExact(raw) || (body_len = PyObject_Size(body)) < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (fields_of(raw, &tags, &keys, &uniq, &code) < 0)
        return NULL;
    code_obj = PyLong_FromLong(code);
    size_obj = code_obj ? PyLong_FromLongLong(base + body_len + PyBytes_GET_SIZE(raw)) : NULL;
    m = size_obj ? cls->tp_new(cls, empty_tuple, NULL) : NULL;
    if (m == NULL) {
        Py_DECREF(tags); Py_DECREF(keys); Py_DECREF(uniq); Py_XDECREF(code_obj); Py_XDECREF(size_obj);
        return NULL;
    }
    slot_set(m, W_TOPIC, Py_NewRef(args[1]));
    slot_set(m, W_TOPIC_BYTES, Py_NewRef(topic_bytes));
    slot_set(m, W_QID, Py_NewRef(args[2]));
    slot_set(m, W_BODY, Py_NewRef(body));
    slot_set(m, W_PROPS, Py_NewRef(Py_None));
    slot_set(m, W_PROPS_RAW, Py_NewRef(raw));
    slot_set(m, W_FLAG, Py_NewRef(PyTuple_GET_ITEM(entry, 0)));
    slot_set(m, W_SYSFLAG, Py_NewRef(args[4]));
    slot_set(m, W_BORN_TS, Py_NewRef(args[5]));
    slot_set(m, W_BORN_HOST, Py_NewRef(args[6]));
    slot_set(m, W_STORE_HOST, Py_NewRef(args[7]));
    slot_set(m, W_RECONSUME, Py_NewRef(args[8]));
    slot_set(m, W_PREP, PyLong_FromLong(0));  /* a cached small int: cannot fail */
    slot_set(m, W_TAGS, tags);
    slot_set(m, W_KEYS, keys);
    slot_set(m, W_UNIQ, uniq);
    slot_set(m, W_TAGS_CODE, code_obj);
    slot_set(m, W_SIZE, size_obj);
    slot_set(m, W_DISP, Py_NewRef(dispatchable));
    return m;
}

static PyObject *
wire_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (cls, topic, queue_id, entries, sys_flag, born_timestamp, born_host, store_host,
       reconsume_times) -> [cls, ...] */
    PyObject *entries, *topic_bytes, *out, *dispatchable;
    long long sys_flag, base;
    Py_ssize_t count, topic_len;
    const char *tb;
    if (kwnames != NULL || nargs != 9 || !PyType_Check(args[0]) || store_message_offsets((PyTypeObject *)args[0]) < 0
            || !PyUnicode_CheckExact(args[1])
            || !(PyList_CheckExact(args[3]) || PyTuple_CheckExact(args[3]))
            || as_i64(args[4], I64_MIN, I64_MAX, &sys_flag) < 0
            || !PyBytes_CheckExact(args[6]) || !PyBytes_CheckExact(args[7])
            || (tb = PyUnicode_AsUTF8AndSize(args[1], &topic_len)) == NULL)
        return fallback("wire_messages", args, nargs, kwnames);
    entries = args[3];
    count = PySequence_Fast_GET_SIZE(entries);
    base = 91 + topic_len + (topic_len > 127) + (PyBytes_GET_SIZE(args[6]) == 20 ? 12 : 0)
        + (PyBytes_GET_SIZE(args[7]) == 20 ? 12 : 0);
    dispatchable = (sys_flag & 0xC) != 4 && (sys_flag & 0xC) != 0xC ? Py_True : Py_False;
    topic_bytes = PyBytes_FromStringAndSize(tb, topic_len);
    out = topic_bytes ? PyList_New(count) : NULL;
    if (out == NULL) {
        Py_XDECREF(topic_bytes);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *m = wire_message((PyTypeObject *)args[0], args, topic_bytes, dispatchable, base,
                                   PySequence_Fast_GET_ITEM(entries, k));
        if (m == NULL) {
            Py_DECREF(out);
            Py_DECREF(topic_bytes);
            if (PyErr_Occurred())
                return NULL;
            return fallback("wire_messages", args, nargs, kwnames);
        }
        PyList_SET_ITEM(out, k, m);
    }
    Py_DECREF(topic_bytes);
    return out;
}

/* ------------------------------------------------------------------ JSON remoting headers */

/* The usual shape only: {"code":int,"language":"NAME","version":int,"opaque":int,"flag":int,
   "remark":str|null,"extFields":{str:str}|null} plus other keys with scalar values (skipped).
   Anything else (floats, nested values, surrogate escapes, duplicate top-level keys, invalid
   UTF-8, numbers beyond 10 digits) is left to the twin. */

typedef struct {
    const unsigned char *p, *end;
} jcur;

static void
jws(jcur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int
hexval(unsigned char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* A string at c->p (a quote): new str, or NULL (an error set only for a real failure). */
static PyObject *
jstring(jcur *c)
{
    const unsigned char *start = ++c->p;
    unsigned char *buf, *w;
    PyObject *s;
    while (c->p < c->end && *c->p != '"' && *c->p != '\\' && *c->p >= 0x20)
        c->p++;
    if (c->p >= c->end || *c->p < 0x20)
        return NULL;
    if (*c->p == '"') {
        s = PyUnicode_DecodeUTF8((const char *)start, c->p - start, NULL);
        c->p++;
        if (s == NULL)
            PyErr_Clear();
        return s;
    }
    buf = PyMem_Malloc((size_t)(c->end - start) + 1);
    if (buf == NULL)
        return PyErr_NoMemory();
    memcpy(buf, start, (size_t)(c->p - start));
    w = buf + (c->p - start);
    while (c->p < c->end && *c->p != '"') {
        unsigned char ch = *c->p++;
        if (ch < 0x20)
            goto unsupported;
        if (ch != '\\') {
            *w++ = ch;
            continue;
        }
        if (c->p >= c->end)
            goto unsupported;
        ch = *c->p++;
        switch (ch) {
        case '"': case '\\': case '/': *w++ = ch; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            int cp = 0;
            if (c->end - c->p < 4)
                goto unsupported;
            for (int k = 0; k < 4; k++) {
                int h = hexval(c->p[k]);
                if (h < 0)
                    goto unsupported;
                cp = cp * 16 + h;
            }
            c->p += 4;
            if (cp >= 0xD800 && cp <= 0xDFFF)
                goto unsupported;  /* surrogates: the twin's sanitizing rules */
            if (cp < 0x80) {
                *w++ = (unsigned char)cp;
            } else if (cp < 0x800) {
                *w++ = (unsigned char)(0xC0 | (cp >> 6));
                *w++ = (unsigned char)(0x80 | (cp & 0x3F));
            } else {
                *w++ = (unsigned char)(0xE0 | (cp >> 12));
                *w++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                *w++ = (unsigned char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default:
            goto unsupported;
        }
    }
    if (c->p >= c->end)
        goto unsupported;
    c->p++;
    s = PyUnicode_DecodeUTF8((const char *)buf, w - buf, NULL);
    PyMem_Free(buf);
    if (s == NULL)
        PyErr_Clear();
    return s;
unsupported:
    PyMem_Free(buf);
    return NULL;
}

/* An int of at most 10 digits (JSON grammar: no leading zeros): 0 and *out, else -1. */
static int
jint(jcur *c, long long *out)
{
    const unsigned char *start = c->p;
    long long v = 0;
    int neg = 0, digits = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits <= 10) {
        v = v * 10 + (*c->p++ - '0');
        digits++;
    }
    if (digits == 0 || digits > 10 || (digits > 1 && start[neg] == '0'))
        return -1;
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E' || (*c->p >= '0' && *c->p <= '9')))
        return -1;
    *out = neg ? -v : v;
    return 0;
}

static int
jliteral(jcur *c, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return -1;
    c->p += n;
    return 0;
}

/* extFields keys repeat on every frame (a send has the same dozen): the first KEY_CACHE distinct
   short printable-ASCII keys are kept, interned, and handed out again, which saves a decode, an
   allocation and a hash per key. Most values repeat too (a producer's group, topic, flags; a
   broker's region): under each cached key the last short printable-ASCII value is kept and
   handed out again when the next one has the same bytes. Other text is decoded as any string. */
#define KEY_CACHE 64
#define KEY_CACHE_MAX_LEN 40
#define VALUE_CACHE_MAX_LEN 64
static PyObject *key_cache[KEY_CACHE];
static PyObject *key_last_value[KEY_CACHE];
static int key_cache_n;

/* The length of the plain (unescaped printable-ASCII) string at c->p, or -1 if it is not. */
static Py_ssize_t
jplain(const jcur *c)
{
    const unsigned char *start = c->p + 1, *q = start;
    while (q < c->end && *q != '"' && *q != '\\' && *q >= 0x20 && *q < 0x7F)
        q++;
    return q < c->end && *q == '"' ? q - start : -1;
}

/* Whether `s` (a cached printable-ASCII str, or NULL) has exactly the n bytes at start. */
static inline int
same_text(PyObject *s, const unsigned char *start, Py_ssize_t n)
{
    return s != NULL && PyUnicode_GET_LENGTH(s) == n && memcmp(PyUnicode_DATA(s), start, (size_t)n) == 0;
}

/* The plain string of n bytes at c->p, the cursor moved past it: new reference or NULL. */
static PyObject *
jtake(jcur *c, Py_ssize_t n)
{
    PyObject *s = PyUnicode_FromStringAndSize((const char *)c->p + 1, n);
    if (s != NULL)
        c->p += n + 2;
    return s;
}

/* A key: new reference (NULL: jstring's verdict); *slot = its cache index or -1. */
static PyObject *
jkey(jcur *c, int *slot)
{
    Py_ssize_t n = jplain(c);
    PyObject *s;
    *slot = -1;
    if (n < 0 || n > KEY_CACHE_MAX_LEN)
        return jstring(c);
    for (int k = 0; k < key_cache_n; k++) {
        if (same_text(key_cache[k], c->p + 1, n)) {
            c->p += n + 2;
            *slot = k;
            return Py_NewRef(key_cache[k]);
        }
    }
    if ((s = jtake(c, n)) != NULL && key_cache_n < KEY_CACHE) {
        PyUnicode_InternInPlace(&s);
        *slot = key_cache_n;
        key_cache[key_cache_n++] = Py_NewRef(s);
    }
    return s;
}

/* The value under cached key `slot`: the last one again when the bytes are the same. */
static PyObject *
jvalue(jcur *c, int slot)
{
    Py_ssize_t n = jplain(c);
    PyObject *s;
    if (slot < 0 || n < 0 || n > VALUE_CACHE_MAX_LEN)
        return jstring(c);
    if (same_text(key_last_value[slot], c->p + 1, n)) {
        c->p += n + 2;
        return Py_NewRef(key_last_value[slot]);
    }
    if ((s = jtake(c, n)) != NULL)
        Py_XSETREF(key_last_value[slot], Py_NewRef(s));
    return s;
}

/* extFields' object of string values: new dict, or NULL (error set only for real failures). */
static PyObject *
jext(jcur *c)
{
    PyObject *ext = PyDict_New();
    if (ext == NULL)
        return NULL;
    c->p++;
    jws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return ext;
    }
    for (;;) {
        PyObject *k, *v;
        int slot;
        jws(c);
        if (c->p >= c->end || *c->p != '"' || (k = jkey(c, &slot)) == NULL)
            goto fail;
        jws(c);
        if (c->p >= c->end || *c->p++ != ':') {
            Py_DECREF(k);
            goto fail;
        }
        jws(c);
        if (c->p >= c->end || *c->p != '"' || (v = jvalue(c, slot)) == NULL) {
            Py_DECREF(k);
            goto fail;
        }
        if (PyDict_SetItem(ext, k, v) < 0) {
            Py_DECREF(k); Py_DECREF(v);
            goto fail;
        }
        Py_DECREF(k); Py_DECREF(v);
        jws(c);
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == '}') {
            c->p++;
            return ext;
        }
        goto fail;
    }
fail:
    Py_DECREF(ext);
    return NULL;
}

enum { J_CODE, J_LANG, J_VERSION, J_OPAQUE, J_FLAG, J_REMARK, J_EXT, J_FIELDS };

/* A scalar value of an unknown key: skipped. -1: not a scalar (the twin decides). */
static int
jskip(jcur *c)
{
    long long ignored;
    if (c->p < c->end && *c->p == '"') {
        PyObject *s = jstring(c);
        if (s == NULL)
            return -1;
        Py_DECREF(s);
        return 0;
    }
    if (jliteral(c, "true") == 0 || jliteral(c, "false") == 0 || jliteral(c, "null") == 0)
        return 0;
    return jint(c, &ignored);
}

/* One "key": value of the top level into vals; -1: the twin decides. */
static int
jmember(jcur *c, PyObject **vals, int *seen)
{
    static const char *names[J_FIELDS] = {"code", "language", "version", "opaque", "flag", "remark", "extFields"};
    const unsigned char *key;
    size_t key_len;
    int which = -1;
    long long v;
    if (c->p >= c->end || *c->p != '"')
        return -1;
    key = ++c->p;
    while (c->p < c->end && *c->p != '"' && *c->p != '\\' && *c->p >= 0x20)
        c->p++;
    if (c->p >= c->end || *c->p != '"')
        return -1;  /* escaped or odd key */
    key_len = (size_t)(c->p++ - key);
    for (int k = 0; k < J_FIELDS; k++)
        if (strlen(names[k]) == key_len && memcmp(names[k], key, key_len) == 0)
            which = k;
    jws(c);
    if (c->p >= c->end || *c->p++ != ':')
        return -1;
    jws(c);
    if (which < 0)
        return jskip(c);
    if (seen[which]++)
        return -1;  /* duplicate top-level key */
    if (jliteral(c, "null") == 0) {
        if (which == J_CODE)
            return -1;
        vals[which] = which == J_REMARK || which == J_LANG ? Py_NewRef(Py_None)
            : which == J_EXT ? PyDict_New() : PyLong_FromLong(0);
        return vals[which] ? 0 : -1;
    }
    if (which == J_LANG || which == J_REMARK) {
        if (c->p >= c->end || *c->p != '"')
            return -1;
        vals[which] = jstring(c);
    } else if (which == J_EXT) {
        if (c->p >= c->end || *c->p != '{')
            return -1;
        vals[which] = jext(c);
    } else {
        if (jint(c, &v) < 0 || v < I32_MIN || v > I32_MAX)
            return -1;
        vals[which] = PyLong_FromLongLong(v);
    }
    return vals[which] ? 0 : -1;
}

/* The fields of a JSON header in p[0:n) into vals (J_FIELDS new references, defaults filled in
   as the twin fills them): 0, or -1 with vals cleared (an error set only for a real failure). */
static int
jheader(const unsigned char *p, Py_ssize_t n, PyObject **vals)
{
    int seen[J_FIELDS] = {0};
    jcur c;
    for (int k = 0; k < J_FIELDS; k++)
        vals[k] = NULL;
    c.p = p;
    c.end = p + n;
    jws(&c);
    if (c.p >= c.end || *c.p++ != '{')
        goto slow;
    jws(&c);
    if (c.p < c.end && *c.p == '}') {
        c.p++;
    } else {
        for (;;) {
            jws(&c);
            if (jmember(&c, vals, seen) < 0)
                goto slow;
            jws(&c);
            if (c.p < c.end && *c.p == ',') {
                c.p++;
                continue;
            }
            if (c.p < c.end && *c.p++ == '}')
                break;
            goto slow;
        }
    }
    jws(&c);
    if (c.p != c.end || vals[J_CODE] == NULL)
        goto slow;
    for (int k = J_VERSION; k <= J_FLAG; k++)
        if (vals[k] == NULL && (vals[k] = PyLong_FromLong(0)) == NULL)
            goto slow;
    if (vals[J_LANG] == NULL)
        vals[J_LANG] = Py_NewRef(Py_None);
    if (vals[J_REMARK] == NULL)
        vals[J_REMARK] = Py_NewRef(Py_None);
    if (vals[J_EXT] == NULL && (vals[J_EXT] = PyDict_New()) == NULL)
        goto slow;
    return 0;
slow:
    for (int k = 0; k < J_FIELDS; k++)
        Py_CLEAR(vals[k]);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_MemoryError))
        PyErr_Clear();
    return -1;
}

static PyObject *
json_header_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *vals[J_FIELDS], *result;
    if (kwnames != NULL || nargs != 1 || !PyBytes_CheckExact(args[0]))
        return fallback("json_header_fields", args, nargs, kwnames);
    if (jheader((const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_GET_SIZE(args[0]), vals) < 0)
        return PyErr_Occurred() ? NULL : fallback("json_header_fields", args, nargs, kwnames);
    result = PyTuple_Pack(7, vals[J_CODE], vals[J_LANG], vals[J_VERSION], vals[J_OPAQUE], vals[J_FLAG],
                          vals[J_REMARK], vals[J_EXT]);
    for (int k = 0; k < J_FIELDS; k++)
        Py_DECREF(vals[k]);
    return result;
}

/* ------------------------------------------------------------------ remoting frames */

/* decode_frames(src, pos, max_frame_bytes) -> (commands, pos): the twin of tidemq.protocol.
   remoting.decode_frames. JSON headers of the usual shape with a known language name only; any
   other frame (a ROCKETMQ header, an odd JSON header, a bad length) sends the whole call to the
   twin, which decodes or raises exactly as it would have alone. The command class, the
   language table and SerializeType.JSON come from Python (accel.provide). */
enum { C_CODE, C_LANG, C_VERSION, C_OPAQUE, C_FLAG, C_REMARK, C_EXT, C_BODY, C_STYPE, C_SLOTS };
static slot_cache command_slots;

static int
command_offsets(PyTypeObject *cls)
{
    static PyObject *names[C_SLOTS];
    if (names[0] == NULL) {
        const char *text[C_SLOTS] = {"code", "language", "version", "opaque", "flag", "remark", "ext",
                                     "body", "serialize_type"};
        for (int k = 0; k < C_SLOTS; k++)
            if ((names[k] = PyUnicode_InternFromString(text[k])) == NULL)
                return -1;
    }
    return slot_offsets(&command_slots, cls, names, C_SLOTS);
}

/* One command from a checked frame: new reference, NULL with an error, or NULL without one
   (not the usual shape: the twin decides). */
static PyObject *
json_command(PyTypeObject *cls, PyObject *langs, PyObject *json_type, const unsigned char *head,
             Py_ssize_t head_len, Py_ssize_t body_len)
{
    PyObject *vals[J_FIELDS], *lang, *body, *cmd;
    if (jheader(head, head_len, vals) < 0)
        return NULL;
    lang = PyUnicode_CheckExact(vals[J_LANG]) ? PyDict_GetItemWithError(langs, vals[J_LANG]) : NULL;
    body = lang ? PyBytes_FromStringAndSize((const char *)head + head_len, body_len) : NULL;
    cmd = body ? cls->tp_new(cls, empty_tuple, NULL) : NULL;
    if (cmd == NULL) {
        Py_XDECREF(body);
        for (int k = 0; k < J_FIELDS; k++)
            Py_DECREF(vals[k]);
        return NULL;
    }
    slot_put(&command_slots, cmd, C_CODE, vals[J_CODE]);
    slot_put(&command_slots, cmd, C_LANG, Py_NewRef(lang));
    Py_DECREF(vals[J_LANG]);
    slot_put(&command_slots, cmd, C_VERSION, vals[J_VERSION]);
    slot_put(&command_slots, cmd, C_OPAQUE, vals[J_OPAQUE]);
    slot_put(&command_slots, cmd, C_FLAG, vals[J_FLAG]);
    slot_put(&command_slots, cmd, C_REMARK, vals[J_REMARK]);
    slot_put(&command_slots, cmd, C_EXT, vals[J_EXT]);
    slot_put(&command_slots, cmd, C_BODY, body);
    slot_put(&command_slots, cmd, C_STYPE, Py_NewRef(json_type));
    return cmd;
}

static PyObject *
decode_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *cls, *langs, *json_type, *out = NULL, *result = NULL;
    long long pos, max_frame;
    const unsigned char *p;
    Py_buffer b;
    if (kwnames != NULL || nargs != 3 || as_i64(args[1], 0, PY_SSIZE_T_MAX, &pos) < 0
            || as_i64(args[2], 8, I32_MAX + 4, &max_frame) < 0
            || (cls = PyDict_GetItemString(fallbacks, "RemotingCommand")) == NULL
            || (langs = PyDict_GetItemString(fallbacks, "LANG_BY_NAME")) == NULL
            || (json_type = PyDict_GetItemString(fallbacks, "SERIALIZE_JSON")) == NULL
            || !PyType_Check(cls) || !PyDict_CheckExact(langs)
            || command_offsets((PyTypeObject *)cls) < 0)
        return fallback("decode_frames", args, nargs, kwnames);
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return fallback("decode_frames", args, nargs, kwnames);
    p = (const unsigned char *)b.buf;
    if (pos > b.len || (out = PyList_New(0)) == NULL)
        goto slow;
    while (b.len - pos >= 4) {
        long long length = get32(p + pos), end = pos + 4 + length;
        uint32_t word;
        Py_ssize_t head_len;
        PyObject *cmd;
        if (length < 4 || length + 4 > max_frame)
            goto slow;  /* the twin raises */
        if (end > b.len)
            break;
        word = (uint32_t)get32(p + pos + 4);  /* end > b.len unless 8 bytes are there */
        head_len = (Py_ssize_t)(word & 0xFFFFFF);
        if ((word >> 24) != 0 || head_len > end - pos - 8)
            goto slow;
        cmd = json_command((PyTypeObject *)cls, langs, json_type, p + pos + 8, head_len,
                           (Py_ssize_t)(end - pos - 8 - head_len));
        if (cmd == NULL || PyList_Append(out, cmd) < 0) {
            Py_XDECREF(cmd);
            goto slow;
        }
        Py_DECREF(cmd);
        pos = end;
    }
    result = Py_BuildValue("(NL)", out, pos);
    PyBuffer_Release(&b);
    return result;
slow:
    Py_XDECREF(out);
    PyBuffer_Release(&b);
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_MemoryError))
        return NULL;
    return fallback("decode_frames", args, nargs, kwnames);
}

/* ------------------------------------------------------------------ pull bodies */

enum { V_BUF, V_POS, V_QOFF, V_BROKER, V_REC, V_BODY, V_TOPIC_OVERRIDE, V_SLOTS };

static PyObject *
record_views(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (cls, body, broker_name) -> [cls(body, pos, queue_offset, broker_name), ...] */
    static PyObject *names[V_SLOTS];
    const unsigned char *b;
    Py_ssize_t size, pos = 0;
    PyObject *out;
    if (names[0] == NULL) {
        const char *text[V_SLOTS] = {"_buf", "_pos", "queue_offset", "broker_name", "_rec", "_body", "topic_override"};
        for (int k = 0; k < V_SLOTS; k++)
            if ((names[k] = PyUnicode_InternFromString(text[k])) == NULL)
                return NULL;
    }
    if (kwnames != NULL || nargs != 3 || !PyType_Check(args[0]) || !PyBytes_CheckExact(args[1])
            || slot_offsets(&record_view_slots, (PyTypeObject *)args[0], names, V_SLOTS) < 0)
        return fallback("record_views", args, nargs, kwnames);
    b = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    size = PyBytes_GET_SIZE(args[1]);
    for (Py_ssize_t at = 0; at < size;) {  /* check every size first: a bad body is the twin's */
        int32_t total;
        if (size - at < 91 || (total = get32(b + at)) < 91 || at + total > size)
            return fallback("record_views", args, nargs, kwnames);
        at += total;
    }
    if ((out = PyList_New(0)) == NULL)
        return NULL;
    while (pos < size) {
        int32_t total = get32(b + pos);
        PyObject *v = ((PyTypeObject *)args[0])->tp_new((PyTypeObject *)args[0], empty_tuple, NULL);
        PyObject *p = v ? PyLong_FromSsize_t(pos) : NULL;
        PyObject *q = p ? PyLong_FromLongLong((long long)(((uint64_t)(uint32_t)get32(b + pos + 20) << 32)
                                                          | (uint32_t)get32(b + pos + 24))) : NULL;
        if (q == NULL || PyList_Append(out, v) < 0) {
            Py_XDECREF(v); Py_XDECREF(p); Py_XDECREF(q);
            Py_DECREF(out);
            return NULL;
        }
        slot_put(&record_view_slots, v, V_BUF, Py_NewRef(args[1]));
        slot_put(&record_view_slots, v, V_POS, p);
        slot_put(&record_view_slots, v, V_QOFF, q);
        slot_put(&record_view_slots, v, V_BROKER, Py_NewRef(args[2]));
        slot_put(&record_view_slots, v, V_REC, Py_NewRef(Py_None));
        slot_put(&record_view_slots, v, V_BODY, Py_NewRef(Py_None));
        slot_put(&record_view_slots, v, V_TOPIC_OVERRIDE, Py_NewRef(Py_None));
        Py_DECREF(v);
        pos += total;
    }
    return out;
}

/* ------------------------------------------------------------------ module */

/* A compiled twin: fast call with keywords (they always go to the pure twin), doc = twin's home. */
/* ------------------------------------------------------------------ send replies */

/* offset_msg_ids(host, requests, start, count, field): the offsetMsgIds (hex of host + the
big-endian 8-byte offset at requests[i][field]) of requests[start:start + count], joined with
",". Lists of tuples and non-negative offsets here; anything else: the twin. */
static PyObject *
offset_msg_ids(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char hex[] = "0123456789ABCDEF";
    long long start, count, field;
    Py_ssize_t host_len, id_len, i, k;
    const unsigned char *host;
    PyObject *reqs, *out;
    char *dst;

    if (kwnames != NULL || nargs != 5 || !PyBytes_CheckExact(args[0]) || !PyList_CheckExact(args[1])
            || as_i64(args[2], 0, PY_SSIZE_T_MAX, &start) < 0
            || as_i64(args[3], 1, 1 << 20, &count) < 0
            || as_i64(args[4], 0, 64, &field) < 0)
        return fallback("offset_msg_ids", args, nargs, kwnames);
    reqs = args[1];
    if (start + count > PyList_GET_SIZE(reqs))
        return fallback("offset_msg_ids", args, nargs, kwnames);
    host = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    host_len = PyBytes_GET_SIZE(args[0]);
    for (i = start; i < start + count; i++) {  /* check everything before allocating */
        PyObject *r = PyList_GET_ITEM(reqs, i);
        long long v;
        if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) <= field
                || as_i64(PyTuple_GET_ITEM(r, field), 0, I64_MAX, &v) < 0)
            return fallback("offset_msg_ids", args, nargs, kwnames);
    }
    id_len = 2 * host_len + 16;
    out = PyUnicode_New(count * (id_len + 1) - 1, 127);
    if (out == NULL)
        return NULL;
    dst = (char *)PyUnicode_1BYTE_DATA(out);
    for (i = start; i < start + count; i++) {
        unsigned long long v = (unsigned long long)PyLong_AsLongLong(
            PyTuple_GET_ITEM(PyList_GET_ITEM(reqs, i), field));
        if (i > start)
            *dst++ = ',';
        for (k = 0; k < host_len; k++) {
            *dst++ = hex[host[k] >> 4];
            *dst++ = hex[host[k] & 15];
        }
        for (k = 15; k >= 0; k--)
            dst[15 - k] = hex[(v >> (4 * k)) & 15];
        dst += 16;
    }
    return out;
}

/* ------------------------------------------------------------------ pull and query replies */

/* join_records(records, host): the records concatenated, each with STOREHOST = host (the twin
is tidemq.node.processors.store_host.join_records, rules there). A list of bytes records long
enough to hold their STOREHOST and an 8- or 20-byte host here; anything else: the twin. Pass 1
checks every record and sizes the reply, pass 2 copies. */
#define SH_V4_AT 64       /* STOREHOST after an 8-byte born host; +12 for an IPv6 one */
#define SH_POS_SYSFLAG 36
#define SH_BORN_V6 0x10
#define SH_STORE_V6 0x20

static PyObject *
join_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *recs, *out;
    const unsigned char *host;
    Py_ssize_t host_len, n, i, total = 0;
    unsigned char *dst;
    (void)self;
    if (kwnames != NULL || nargs != 2 || !PyList_CheckExact(args[0]) || !PyBytes_CheckExact(args[1]))
        return fallback("join_records", args, nargs, kwnames);
    recs = args[0];
    host = (const unsigned char *)PyBytes_AS_STRING(args[1]);
    host_len = PyBytes_GET_SIZE(args[1]);
    if (host_len != 8 && host_len != 20)
        return fallback("join_records", args, nargs, kwnames);
    n = PyList_GET_SIZE(recs);
    for (i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        const unsigned char *b;
        int32_t sysflag;
        Py_ssize_t at, old_len;
        if (!PyBytes_CheckExact(r))
            return fallback("join_records", args, nargs, kwnames);
        b = (const unsigned char *)PyBytes_AS_STRING(r);
        if (PyBytes_GET_SIZE(r) < SH_V4_AT)
            return fallback("join_records", args, nargs, kwnames);
        sysflag = get32(b + SH_POS_SYSFLAG);
        at = SH_V4_AT + ((sysflag & SH_BORN_V6) ? 12 : 0);
        old_len = (sysflag & SH_STORE_V6) ? 20 : 8;
        if (PyBytes_GET_SIZE(r) < at + old_len  /* the twin's slices would cut short: its output */
                || PyBytes_GET_SIZE(r) + host_len - old_len > I32_MAX)  /* its TOTALSIZE raises */
            return fallback("join_records", args, nargs, kwnames);
        total += PyBytes_GET_SIZE(r) + host_len - old_len;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(recs, i);
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(r);
        Py_ssize_t len = PyBytes_GET_SIZE(r), at, old_len, size;
        int32_t sysflag = get32(b + SH_POS_SYSFLAG);
        at = SH_V4_AT + ((sysflag & SH_BORN_V6) ? 12 : 0);
        old_len = (sysflag & SH_STORE_V6) ? 20 : 8;
        size = len + host_len - old_len;
        memcpy(dst, b, (size_t)at);
        memcpy(dst + at, host, (size_t)host_len);
        memcpy(dst + at + host_len, b + at + old_len, (size_t)(len - at - old_len));
        if (old_len != host_len) {  /* IPv4 <-> IPv6: TOTALSIZE and SYSFLAG follow */
            sysflag = host_len == 20 ? (sysflag | SH_STORE_V6) : (sysflag & ~SH_STORE_V6);
            put32(dst, (uint32_t)size);
            put32(dst + SH_POS_SYSFLAG, (uint32_t)sysflag);
        }
        dst += size;
    }
    return out;
}

/* ------------------------------------------------------------------ a dispatch slice into the tails */

/* slice_units(requests, queues, blocked, tails) -> {(topic, qid): next offset} or None: the twin of
   tidemq.node.store.queue_table.slice_units, which is queue_units, unit_blobs and took_runs in
   turn. Here the runs are found as queue_units finds them (nothing changes until every request
   passed), then every run's units are packed into one C buffer and appended to its queue's tail
   and staged in the same loop: no rows, no per-queue blob, no runs dict, no Python loop, which
   over thousands of queues (every run one unit) cost more than the units themselves. The
   staged-entry head is STAGE_HEAD (>qqI); the stage limit is provided by Python. */
static PyObject *su_tail, *su_min_qoff, *su_head_phys, *su_max_phys_end, *su_held, *su_big,
    *su_pending, *su_nbytes;

static int
su_names(void)
{
    if (su_tail != NULL)
        return 0;
#define SU_INTERN(v, text) if ((v = PyUnicode_InternFromString(text)) == NULL) return -1
    SU_INTERN(su_min_qoff, "min_queue_offset"); SU_INTERN(su_head_phys, "head_phys");
    SU_INTERN(su_max_phys_end, "max_phys_end"); SU_INTERN(su_held, "held"); SU_INTERN(su_big, "big");
    SU_INTERN(su_pending, "pending"); SU_INTERN(su_nbytes, "nbytes"); SU_INTERN(su_tail, "tail");
#undef SU_INTERN
    return 0;
}

typedef struct {
    long long phys, size, tags;
    Py_ssize_t run;  /* its run, -1: not queued */
} su_unit;

typedef struct {
    Py_ssize_t units, at;   /* units in the run; its first byte in the packed buffer */
    long long qkey, first;
    int empty;              /* the queue's tail holds nothing yet */
} su_run;

/* Pass 1: every request's run (queue_units' checks, nothing changed); -1: the twin decides. */
static int
su_runs(PyObject *requests, PyObject *queues, PyObject *blocked, qu_run *runs, Py_ssize_t *n,
        PyObject *index, su_unit *u)
{
    Py_ssize_t count = PyList_GET_SIZE(requests);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *r = PyList_GET_ITEM(requests, i);
        Py_ssize_t k = qu_request(r, runs, n, index, queues, blocked, &u[i].phys, &u[i].size);
        u[i].run = -1;
        if (k == QU_NOT_QUEUED)
            continue;
        if (k < 0 || u[i].size > I32_MAX  /* unit_blobs' twin raises: so does ours */
                || as_i64(PyTuple_GET_ITEM(r, 5), I64_MIN, I64_MAX, &u[i].tags) < 0)
            return -1;
        u[i].run = k;
    }
    return 0;
}

/* Before anything changes: each run's queue has a tail took_runs can extend, and its staged
   head packs; the units are packed run by run into buf. -1 when the twin decides. */
static int
su_pack(qu_run *runs, Py_ssize_t n, su_run *s, su_unit *u, Py_ssize_t count, unsigned char **buf)
{
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *tail = PyObject_GetAttr(runs[k].cq, su_tail);
        int ok = tail != NULL && ((PyBytes_CheckExact(tail) && PyBytes_GET_SIZE(tail) == 0)
                                  || PyByteArray_CheckExact(tail));
        s[k].empty = ok && PyObject_Length(tail) == 0;
        Py_XDECREF(tail);
        if (!ok || as_i64(runs[k].qkey, I64_MIN, I64_MAX, &s[k].qkey) < 0
                || as_i64(runs[k].first, I64_MIN, I64_MAX, &s[k].first) < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (u[i].run >= 0)
            s[u[i].run].units++;
    for (Py_ssize_t k = 0; k < n; k++) {
        s[k].at = at;
        at += s[k].units * 20;
    }
    if ((*buf = PyMem_Malloc(at > 0 ? (size_t)at : 1)) == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (u[i].run < 0)
            continue;
        su_run *r = &s[u[i].run];
        unsigned char *p = *buf + r->at;
        put_be(p, (unsigned long long)u[i].phys, 8);
        put_be(p + 8, (unsigned long long)u[i].size, 4);
        put_be(p + 12, (unsigned long long)u[i].tags, 8);
        r->at += 20;
    }
    for (Py_ssize_t k = 0; k < n; k++)
        s[k].at -= s[k].units * 20;
    return 0;
}

static int
su_extend(PyObject *ba, const unsigned char *data, Py_ssize_t len)
{
    Py_ssize_t old = PyByteArray_GET_SIZE(ba);
    if (PyByteArray_Resize(ba, old + len) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(ba) + old, data, (size_t)len);
    return 0;
}

/* took_runs for run k: the units into the queue's tail, staged or the tail marked big. */
static int
su_take(qu_run *q, su_run *s, const unsigned char *data, PyObject *held, PyObject *big,
        PyObject *pending, long long stage_limit)
{
    Py_ssize_t len = s->units * 20, tail_len;
    PyObject *tail, *v;
    int rc;
    if ((v = PyObject_GetAttr(q->cq, su_min_qoff)) == NULL)
        return -1;
    rc = PyObject_RichCompareBool(q->first, v, Py_EQ);
    Py_DECREF(v);
    if (rc < 0 || (rc == 1 && PyObject_SetAttr(q->cq, su_head_phys, q->first_phys) < 0))
        return -1;
    if (s->empty) {  /* an idle queue's tail is the shared empty bytes: it becomes the units */
        if ((tail = PyByteArray_FromStringAndSize((const char *)data, len)) == NULL)
            return -1;
        rc = PyObject_SetAttr(q->cq, su_tail, tail) < 0 || PyDict_SetItem(held, q->qkey, q->cq) < 0;
        tail_len = len;
        Py_DECREF(tail);
        if (rc)
            return -1;
    } else {
        if ((tail = PyObject_GetAttr(q->cq, su_tail)) == NULL || !PyByteArray_CheckExact(tail)
                || su_extend(tail, data, len) < 0) {
            if (tail != NULL && !PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a consume-queue tail changed type");
            Py_XDECREF(tail);
            return -1;
        }
        tail_len = PyByteArray_GET_SIZE(tail);
        Py_DECREF(tail);
    }
    if (tail_len < stage_limit) {
        unsigned char head[20];
        put_be(head, (unsigned long long)s->qkey, 8);
        put_be(head + 8, (unsigned long long)s->first, 8);
        put_be(head + 16, (unsigned long long)s->units, 4);
        if (su_extend(pending, head, 20) < 0 || su_extend(pending, data, len) < 0)
            return -1;
    } else if (PyDict_SetItem(big, q->qkey, q->cq) < 0) {
        return -1;
    }
    if ((v = PyLong_FromLongLong(q->next)) == NULL)
        return -1;
    rc = PyObject_SetAttr(q->cq, s_max_queue_offset, v);
    Py_DECREF(v);
    if (rc < 0 || (v = PyLong_FromLongLong(q->end)) == NULL)
        return -1;
    rc = PyObject_SetAttr(q->cq, su_max_phys_end, v);
    Py_DECREF(v);
    return rc;
}

/* Pass 2: every run taken (nothing refused from here; an error leaves earlier runs taken, as
   the twin's would), tails.nbytes moved, and {key: next offset}. */
static PyObject *
su_apply(qu_run *runs, su_run *s, Py_ssize_t n, const unsigned char *buf, PyObject *tails,
         PyObject *held, PyObject *big, PyObject *pending, long long stage_limit)
{
    PyObject *out = PyDict_New(), *v, *total;
    long long added = 0;
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        if (su_take(&runs[k], &s[k], buf + s[k].at, held, big, pending, stage_limit) < 0)
            Py_CLEAR(out);
        added += s[k].units * 20;
    }
    if (out == NULL || n == 0)
        return out;
    {
        PyObject *more = PyLong_FromLongLong(added);
        v = more ? PyObject_GetAttr(tails, su_nbytes) : NULL;
        total = v ? PyNumber_Add(v, more) : NULL;
        Py_XDECREF(more);
        Py_XDECREF(v);
        if (total == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (PyObject_SetAttr(tails, su_nbytes, total) < 0)
        Py_CLEAR(out);
    Py_DECREF(total);
    for (Py_ssize_t k = 0; out != NULL && k < n; k++) {
        int bad = (v = PyLong_FromLongLong(runs[k].next)) == NULL || PyDict_SetItem(out, runs[k].key, v) < 0;
        Py_XDECREF(v);
        if (bad)
            Py_CLEAR(out);
    }
    return out;
}

static PyObject *
slice_units(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* (requests, queues, blocked, tails) -> {key: next offset} or None */
    PyObject *limit, *held = NULL, *big = NULL, *pending = NULL, *index = NULL, *out = NULL;
    long long stage_limit;
    Py_ssize_t count, n = 0;
    qu_run *runs = NULL;
    su_run *s = NULL;
    su_unit *u = NULL;
    unsigned char *buf = NULL;
    int twin = 1;
    if (kwnames != NULL || nargs != 4 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])
            || !PyDict_CheckExact(args[2]) || su_names() < 0
            || (limit = PyDict_GetItemString(fallbacks, "slice_units:stage_limit")) == NULL
            || as_i64(limit, 0, I64_MAX, &stage_limit) < 0)
        return fallback("slice_units", args, nargs, kwnames);
    count = PyList_GET_SIZE(args[0]);
    held = PyObject_GetAttr(args[3], su_held);
    big = held ? PyObject_GetAttr(args[3], su_big) : NULL;
    pending = big ? PyObject_GetAttr(args[3], su_pending) : NULL;
    runs = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(qu_run));
    s = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(su_run));
    u = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(su_unit));
    index = PyDict_New();
    if (pending != NULL && PyDict_CheckExact(held) && PyDict_CheckExact(big) && PyByteArray_CheckExact(pending)
            && runs != NULL && s != NULL && u != NULL && index != NULL
            && su_runs(args[0], args[1], args[2], runs, &n, index, u) == 0
            && su_pack(runs, n, s, u, count, &buf) == 0) {
        twin = 0;
        out = su_apply(runs, s, n, buf, args[3], held, big, pending, stage_limit);
    }
    if (runs != NULL)
        qu_clear(runs, n, NULL, index);
    else
        Py_XDECREF(index);
    PyMem_Free(s);
    PyMem_Free(u);
    PyMem_Free(buf);
    Py_XDECREF(held);
    Py_XDECREF(big);
    Py_XDECREF(pending);
    return twin ? fallback("slice_units", args, nargs, kwnames) : out;
}

#define TWIN(name, home) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL | METH_KEYWORDS, home "." #name}

static PyMethodDef methods[] = {
    {"set_fallback", set_fallback, METH_VARARGS, "set_fallback(name, fn): register a pure twin"},
    {"crc32", (PyCFunction)(void (*)(void))crc32_py, METH_FASTCALL, "zlib.crc32(data, value=0)"},
    TWIN(encode_into, "tidemq.protocol.record"),
    TWIN(decode_properties, "tidemq.protocol.record"),
    TWIN(prop_fields, "tidemq.protocol.record"),
    TWIN(decode_batch, "tidemq.node.processors.send"),
    TWIN(encode_batch_body, "tidemq.producer.send_codec"),
    TWIN(bare_batch_body, "tidemq.producer.send_codec"),
    TWIN(json_send_head, "tidemq.producer.send_codec"),
    TWIN(typed_request, "tidemq.node.requests.parse"),
    TWIN(json_reply_frame, "tidemq.node.processors.send_reply"),
    TWIN(from_client, "tidemq.node.system_properties"),
    TWIN(decode_binary_ext, "tidemq.protocol.remoting"),
    TWIN(json_header_fields, "tidemq.protocol.remoting"),
    TWIN(decode_frames, "tidemq.protocol.remoting"),
    TWIN(index_entries, "tidemq.node.store.index_file"),
    TWIN(append_records, "tidemq.node.store.commit_log"),
    TWIN(first_unchecked, "tidemq.node.store.message_store"),
    TWIN(batch_queues, "tidemq.node.store.message_store"),
    TWIN(record_bytes, "tidemq.node.store.commit_log"),
    TWIN(body_bytes, "tidemq.node.processors.send"),
    TWIN(queue_units, "tidemq.node.store.dispatch"),
    TWIN(unit_blobs, "tidemq.node.store.queue_table"),
    TWIN(slice_units, "tidemq.node.store.queue_table"),
    TWIN(wire_messages, "tidemq.node.store.message"),
    TWIN(record_views, "tidemq.message"),
    TWIN(offset_msg_ids, "tidemq.node.processors.send"),
    TWIN(join_records, "tidemq.node.processors.store_host"),
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "Compiled twins of TideMQ codec functions; see client/protocol/accel.py.", -1, methods,
};

static int add_pipeline_functions(PyObject *m);  /* the pipeline block at the end */

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *m;
    crc_init();
    crc_detect();
    x2n_init();
    if (intern_names() < 0 || bare_intern() < 0)
        return NULL;
    fallbacks = PyDict_New();
    if (fallbacks == NULL)
        return NULL;
    m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddObjectRef(m, "_fallbacks", fallbacks) < 0
                      || add_pipeline_functions(m) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* ================================================================== pipeline: pull replies
   A block of its own (with its own method table, added in PyInit__speedups) so the send-path
   functions above and this one change independently.

   decode_reply_into(buf, end_offset, cols): the twin of tidemq.pipeline.reply_columns.
   decode_reply_into; the column layout is documented there. Pass 1 walks the records with the
   twin's checks (any failure: the twin raises), pass 2 grows every bytearray once and writes. */

enum {
    RC_OFFSETS, RC_BORN_MS, RC_STORED_MS, RC_BODY_OFF, RC_BODY_DATA, RC_ID_OFF, RC_ID_DATA,
    RC_TAGS_OFF, RC_TAGS_DATA, RC_TAGS_VALID, RC_KEYS_OFF, RC_KEYS_DATA, RC_KEYS_VALID,
    RC_MAP_OFF, RC_PKEY_OFF, RC_PKEY_DATA, RC_PVAL_OFF, RC_PVAL_DATA, RC_COMPRESSED, RC_NCOLS
};

typedef struct {
    Py_ssize_t pos, body_at, body_end, props_at, props_end;
    int64_t qoff, born, store_ts;
    int32_t sysflag;
} rc_record;

static inline int64_t rc_get64(const unsigned char *p)
{
    return (int64_t)(((uint64_t)(uint32_t)get32(p) << 32) | (uint32_t)get32(p + 4));
}

/* (*out)[n] = *r, growing *out (*cap records) when full; -1 with MemoryError set. */
static int
rc_push(rc_record **out, Py_ssize_t *cap, Py_ssize_t n, const rc_record *r)
{
    if (n == *cap) {
        Py_ssize_t grown = *cap ? *cap * 2 : 256;
        rc_record *more = PyMem_Realloc(*out, (size_t)grown * sizeof(rc_record));
        if (more == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *out = more;
        *cap = grown;
    }
    (*out)[n] = *r;
    return 0;
}

/* Pass 1: the twin's _scan. Returns the number of records (filled into *out, grown as
   needed), or -1 when the twin must run (it raises), or -2 with a MemoryError set. */
static Py_ssize_t
rc_scan(const unsigned char *b, Py_ssize_t size, int has_end, int64_t end_offset,
        rc_record **out, Py_ssize_t *cap)
{
    Py_ssize_t pos = 0, n = 0;
    while (pos < size) {
        rc_record r;
        int32_t total, body_len, props_len;
        uint32_t magic;
        Py_ssize_t p, rec_end;
        if (size - pos < 91)
            return -1;
        total = get32(b + pos);
        magic = (uint32_t)get32(b + pos + 4);
        if ((magic != 0xDAA320A7u && magic != 0xDAA320ABu) || total < 91 || pos + total > size)
            return -1;
        r.qoff = rc_get64(b + pos + 20);
        if (has_end && r.qoff >= end_offset)
            break;
        rec_end = pos + total;
        r.sysflag = get32(b + pos + 36);
        r.born = rc_get64(b + pos + 40);
        r.store_ts = rc_get64(b + pos + 56);
        body_len = get32(b + pos + 84);
        p = pos + 88;
        if (r.sysflag & 0x30) {
            Py_ssize_t ts_at = pos + 48 + ((r.sysflag & 0x10) ? 20 : 8);
            p = ts_at + 8 + ((r.sysflag & 0x20) ? 20 : 8) + 12;
            if (p + 4 > rec_end)
                return -1;
            r.store_ts = rc_get64(b + ts_at);
            body_len = get32(b + p);
            p += 4;
        }
        if (body_len < 0 || p + body_len + 2 > rec_end)
            return -1;
        r.pos = pos;
        r.body_at = p;
        r.body_end = p + body_len;
        if (magic == 0xDAA320A7u)
            r.props_at = r.body_end + 1 + b[r.body_end];
        else
            r.props_at = r.body_end + 2 + get16(b + r.body_end);
        if (r.props_at <= r.body_end || r.props_at + 2 > rec_end)
            return -1;
        props_len = get16(b + r.props_at);
        if (props_len < 0 || r.props_at + 2 + props_len > rec_end)
            return -1;
        r.props_at += 2;
        r.props_end = r.props_at + props_len;
        if (rc_push(out, cap, n++, &r) < 0)
            return -2;
        pos = rec_end;
    }
    return n;
}

typedef struct {
    PyObject *col[RC_NCOLS];
    Py_ssize_t used[RC_NCOLS];  /* bytes written so far */
    Py_ssize_t old[RC_NCOLS];   /* lengths before this call */
} rc_cols;

static inline void rc_put(rc_cols *c, int i, const void *src, Py_ssize_t len)
{
    memcpy(PyByteArray_AS_STRING(c->col[i]) + c->used[i], src, (size_t)len);
    c->used[i] += len;
}

static inline void rc_put32(rc_cols *c, int i, int32_t v) { rc_put(c, i, &v, 4); }

/* value bytes to column `data`, its end to `off` */
static inline void rc_str(rc_cols *c, int off, int data, const unsigned char *src, Py_ssize_t len)
{
    rc_put(c, data, src, len);
    rc_put32(c, off, (int32_t)c->used[data]);
}

static void
rc_offset_id(rc_cols *c, const unsigned char *b, const rc_record *r)
{
    static const char hex[] = "0123456789ABCDEF";
    unsigned char raw[28], text[56];
    Py_ssize_t at = r->pos + 56 + ((r->sysflag & 0x10) ? 20 : 8);
    Py_ssize_t host = (r->sysflag & 0x20) ? 20 : 8, i;
    memcpy(raw, b + at, (size_t)host);
    memcpy(raw + host, b + r->pos + 28, 8);  /* big-endian in the record, as the id wants */
    for (i = 0; i < host + 8; i++) {
        text[2 * i] = (unsigned char)hex[raw[i] >> 4];
        text[2 * i + 1] = (unsigned char)hex[raw[i] & 15];
    }
    rc_str(c, RC_ID_OFF, RC_ID_DATA, text, 2 * (host + 8));
}

static void
rc_write(rc_cols *c, const unsigned char *b, const rc_record *r, int32_t row)
{
    const unsigned char *named[3] = {NULL, NULL, NULL};  /* UNIQ_KEY, TAGS, KEYS values */
    Py_ssize_t named_len[3] = {0, 0, 0}, s = r->props_at;
    int32_t kept = 0, map_end;
    int k;
    rc_put(c, RC_OFFSETS, &r->qoff, 8);
    rc_put(c, RC_BORN_MS, &r->born, 8);
    rc_put(c, RC_STORED_MS, &r->store_ts, 8);
    rc_str(c, RC_BODY_OFF, RC_BODY_DATA, b + r->body_at, r->body_end - r->body_at);
    if (r->sysflag & 0x1)
        rc_put32(c, RC_COMPRESSED, row);
    while (s <= r->props_end) {  /* the pairs, as bytes.split(b"\x02") cuts them */
        const unsigned char *e = memchr(b + s, 2, (size_t)(r->props_end - s));
        Py_ssize_t end = e ? e - b : r->props_end;
        const unsigned char *x = memchr(b + s, 1, (size_t)(end - s));
        if (x != NULL) {
            Py_ssize_t nlen = x - (b + s), vlen = end - (x - b) - 1;
            if (!(nlen == 8 && memcmp(b + s, "__CRC32#", 8) == 0)) {
                rc_str(c, RC_PKEY_OFF, RC_PKEY_DATA, b + s, nlen);
                rc_str(c, RC_PVAL_OFF, RC_PVAL_DATA, x + 1, vlen);
                kept++;
                k = (nlen == 8 && memcmp(b + s, "UNIQ_KEY", 8) == 0) ? 0
                    : (nlen == 4 && memcmp(b + s, "TAGS", 4) == 0) ? 1
                    : (nlen == 4 && memcmp(b + s, "KEYS", 4) == 0) ? 2 : -1;
                if (k >= 0) {
                    named[k] = x + 1;
                    named_len[k] = vlen;
                }
            }
        }
        s = end + 1;
    }
    memcpy(&map_end, PyByteArray_AS_STRING(c->col[RC_MAP_OFF]) + c->used[RC_MAP_OFF] - 4, 4);
    rc_put32(c, RC_MAP_OFF, map_end + kept);
    if (named[0] != NULL)
        rc_str(c, RC_ID_OFF, RC_ID_DATA, named[0], named_len[0]);
    else
        rc_offset_id(c, b, r);
    for (k = 1; k <= 2; k++) {
        int off = k == 1 ? RC_TAGS_OFF : RC_KEYS_OFF;
        unsigned char valid = named[k] != NULL;
        rc_str(c, off, off + 1, named[k] ? named[k] : (const unsigned char *)"", named_len[k]);
        rc_put(c, off + 2, &valid, 1);
    }
}

/* Grow every column to hold the worst case of `recs`; on failure restore them all. */
static int
rc_grow(rc_cols *c, const rc_record *recs, Py_ssize_t n)
{
    Py_ssize_t body = 0, props = 0, i, need[RC_NCOLS];
    for (i = 0; i < n; i++) {
        body += recs[i].body_end - recs[i].body_at;
        props += recs[i].props_end - recs[i].props_at;
    }
    need[RC_OFFSETS] = need[RC_BORN_MS] = need[RC_STORED_MS] = 8 * n;
    need[RC_BODY_OFF] = need[RC_ID_OFF] = need[RC_TAGS_OFF] = need[RC_KEYS_OFF] = 4 * n;
    need[RC_MAP_OFF] = need[RC_COMPRESSED] = 4 * n;
    need[RC_TAGS_VALID] = need[RC_KEYS_VALID] = n;
    need[RC_BODY_DATA] = body;
    need[RC_ID_DATA] = 56 * n + props;
    need[RC_TAGS_DATA] = need[RC_KEYS_DATA] = need[RC_PKEY_DATA] = need[RC_PVAL_DATA] = props;
    need[RC_PKEY_OFF] = need[RC_PVAL_OFF] = 4 * (props + n);  /* a pair ends at \x02 or the end */
    for (i = 0; i < RC_NCOLS; i++) {
        if (PyByteArray_Resize(c->col[i], c->old[i] + need[i]) < 0) {
            while (--i >= 0)
                PyByteArray_Resize(c->col[i], c->old[i]);
            return -1;
        }
    }
    return 0;
}

static PyObject *
decode_reply_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const int data_cols[4] = {RC_BODY_DATA, RC_ID_DATA, RC_PKEY_DATA, RC_PVAL_DATA};
    Py_buffer view;
    rc_cols c;
    rc_record *recs = NULL;
    Py_ssize_t cap = 0, n, i, data_max = 0, grow = 0;
    int64_t end_offset = 0;
    int has_end, overflow = 0;
    (void)self;
    if (kwnames != NULL || nargs != 3 || !PyList_CheckExact(args[2])
        || PyList_GET_SIZE(args[2]) != RC_NCOLS)
        return fallback("decode_reply_into", args, nargs, kwnames);
    has_end = args[1] != Py_None;
    if (has_end) {
        if (!PyLong_CheckExact(args[1]))
            return fallback("decode_reply_into", args, nargs, kwnames);
        end_offset = PyLong_AsLongLongAndOverflow(args[1], &overflow);
        if (overflow || (end_offset == -1 && PyErr_Occurred()))
            return fallback("decode_reply_into", args, nargs, kwnames);
    }
    for (i = 0; i < RC_NCOLS; i++) {
        c.col[i] = PyList_GET_ITEM(args[2], i);
        if (!PyByteArray_CheckExact(c.col[i]))
            return fallback("decode_reply_into", args, nargs, kwnames);
        c.old[i] = c.used[i] = PyByteArray_GET_SIZE(c.col[i]);
    }
    if (c.old[RC_MAP_OFF] < 4 || c.old[RC_OFFSETS] % 8
        || PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return fallback("decode_reply_into", args, nargs, kwnames);
    n = rc_scan(view.buf, view.len, has_end, end_offset, &recs, &cap);
    for (i = 0; i < n; i++)
        grow += recs[i].body_end - recs[i].body_at + 2 * (recs[i].props_end - recs[i].props_at) + 56;
    for (i = 0; i < 4; i++)
        data_max = c.old[data_cols[i]] > data_max ? c.old[data_cols[i]] : data_max;
    if (n == -1 || (n > 0 && data_max + grow > INT32_MAX)) {
        PyMem_Free(recs);
        PyBuffer_Release(&view);
        return fallback("decode_reply_into", args, nargs, kwnames);
    }
    if (n == -2 || (n > 0 && rc_grow(&c, recs, n) < 0)) {
        PyMem_Free(recs);
        PyBuffer_Release(&view);
        return NULL;
    }
    for (i = 0; i < n; i++)
        rc_write(&c, view.buf, &recs[i], (int32_t)(c.old[RC_OFFSETS] / 8 + i));
    for (i = 0; n > 0 && i < RC_NCOLS; i++)
        PyByteArray_Resize(c.col[i], c.used[i]);  /* shrinking: cannot fail */
    PyMem_Free(recs);
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(n);
}

static PyMethodDef pipeline_methods[] = {
    TWIN(decode_reply_into, "tidemq.pipeline.reply_columns"),
    {NULL, NULL, 0, NULL},
};

static int
add_pipeline_functions(PyObject *m)
{
    return PyModule_AddFunctions(m, pipeline_methods);
}
