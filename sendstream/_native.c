/*
 * The native batch scanner: walks every complete command of a send stream
 * in a buffer with one call. Framing, length limit, CRC-32C (CPU CRC
 * instructions where present) and the TLV checks, driven by tables the
 * Python side passes in from sendstream.format, so the layout is declared
 * only there. Anything unusual (an error, an unknown command or attribute,
 * a restart header) stops the scan at that command: the Python reference
 * path then handles that one command and raises or reports exactly as it
 * always does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define HAVE_X86_CRC 1
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define HAVE_ARM_CRC 1
#endif

#define MAX_VERSION 3
#define MAX_ATTR 64
#define MAX_CMD 64
#define CMD_HDR 10
#define TLV_HDR 4
#define A_DATA 19
#define C_END 21

enum { ST_NEED = 0, ST_END = 1, ST_STOP = 2, ST_FULL = 3 };

/* Filled by configure() from sendstream.format. */
static int attr_size[MAX_VERSION + 1][MAX_ATTR]; /* -2 unknown, -1 variable, else fixed size */
static uint64_t required[MAX_VERSION + 1][MAX_CMD]; /* bitmask of attribute numbers */
static uint8_t cmd_known[MAX_VERSION + 1][MAX_CMD];
static int configured;

/* ---- CRC-32C, reflected, no pre/post inversion (the kernel's raw crc32c) ---- */
static uint32_t table[8][256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
              table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^ table[2][(v >> 40) & 0xff] ^
              table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return crc;
}

/*
 * Raw CRC-32C is linear: crc(c, A || B) = shift(crc(c, A), |B|) ^ crc(0, B),
 * where shift multiplies by x^(8 |B|) modulo the polynomial. That lets long
 * buffers run as three independent instruction chains (the crc32 instruction
 * has a latency of three cycles and a throughput of one).
 */
static uint32_t x2k[32]; /* x^(2^k) mod P, reflected */

static uint32_t gf_mul(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
        if (a & bit)
            product ^= b;
        b = b & 1 ? (b >> 1) ^ 0x82F63B78u : b >> 1;
    }
    return product;
}

static void shift_init(void)
{
    uint32_t p = 1u << 30; /* x^1 */
    for (int k = 0; k < 32; k++) {
        x2k[k] = p;
        p = gf_mul(p, p);
    }
}

/* x^(8 n) mod P */
static uint32_t shift_factor(size_t n)
{
    uint32_t p = 1u << 31; /* x^0 */
    for (unsigned k = 3; n; n >>= 1, k++)
        if (n & 1)
            p = gf_mul(x2k[k & 31], p);
    return p;
}

/* Long buffers go in rounds of three BLOCK-byte lanes; shifting a CRC by
 * BLOCK bytes is a linear map, done with four table lookups. */
#define BLOCK 8192
static uint32_t shift_block[4][256];

static void shift_block_init(void)
{
    uint32_t factor = shift_factor(BLOCK);
    for (int i = 0; i < 4; i++)
        for (uint32_t b = 0; b < 256; b++)
            shift_block[i][b] = gf_mul(factor, b << (8 * i));
}

static inline uint32_t shift_by_block(uint32_t c)
{
    return shift_block[0][c & 0xff] ^ shift_block[1][(c >> 8) & 0xff] ^ shift_block[2][(c >> 16) & 0xff] ^
           shift_block[3][c >> 24];
}

#if defined(HAVE_X86_CRC)
#define TARGET_CRC __attribute__((target("sse4.2")))
#define CRC64(c, v) _mm_crc32_u64((c), (v))
#define CRC8(c, v) _mm_crc32_u8((c), (v))
#elif defined(HAVE_ARM_CRC)
#define TARGET_CRC
#define CRC64(c, v) __crc32cd((uint32_t)(c), (v))
#define CRC8(c, v) __crc32cb((c), (v))
#endif

#ifdef TARGET_CRC
TARGET_CRC static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n >= 3 * BLOCK) {
        uint64_t c0 = crc, c1 = 0, c2 = 0;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t v0, v1, v2;
            memcpy(&v0, p + i, 8);
            memcpy(&v1, p + BLOCK + i, 8);
            memcpy(&v2, p + 2 * BLOCK + i, 8);
            c0 = CRC64(c0, v0);
            c1 = CRC64(c1, v1);
            c2 = CRC64(c2, v2);
        }
        crc = shift_by_block(shift_by_block((uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * BLOCK;
        n -= 3 * BLOCK;
    }
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = CRC64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = CRC8(c32, *p++);
    return c32;
}
#endif

static uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t) = crc_table;
static const char *crc_name = "slicing-by-8 table";

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* 1 when the command at p (payload len bytes) passes every check, else 0. */
static int command_ok(const uint8_t *p, uint32_t len, uint16_t cmd, int version)
{
    static const uint8_t zero[4];
    uint32_t crc = crc_fn(0, p, 6);
    crc = crc_fn(crc, zero, 4);
    crc = crc_fn(crc, p + CMD_HDR, len);
    if (crc != le32(p + 6))
        return 0;
    if (cmd >= MAX_CMD || !cmd_known[version][cmd])
        return 0;
    const uint8_t *t = p + CMD_HDR, *end = t + len;
    uint64_t seen = 0;
    while (t < end) {
        size_t left = (size_t)(end - t);
        uint16_t type;
        size_t vlen;
        if (version >= 2 && left >= 2 && le16(t) == A_DATA) {
            type = A_DATA;
            vlen = left - 2;
            t = end;
        } else {
            if (left < TLV_HDR)
                return 0;
            type = le16(t);
            vlen = le16(t + 2);
            if (vlen > left - TLV_HDR)
                return 0;
            t += TLV_HDR + vlen;
        }
        if (type >= MAX_ATTR)
            return 0;
        int size = attr_size[version][type];
        if (size == -2 || (size >= 0 && (size_t)size != vlen))
            return 0;
        if (seen & (1ull << type))
            return 0;
        seen |= 1ull << type;
    }
    return (required[version][cmd] & ~seen) == 0;
}

typedef struct {
    Py_buffer view;
    int have;
} optbuf;

static int get_out(PyObject *obj, optbuf *b, Py_ssize_t itemsize, const char *what)
{
    b->have = 0;
    if (obj == Py_None)
        return 0;
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    b->have = 1;
    if (b->view.itemsize != itemsize && !(b->view.itemsize == 1 && b->view.len % itemsize == 0)) {
        PyErr_Format(PyExc_TypeError, "%s must hold %zd-byte items", what, itemsize);
        return -1;
    }
    return 0;
}

/*
 * scan(buffer, pos, version, max_len, offsets=None, cmds=None, lens=None, base=0)
 *   -> (pos, status, need, count, nbytes)
 */
static PyObject *scan(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"buffer", "pos", "version", "max_len", "offsets", "cmds", "lens", "base", NULL};
    Py_buffer in;
    Py_ssize_t pos;
    int version;
    unsigned long long max_len, base = 0;
    PyObject *o_off = Py_None, *o_cmd = Py_None, *o_len = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*niK|OOOK", kwlist, &in, &pos, &version, &max_len, &o_off,
                                     &o_cmd, &o_len, &base))
        return NULL;
    optbuf off = {0}, cmds = {0}, lens = {0};
    PyObject *result = NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
        goto out;
    }
    if (version < 1 || version > MAX_VERSION || pos < 0 || pos > in.len) {
        PyErr_SetString(PyExc_ValueError, "bad version or position");
        goto out;
    }
    if (get_out(o_off, &off, 8, "offsets") < 0 || get_out(o_cmd, &cmds, 2, "cmds") < 0 ||
        get_out(o_len, &lens, 4, "lens") < 0)
        goto out;
    Py_ssize_t cap = PY_SSIZE_T_MAX;
    if (off.have && off.view.len / 8 < cap) cap = off.view.len / 8;
    if (cmds.have && cmds.view.len / 2 < cap) cap = cmds.view.len / 2;
    if (lens.have && lens.view.len / 4 < cap) cap = lens.view.len / 4;

    const uint8_t *buf = in.buf;
    Py_ssize_t end = in.len, count = 0, need = 0;
    unsigned long long nbytes = 0;
    int status = ST_NEED;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        Py_ssize_t avail = end - pos;
        if (avail < CMD_HDR) {
            status = ST_NEED;
            need = CMD_HDR;
            break;
        }
        const uint8_t *p = buf + pos;
        uint32_t len = le32(p);
        uint16_t cmd = le16(p + 4);
        if (len > max_len) {
            status = ST_STOP;
            break;
        }
        Py_ssize_t total = CMD_HDR + (Py_ssize_t)len;
        if (avail < total) {
            status = ST_NEED;
            need = total;
            break;
        }
        if (count >= cap) {
            status = ST_FULL;
            break;
        }
        if (!command_ok(p, len, cmd, version)) {
            status = ST_STOP;
            break;
        }
        if (off.have) ((uint64_t *)off.view.buf)[count] = base + (uint64_t)pos;
        if (cmds.have) ((uint16_t *)cmds.view.buf)[count] = cmd;
        if (lens.have) ((uint32_t *)lens.view.buf)[count] = len;
        count++;
        nbytes += (unsigned long long)total;
        pos += total;
        if (cmd == C_END) {
            status = ST_END;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("niniK", pos, status, need, count, nbytes);
out:
    if (off.have) PyBuffer_Release(&off.view);
    if (cmds.have) PyBuffer_Release(&cmds.view);
    if (lens.have) PyBuffer_Release(&lens.view);
    PyBuffer_Release(&in);
    return result;
}

/* configure(attr_sizes, known_commands, required): the tables, per version 1..3. */
static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *sizes, *known, *req;
    if (!PyArg_ParseTuple(args, "OOO", &sizes, &known, &req))
        return NULL;
    for (int v = 1; v <= MAX_VERSION; v++) {
        for (int a = 0; a < MAX_ATTR; a++)
            attr_size[v][a] = -2;
        memset(cmd_known[v], 0, sizeof cmd_known[v]);
        memset(required[v], 0, sizeof required[v]);
        PyObject *vs = PyDict_GetItemWithError(sizes, PyLong_FromLong(v));
        PyObject *vk = PyDict_GetItemWithError(known, PyLong_FromLong(v));
        if (!vs || !vk)
            goto bad;
        PyObject *key, *value;
        Py_ssize_t i = 0;
        while (PyDict_Next(vs, &i, &key, &value)) {
            long a = PyLong_AsLong(key);
            if (a < 0 || a >= MAX_ATTR)
                goto bad;
            attr_size[v][a] = value == Py_None ? -1 : (int)PyLong_AsLong(value);
        }
        i = 0;
        while (PyDict_Next(vk, &i, &key, &value)) {
            long c = PyLong_AsLong(key);
            if (c < 0 || c >= MAX_CMD)
                goto bad;
            cmd_known[v][c] = 1;
            required[v][c] = PyLong_AsUnsignedLongLong(PyDict_GetItem(req, key));
        }
        if (PyErr_Occurred())
            return NULL;
    }
    configured = 1;
    Py_RETURN_NONE;
bad:
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "bad format tables");
    return NULL;
}

static PyObject *crc32c_py(PyObject *self, PyObject *args)
{
    Py_buffer in;
    unsigned int crc = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &in, &crc))
        return NULL;
    uint32_t r;
    Py_BEGIN_ALLOW_THREADS
    r = crc_fn(crc, in.buf, (size_t)in.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    return PyLong_FromUnsignedLong(r);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS,
     "Walk and check every complete command from pos; stop at END, a partial or an unusual command."},
    {"configure", configure, METH_VARARGS, "Load the format tables from sendstream.format."},
    {"crc32c", crc32c_py, METH_VARARGS, "crc32c(data, crc=0): the btrfs CRC-32C."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "Native batch scanner.", -1, methods};

PyMODINIT_FUNC PyInit__native(void)
{
    crc_init();
    shift_init();
    shift_block_init();
#ifdef HAVE_X86_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        crc_fn = crc_hw;
        crc_name = "x86-64 SSE4.2 crc32";
    }
#elif defined(HAVE_ARM_CRC)
    crc_fn = crc_hw;
    crc_name = "ARMv8 crc32c";
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "CRC", crc_name) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
