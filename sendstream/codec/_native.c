/*
 * The native batch scanner: walks every complete command of a send stream
 * in a buffer with one call. Framing, length limit, CRC-32C (CPU CRC
 * instructions where present) and the TLV checks, driven by the constants and
 * tables of _layout.h, which `python -m sendstream.format` generates from
 * sendstream/format/declarations.py, so the layout is declared only there.
 * Anything unusual (an error, an unknown command or attribute,
 * a restart header) stops the scan at that command: the Python reference
 * path then handles that one command and raises or reports exactly as it
 * always does.
 */
#define PY_SSIZE_T_CLEAN
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE
#include <Python.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#include "_layout.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the native scanner reads little-endian fields in place; big-endian hosts use the Python path"
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* SSE4.2 crc32, PCLMULQDQ, AVX-512 VPCLMULQDQ: each used under its target attribute */
#define HAVE_X86_CRC 1
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#define HAVE_ARM_CRC 1
#endif

enum { ST_NEED = 0, ST_END = 1, ST_STOP = 2, ST_FULL = 3 };

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

#if defined(HAVE_X86_CRC)
/*
 * Folding with carry-less multiplication (VPCLMULQDQ on AVX-512: four 128-bit
 * lanes a register, four registers, 256 bytes a round). An accumulator of 128
 * bits stands for the message so far, the polynomial of its bytes in the
 * reflected order (byte 0's bit 0 the highest power). Moving it d bits further
 * multiplies it by x^d modulo P: its first 64 bits by x^(64+d-1) and its last by
 * x^(d-1) (the -1: a reflected carry-less product comes out one place up),
 * then the bytes d bits further are XORed in. Once under 16 bytes are left,
 * the crc32 instruction reduces the accumulator's 16 bytes to the CRC and goes
 * on over the tail: crc(0, A || T) is what the folding kept equal.
 */
#define FOLD_MIN 1024 /* shorter buffers: the three crc32 lanes, no set-up */

static __m128i fold_by[4]; /* x^(64+d-1), x^(d-1) mod P for d = 16, 32, 48, 64 bytes */
static __m128i fold_256;   /* d = 256 bytes: a round of four registers */

/* x^m mod P, as the high half of a reflected 64-bit operand */
static uint64_t fold_factor(uint64_t m)
{
    uint32_t p = 1u << 31; /* x^0 */
    for (unsigned k = 0; m; m >>= 1, k++)
        if (m & 1)
            p = gf_mul(x2k[k], p);
    return (uint64_t)p << 32;
}

static __m128i fold_pair(uint64_t bytes)
{
    uint64_t d = 8 * bytes;
    return _mm_set_epi64x((long long)fold_factor(d - 1), (long long)fold_factor(64 + d - 1));
}

static void fold_init(void)
{
    for (int i = 0; i < 4; i++)
        fold_by[i] = fold_pair(16 * (uint64_t)(i + 1));
    fold_256 = fold_pair(256);
}

__attribute__((target("pclmul,sse4.2"))) static inline __m128i fold16(__m128i acc, __m128i k, __m128i next)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(acc, k, 0x00), _mm_clmulepi64_si128(acc, k, 0x11)), next);
}

__attribute__((target("avx512f,vpclmulqdq"))) static inline __m512i fold64(__m512i acc, __m512i k, __m512i next)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00), _mm512_clmulepi64_epi128(acc, k, 0x11),
                                     next, 0x96); /* a ^ b ^ c */
}

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) static uint32_t crc_vpclmul(uint32_t crc, const uint8_t *p,
                                                                                        size_t n)
{
    if (n < FOLD_MIN)
        return crc_hw(crc, p, n);
    __m512i a0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_castsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i a1 = _mm512_loadu_si512(p + 64), a2 = _mm512_loadu_si512(p + 128), a3 = _mm512_loadu_si512(p + 192);
    p += 256;
    n -= 256;
    __m512i k = _mm512_broadcast_i32x4(fold_256);
    for (; n >= 256; p += 256, n -= 256) {
        a0 = fold64(a0, k, _mm512_loadu_si512(p));
        a1 = fold64(a1, k, _mm512_loadu_si512(p + 64));
        a2 = fold64(a2, k, _mm512_loadu_si512(p + 128));
        a3 = fold64(a3, k, _mm512_loadu_si512(p + 192));
    }
    k = _mm512_broadcast_i32x4(fold_by[3]);
    __m512i a = fold64(fold64(fold64(a0, k, a1), k, a2), k, a3);
    for (; n >= 64; p += 64, n -= 64)
        a = fold64(a, k, _mm512_loadu_si512(p));
    /* its four lanes into one: each moved on to the last (by 48, 32 and 16 bytes) and XORed in */
    __m128i x = _mm512_extracti32x4_epi32(a, 3);
    x = fold16(_mm512_extracti32x4_epi32(a, 2), fold_by[0], x);
    x = fold16(_mm512_extracti32x4_epi32(a, 1), fold_by[1], x);
    x = fold16(_mm512_extracti32x4_epi32(a, 0), fold_by[2], x);
    for (; n >= 16; p += 16, n -= 16)
        x = fold16(x, fold_by[0], _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    return crc_hw((uint32_t)c, p, n);
}
#endif

/* The kernels this processor has, fastest last; crc_fn is the fastest, unless use_crc() chose another. */
struct crc_kernel {
    const char *key, *name;
    uint32_t (*fn)(uint32_t, const uint8_t *, size_t);
};
static struct crc_kernel kernels[3] = {{"table", "slicing-by-8 table", crc_table}};
static int kernel_count = 1;

static uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t) = crc_table;
static const char *crc_name = "slicing-by-8 table";

static inline uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The fields of the command header at p. */
static inline uint32_t command_len(const uint8_t *p) { return le32(p + COMMAND_HEADER_LEN_OFFSET); }
static inline uint16_t command_number(const uint8_t *p) { return le16(p + COMMAND_HEADER_CMD_OFFSET); }
static inline uint32_t command_crc(const uint8_t *p) { return le32(p + COMMAND_HEADER_CRC_OFFSET); }

typedef struct {
    uint64_t seen; /* bitmask of the attribute numbers present */
    const uint8_t *val[MAX_ATTR];
    uint32_t len[MAX_ATTR];
} attrs_t;

/* 1 when the CRC of the command at p (payload len bytes) is right. */
static int crc_ok(const uint8_t *p, uint32_t len)
{
    static const uint8_t zero[COMMAND_HEADER_SIZE - COMMAND_HEADER_CRC_OFFSET]; /* the CRC field, last */
    uint32_t crc = crc_fn(0, p, COMMAND_HEADER_CRC_OFFSET);
    crc = crc_fn(crc, zero, sizeof zero);
    crc = crc_fn(crc, p + COMMAND_HEADER_SIZE, len);
    return crc == command_crc(p);
}

/* A lenient check lets unknown commands (kept raw, their TLVs unparsed) and
 * unknown attributes through and counts them: the Python side then only
 * counts such problems (it keeps the first hundred itself), so a stream of
 * millions of them costs no more than a clean one. */
enum { LENIENT_COMMANDS = 1, LENIENT_ATTRS = 2, LENIENT_STRICT = 4 }; /* strict: one problem per command */
typedef struct {
    const uint8_t *lo, *hi; /* the buffer */
    int flags;
    uint64_t commands, attrs; /* let through */
} lenient_t;

/* 1 when a stream header may start in the command at p (or in the 12 bytes
 * before it), where the Python side looks for a restart in a command it
 * does not take as clean, or when the buffer ends too soon to tell: such a
 * command is left to the Python side. */
static int magic_near(const lenient_t *l, const uint8_t *p, uint32_t len)
{
    const uint8_t *end = p + COMMAND_HEADER_SIZE + len;
    if (l->hi - end < (Py_ssize_t)sizeof STREAM_MAGIC)
        return 1;
    const uint8_t *from = p - l->lo >= (Py_ssize_t)sizeof STREAM_MAGIC ? p - (sizeof STREAM_MAGIC - 1) : l->lo;
    const uint8_t *found = memmem(from, (size_t)(end + sizeof STREAM_MAGIC - 1 - from), STREAM_MAGIC, sizeof STREAM_MAGIC);
    return found != NULL && found < end;
}

/* Attribute numbers above MAX_ATTR seen in the command being checked (a
 * lenient check must find their duplicates too); cleared after each command. */
static __thread uint64_t big_seen[65536 / 64];

static const uint8_t *next_tlv(const uint8_t *t, const uint8_t *end, int version, uint16_t *type, size_t *vlen)
{
    size_t left = (size_t)(end - t);
    if (version >= 2 && left >= TLV_TYPE_SIZE && le16(t + TLV_HEADER_TYPE_OFFSET) == A_DATA) {
        *type = A_DATA;
        *vlen = left - TLV_TYPE_SIZE;
        return end;
    }
    if (left < TLV_HEADER_SIZE)
        return NULL;
    *type = le16(t + TLV_HEADER_TYPE_OFFSET);
    *vlen = le16(t + TLV_HEADER_LEN_OFFSET);
    if (*vlen > left - TLV_HEADER_SIZE)
        return NULL;
    return t + TLV_HEADER_SIZE + *vlen;
}

static void clear_big(const uint8_t *t, const uint8_t *stop, const uint8_t *end, int version)
{
    uint16_t type;
    size_t vlen;
    while (t < stop && (t = next_tlv(t, end, version, &type, &vlen)) != NULL)
        big_seen[type / 64] &= ~(1ull << (type % 64));
}

/* The TLV rules; with a, the attribute values are recorded there; with l,
 * unknown commands and attributes may pass (and are counted there). */
static int tlvs_ok(const uint8_t *p, uint32_t len, uint16_t cmd, int version, attrs_t *a, lenient_t *l)
{
    if (cmd >= MAX_CMD || !COMMAND_KNOWN[version][cmd]) {
        if (!l || !(l->flags & LENIENT_COMMANDS) || magic_near(l, p, len))
            return 0;
        l->commands++;
        return 1;
    }
    const uint8_t *first = p + COMMAND_HEADER_SIZE, *t = first, *end = first + len;
    uint64_t seen = 0, seen_unknown = 0, unknown = 0;
    int ok = 1, big = 0;
    while (t < end) {
        uint16_t type;
        size_t vlen;
        const uint8_t *next = next_tlv(t, end, version, &type, &vlen);
        if (!next) {
            ok = 0;
            break;
        }
        int size = type < MAX_ATTR ? ATTRIBUTE_SIZE[version][type] : -2;
        if (size == -2) {
            if (!l || !(l->flags & LENIENT_ATTRS)) {
                ok = 0;
                break;
            }
            uint64_t *bits = type < MAX_ATTR ? &seen_unknown : &big_seen[type / 64];
            uint64_t bit = 1ull << (type % 64);
            big |= type >= MAX_ATTR;
            if (*bits & bit) {
                ok = 0;
                break;
            }
            *bits |= bit;
            unknown++;
            t = next;
            continue;
        }
        if (size >= 0 && (size_t)size != vlen) {
            ok = 0;
            break;
        }
        if (seen & (1ull << type)) {
            ok = 0;
            break;
        }
        if ((STRING_ATTRIBUTES >> type & 1) && memchr(next - vlen, 0, vlen)) {
            ok = 0; /* unusual: the Python side reports it where it must (verify) */
            break;
        }
        seen |= 1ull << type;
        if (a) {
            a->val[type] = next - vlen;
            a->len[type] = (uint32_t)vlen;
        }
        t = next;
    }
    if (big)
        clear_big(first, t, end, version);
    if (!ok || (REQUIRED_ATTRIBUTES[cmd] & ~seen) != 0 || (unknown && magic_near(l, p, len)))
        return 0;
    if (a)
        a->seen = seen;
    if (l)
        l->attrs += (l->flags & LENIENT_STRICT) ? unknown > 0 : unknown;
    return 1;
}


/* ---- framing, then checking, in two passes ---- */

typedef struct {
    Py_ssize_t pos, need;
    int status;
} stop_t;

/* Frames complete commands from pos, recording where each starts, until END
 * (included), a partial command (NEED), a length over the limit (STOP) or
 * cap commands (FULL). */
static size_t frame(const uint8_t *buf, Py_ssize_t end, Py_ssize_t pos, unsigned long long max_len, size_t cap,
                    Py_ssize_t *starts, stop_t *stop)
{
    size_t n = 0;
    stop->need = 0;
    for (;;) {
        Py_ssize_t avail = end - pos;
        if (avail < COMMAND_HEADER_SIZE) {
            stop->status = ST_NEED;
            stop->need = COMMAND_HEADER_SIZE;
            break;
        }
        uint32_t len = command_len(buf + pos);
        if (len > max_len) {
            stop->status = ST_STOP;
            break;
        }
        Py_ssize_t total = COMMAND_HEADER_SIZE + (Py_ssize_t)len;
        if (avail < total) {
            stop->status = ST_NEED;
            stop->need = total;
            break;
        }
        if (n == cap) {
            stop->status = ST_FULL;
            break;
        }
        starts[n++] = pos;
        pos += total;
        if (command_number(buf + pos - total) == C_END) {
            stop->status = ST_END;
            break;
        }
    }
    stop->pos = pos;
    return n;
}

typedef struct {
    const uint8_t *buf;
    const Py_ssize_t *starts;
    size_t from, to, failed;
    int version;
    lenient_t lenient; /* flags 0: strict checks */
} check_job;

static void *check_range(void *arg)
{
    check_job *j = arg;
    j->failed = j->to;
    lenient_t *l = j->lenient.flags ? &j->lenient : NULL;
    for (size_t i = j->from; i < j->to; i++) {
        const uint8_t *p = j->buf + j->starts[i];
        uint32_t len = command_len(p);
        if (!crc_ok(p, len) || !tlvs_ok(p, len, command_number(p), j->version, NULL, l)) {
            j->failed = i;
            break;
        }
    }
    return NULL;
}

#define PARALLEL_MIN (4 << 20)

/* Index of the first command that fails a check (n when none does); what a
 * lenient check let through is added to *l. Large runs are checked by two
 * threads, each on half of the bytes. */
static size_t check(const uint8_t *buf, const Py_ssize_t *starts, size_t n, Py_ssize_t end_pos, int version,
                    lenient_t *l)
{
    check_job a = {buf, starts, 0, n, n, version, *l};
    a.lenient.commands = a.lenient.attrs = 0;
    size_t failed;
    if (n >= 2 && end_pos - starts[0] >= PARALLEL_MIN) {
        Py_ssize_t half = starts[0] + (end_pos - starts[0]) / 2;
        size_t split = 1;
        while (split < n - 1 && starts[split] < half)
            split++;
        check_job b = a;
        b.from = split;
        a.to = split;
        pthread_t thread;
        if (pthread_create(&thread, NULL, check_range, &b) == 0) {
            check_range(&a);
            pthread_join(thread, NULL);
            failed = a.failed < split ? a.failed : b.failed;
            if (failed == b.failed) { /* a's whole half passed */
                l->commands += b.lenient.commands;
                l->attrs += b.lenient.attrs;
            }
            l->commands += a.lenient.commands;
            l->attrs += a.lenient.attrs;
            return failed;
        }
        a.to = n;
    }
    check_range(&a);
    l->commands += a.lenient.commands;
    l->attrs += a.lenient.attrs;
    return a.failed;
}

/* Commands framed ahead of the checks: a few first, four times more after each
 * clean batch, so that a run of unusual commands (each stops the scan) costs
 * linear time, and clean runs still go in large batches. */
#define FRAME_FIRST 16
#define FRAME_BATCH 65536

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
/* The optional `unknown` argument of scan() and dump_text(): an array('Q') of
 * three, [LENIENT_* flags, unknown commands, unknown attributes]; the counts
 * of what a lenient check let through are added to it. */
static int get_lenient(PyObject *obj, optbuf *b, lenient_t *l, const Py_buffer *in)
{
    memset(l, 0, sizeof *l);
    l->lo = in->buf;
    l->hi = (const uint8_t *)in->buf + in->len;
    if (get_out(obj, b, 8, "unknown") < 0)
        return -1;
    if (b->have) {
        if (b->view.len < 24) {
            PyErr_SetString(PyExc_ValueError, "unknown must hold 3 counters");
            return -1;
        }
        l->flags = (int)((uint64_t *)b->view.buf)[0] & (LENIENT_COMMANDS | LENIENT_ATTRS | LENIENT_STRICT);
        if (!(l->flags & (LENIENT_COMMANDS | LENIENT_ATTRS)))
            l->flags = 0;
    }
    return 0;
}

static void put_lenient(optbuf *b, const lenient_t *l)
{
    if (b->have) {
        ((uint64_t *)b->view.buf)[1] += l->commands;
        ((uint64_t *)b->view.buf)[2] += l->attrs;
    }
}

static PyObject *scan(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"buffer", "pos",  "version", "max_len", "offsets", "cmds",
                             "lens",   "base", "crcs",    "unknown", NULL};
    Py_buffer in;
    Py_ssize_t pos;
    int version;
    unsigned long long max_len, base = 0;
    PyObject *o_off = Py_None, *o_cmd = Py_None, *o_len = Py_None, *o_crc = Py_None, *o_unknown = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*niK|OOOKOO", kwlist, &in, &pos, &version, &max_len, &o_off,
                                     &o_cmd, &o_len, &base, &o_crc, &o_unknown))
        return NULL;
    optbuf off = {0}, cmds = {0}, lens = {0}, crcs = {0}, unknown = {0};
    lenient_t lenient;
    PyObject *result = NULL;
    if (version < 1 || version > MAX_VERSION || pos < 0 || pos > in.len) {
        PyErr_SetString(PyExc_ValueError, "bad version or position");
        goto out;
    }
    if (get_out(o_off, &off, 8, "offsets") < 0 || get_out(o_cmd, &cmds, 2, "cmds") < 0 ||
        get_out(o_len, &lens, 4, "lens") < 0 || get_out(o_crc, &crcs, 4, "crcs") < 0 ||
        get_lenient(o_unknown, &unknown, &lenient, &in) < 0)
        goto out;
    Py_ssize_t cap = PY_SSIZE_T_MAX;
    if (off.have && off.view.len / 8 < cap) cap = off.view.len / 8;
    if (cmds.have && cmds.view.len / 2 < cap) cap = cmds.view.len / 2;
    if (lens.have && lens.view.len / 4 < cap) cap = lens.view.len / 4;
    if (crcs.have && crcs.view.len / 4 < cap) cap = crcs.view.len / 4;
    Py_ssize_t first = pos;

    const uint8_t *buf = in.buf;
    Py_ssize_t count = 0;
    Py_ssize_t *starts = PyMem_RawMalloc(FRAME_BATCH * sizeof *starts);
    if (!starts) {
        PyErr_NoMemory();
        goto out;
    }
    stop_t stop;
    size_t batch = FRAME_FIRST;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        size_t room = (size_t)(cap - count) < batch ? (size_t)(cap - count) : batch;
        size_t n = frame(buf, in.len, pos, max_len, room, starts, &stop);
        size_t ok = check(buf, starts, n, stop.pos, version, &lenient);
        for (size_t i = 0; i < ok; i++) {
            uint32_t len = command_len(buf + starts[i]);
            if (off.have) ((uint64_t *)off.view.buf)[count] = base + (uint64_t)starts[i];
            if (cmds.have) ((uint16_t *)cmds.view.buf)[count] = command_number(buf + starts[i]);
            if (lens.have) ((uint32_t *)lens.view.buf)[count] = len;
            if (crcs.have) ((uint32_t *)crcs.view.buf)[count] = command_crc(buf + starts[i]);
            count++;
        }
        if (ok < n) {
            stop.status = ST_STOP;
            stop.pos = starts[ok];
            stop.need = 0;
            break;
        }
        if (stop.status != ST_FULL || count == cap)
            break;
        pos = stop.pos;
        if (batch < FRAME_BATCH)
            batch *= 4;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(starts);
    pos = stop.pos;
    put_lenient(&unknown, &lenient);
    unsigned long long nbytes = (unsigned long long)(pos - first);
    result = Py_BuildValue("niniK", pos, stop.status, stop.need, count, nbytes);
out:
    if (unknown.have) PyBuffer_Release(&unknown.view);
    if (off.have) PyBuffer_Release(&off.view);
    if (cmds.have) PyBuffer_Release(&cmds.view);
    if (lens.have) PyBuffer_Release(&lens.view);
    if (crcs.have) PyBuffer_Release(&crcs.view);
    PyBuffer_Release(&in);
    return result;
}

/* ------------------------------------------------------------------------
 * `btrfs receive --dump` text (btrfs-progs 6.2), the fast twin of
 * sendstream/render/dump.py's TextDumper, which stays the reference: the tests
 * check both give the same bytes on every fixture and under fuzzing.
 * ------------------------------------------------------------------------ */

typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} out_t;

static void reserve(out_t *o, size_t n)
{
    if (o->len + n <= o->cap || o->failed)
        return;
    size_t cap = o->cap ? o->cap : 1 << 16;
    while (cap < o->len + n)
        cap *= 2;
    char *b = realloc(o->buf, cap);
    if (!b) {
        o->failed = 1;
        return;
    }
    o->buf = b;
    o->cap = cap;
}

static void put(out_t *o, const void *s, size_t n)
{
    reserve(o, n);
    if (o->failed)
        return;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void puts_(out_t *o, const char *s) { put(o, s, strlen(s)); }

static void putu(out_t *o, unsigned long long v, int base)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, base == 8 ? "%llo" : base == 16 ? "%llx" : "%llu", v);
    put(o, tmp, (size_t)n);
}

static void putd(out_t *o, long long v)
{
    char tmp[32];
    put(o, tmp, (size_t)snprintf(tmp, sizeof tmp, "%lld", v));
}

static char escaped[256][5]; /* what string_print_escape_special() prints per byte */

static void escape_init(void)
{
    for (int b = 0; b < 256; b++) {
        const char *special = NULL;
        switch (b) {
        case '\a': special = "\\a"; break;
        case '\b': special = "\\b"; break;
        case 27: special = "\\e"; break;
        case '\f': special = "\\f"; break;
        case '\n': special = "\\n"; break;
        case '\r': special = "\\r"; break;
        case '\t': special = "\\t"; break;
        case '\v': special = "\\v"; break;
        case ' ': special = "\\ "; break;
        case '\\': special = "\\\\"; break;
        }
        if (special)
            strcpy(escaped[b], special);
        else if (b > 0x20 && b < 0x7f)
            escaped[b][0] = (char)b, escaped[b][1] = 0;
        else
            snprintf(escaped[b], sizeof escaped[b], "\\%03o", b);
    }
}

/* Escaped bytes; returns the printed width. */
static size_t put_escaped(out_t *o, const uint8_t *s, size_t n)
{
    size_t width = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = escaped[s[i]];
        size_t k = e[1] ? strlen(e) : 1;
        put(o, e, k);
        width += k;
    }
    return width;
}

/* C-string length: btrfs-progs copies names into NUL-terminated strings. */
static size_t cstrlen(const uint8_t *s, size_t n)
{
    const uint8_t *z = memchr(s, 0, n);
    return z ? (size_t)(z - s) : n;
}

/* path_cat_out(): p1 "/" p2, one trailing '/' dropped from each. */
static void path_cat(out_t *o, const uint8_t *p1, size_t n1, const uint8_t *p2, size_t n2)
{
    if (n1 && p1[n1 - 1] == '/')
        n1--;
    if (n2 && p2[n2 - 1] == '/')
        n2--;
    o->len = 0;
    put(o, p1, n1);
    put(o, "/", 1);
    put(o, p2, n2);
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* little-endian hosts only, see the #error above */
}

static void put_uuid(out_t *o, const uint8_t *u)
{
    char tmp[40];
    snprintf(tmp, sizeof tmp, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    put(o, tmp, 36);
}

typedef struct {
    int64_t sec[4];
    char text[4][64];
    int next;
} time_cache_t;

/* 0 when the time cannot be shown (the Python path then raises). */
static int put_time(out_t *o, time_cache_t *tc, const uint8_t *ts)
{
    int64_t sec = (int64_t)le64(ts);
    for (int i = 0; i < 4; i++)
        if (tc->sec[i] == sec && tc->text[i][0]) {
            puts_(o, tc->text[i]);
            return 1;
        }
    time_t t = (time_t)sec;
    struct tm tm;
    if ((int64_t)t != sec || !localtime_r(&t, &tm))
        return 0;
    int slot = tc->next++ & 3;
    if (!strftime(tc->text[slot], sizeof tc->text[slot], "%Y-%m-%dT%H:%M:%S%z", &tm))
        return 0;
    tc->sec[slot] = sec;
    puts_(o, tc->text[slot]);
    return 1;
}

typedef struct {
    out_t *o, *subvol, *tmp;
    time_cache_t *times;
    int raw_xattr;
    int escaped; /* btrfs-progs 6.9.1 and later: clone source, xattr name and data escaped */
} dumper_t;

#define U64(a) le64(at->val[a])
#define U32(a) le32(at->val[a])
#define HAS(a) (at->seen >> (a) & 1)

/* What 6.2 prints raw and 6.9.1 escapes. */
static void put_name(dumper_t *d, const uint8_t *s, size_t n)
{
    if (d->escaped)
        put_escaped(d->o, s, n);
    else
        put(d->o, s, n);
}

/* One line for a clean command. 0: the Python path must handle it. */
static int dump_line(dumper_t *d, uint16_t cmd, const attrs_t *at)
{
    out_t *o = d->o;
    size_t start = o->len;
    const char *title = COMMAND_NAME[cmd];
    if (!title)
        return 0;
    char head[17];
    snprintf(head, sizeof head, "%-16s", title);
    put(o, head, strlen(head));
    const uint8_t *path = at->val[A_PATH];
    size_t path_len = cstrlen(path, at->len[A_PATH]);
    size_t width;
    if (cmd == C_SUBVOL || cmd == C_SNAPSHOT) {
        path_cat(d->subvol, (const uint8_t *)".", 1, path, path_len);
        width = put_escaped(o, (const uint8_t *)d->subvol->buf, d->subvol->len);
    } else {
        path_cat(d->tmp, (const uint8_t *)d->subvol->buf, d->subvol->len, path, path_len);
        width = put_escaped(o, (const uint8_t *)d->tmp->buf, d->tmp->len);
    }
    switch (cmd) {
    case C_MKFILE: case C_MKDIR: case C_MKFIFO: case C_MKSOCK: case C_UNLINK: case C_RMDIR:
        put(o, "\n", 1);
        return 1;
    }
    do
        put(o, " ", 1);
    while (++width < 32);
    switch (cmd) {
    case C_SUBVOL: case C_SNAPSHOT:
        puts_(o, "uuid=");
        put_uuid(o, at->val[A_UUID]);
        puts_(o, " transid=");
        putu(o, U64(A_CTRANSID), 10);
        if (cmd == C_SNAPSHOT) {
            puts_(o, " parent_uuid=");
            put_uuid(o, at->val[A_CLONE_UUID]);
            puts_(o, " parent_transid=");
            putu(o, U64(A_CLONE_CTRANSID), 10);
        }
        break;
    case C_MKNOD:
        puts_(o, "mode=");
        putu(o, U64(A_MODE), 8);
        puts_(o, " dev=0x");
        putu(o, U64(A_RDEV), 16);
        break;
    case C_SYMLINK: case C_LINK:
        puts_(o, "dest=");
        put_escaped(o, at->val[A_PATH_LINK], cstrlen(at->val[A_PATH_LINK], at->len[A_PATH_LINK]));
        break;
    case C_RENAME:
        puts_(o, "dest=");
        path_cat(d->tmp, (const uint8_t *)d->subvol->buf, d->subvol->len, at->val[A_PATH_TO],
                 cstrlen(at->val[A_PATH_TO], at->len[A_PATH_TO]));
        put_escaped(o, (const uint8_t *)d->tmp->buf, d->tmp->len);
        break;
    case C_SET_XATTR: {
        puts_(o, "name=");
        put_name(d, at->val[A_XATTR_NAME], cstrlen(at->val[A_XATTR_NAME], at->len[A_XATTR_NAME]));
        /* 6.9.1 dropped "data=": an empty value leaves two spaces */
        puts_(o, d->escaped ? " " : " data=");
        const uint8_t *v = at->val[A_XATTR_DATA];
        uint32_t n = at->len[A_XATTR_DATA];
        if (d->raw_xattr)
            put(o, v, cstrlen(v, n));
        else
            put_escaped(o, v, n);
        puts_(o, " len=");
        putu(o, n, 10);
        break;
    }
    case C_REMOVE_XATTR:
        puts_(o, "name=");
        put_name(d, at->val[A_XATTR_NAME], cstrlen(at->val[A_XATTR_NAME], at->len[A_XATTR_NAME]));
        break;
    case C_WRITE: case C_ENCODED_WRITE:
        puts_(o, "offset=");
        putu(o, U64(A_FILE_OFFSET), 10);
        puts_(o, " len=");
        putu(o, at->len[A_DATA], 10);
        if (cmd == C_ENCODED_WRITE) {
            const char *sep = d->escaped ? " " : ", ";
            puts_(o, sep);
            puts_(o, "unencoded_file_len=");
            putu(o, U64(A_UNENCODED_FILE_LEN), 10);
            puts_(o, sep);
            puts_(o, "unencoded_len=");
            putu(o, U64(A_UNENCODED_LEN), 10);
            puts_(o, sep);
            puts_(o, "unencoded_offset=");
            putu(o, U64(A_UNENCODED_OFFSET), 10);
            puts_(o, sep);
            puts_(o, "compression=");
            putu(o, HAS(A_COMPRESSION) ? U32(A_COMPRESSION) : 0, 10);
            puts_(o, sep);
            puts_(o, "encryption=");
            putu(o, HAS(A_ENCRYPTION) ? U32(A_ENCRYPTION) : 0, 10);
        }
        break;
    case C_CLONE:
        puts_(o, "offset=");
        putu(o, U64(A_FILE_OFFSET), 10);
        puts_(o, " len=");
        /* btrfs-progs reads CLONE_LEN into an int and prints it as a u64 */
        putu(o, (unsigned long long)(long long)(int32_t)(uint32_t)U64(A_CLONE_LEN), 10);
        puts_(o, " from=");
        path_cat(d->tmp, (const uint8_t *)d->subvol->buf, d->subvol->len, at->val[A_CLONE_PATH],
                 cstrlen(at->val[A_CLONE_PATH], at->len[A_CLONE_PATH]));
        put_name(d, (const uint8_t *)d->tmp->buf, d->tmp->len);
        puts_(o, " clone_offset=");
        putu(o, U64(A_CLONE_OFFSET), 10);
        break;
    case C_TRUNCATE:
        puts_(o, "size=");
        putu(o, U64(A_SIZE), 10);
        break;
    case C_CHMOD:
        puts_(o, "mode=");
        putu(o, U64(A_MODE), 8);
        break;
    case C_CHOWN:
        puts_(o, "gid=");
        putu(o, U64(A_GID), 10);
        puts_(o, " uid=");
        putu(o, U64(A_UID), 10);
        break;
    case C_UTIMES:
        puts_(o, "atime=");
        if (!put_time(o, d->times, at->val[A_ATIME]))
            goto undo;
        puts_(o, " mtime=");
        if (!put_time(o, d->times, at->val[A_MTIME]))
            goto undo;
        puts_(o, " ctime=");
        if (!put_time(o, d->times, at->val[A_CTIME]))
            goto undo;
        break;
    case C_UPDATE_EXTENT:
        puts_(o, "offset=");
        putu(o, U64(A_FILE_OFFSET), 10);
        puts_(o, " len=");
        putu(o, U64(A_SIZE), 10);
        break;
    case C_FALLOCATE:
        puts_(o, "mode=");
        putd(o, (int32_t)U32(A_FALLOCATE_MODE));
        puts_(o, " offset=");
        putu(o, U64(A_FILE_OFFSET), 10);
        puts_(o, " len=");
        putu(o, U64(A_SIZE), 10);
        break;
    case C_FILEATTR:
        puts_(o, "fileattr=0x");
        putu(o, U64(A_FILEATTR), 10);
        break;
    case C_ENABLE_VERITY:
        puts_(o, "algorithm=");
        putu(o, at->val[A_VERITY_ALGORITHM][0], 10);
        puts_(o, " block_size=");
        putu(o, U32(A_VERITY_BLOCK_SIZE), 10);
        puts_(o, " salt_len=");
        putu(o, at->len[A_VERITY_SALT_DATA], 10);
        puts_(o, " sig_len=");
        putu(o, at->len[A_VERITY_SIG_DATA], 10);
        break;
    default:
        goto undo;
    }
    put(o, "\n", 1);
    return 1;
undo:
    o->len = start;
    return 0;
}

/*
 * dump_text(buffer, pos, version, max_len, subvol_path, raw_xattr, escaped, max_text)
 *   -> (pos, status, need, count, nbytes, text, subvol_path)
 * Like scan(), and prints each clean command; FULL once max_text is reached.
 */
static PyObject *dump_text(PyObject *self, PyObject *args)
{
    Py_buffer in, sv;
    Py_ssize_t pos, max_text;
    int version, raw_xattr, escaped;
    unsigned long long max_len;
    PyObject *o_unknown = Py_None;
    if (!PyArg_ParseTuple(args, "y*niKy*ppn|O", &in, &pos, &version, &max_len, &sv, &raw_xattr, &escaped,
                          &max_text, &o_unknown))
        return NULL;
    PyObject *result = NULL;
    out_t o = {0}, subvol = {0}, tmp = {0};
    time_cache_t times = {0};
    optbuf unknown = {0};
    lenient_t lenient;
    if (version < 1 || version > MAX_VERSION || pos < 0 || pos > in.len) {
        PyErr_SetString(PyExc_ValueError, "bad version or position");
        goto out;
    }
    if (get_lenient(o_unknown, &unknown, &lenient, &in) < 0)
        goto out;
    put(&subvol, sv.buf, (size_t)sv.len);
    dumper_t d = {&o, &subvol, &tmp, &times, raw_xattr, escaped};
    const uint8_t *buf = in.buf;
    Py_ssize_t count = 0, first = pos;
    Py_ssize_t *starts = PyMem_RawMalloc(FRAME_BATCH * sizeof *starts);
    if (!starts) {
        PyErr_NoMemory();
        goto out;
    }
    stop_t stop;
    attrs_t at;
    size_t batch = FRAME_FIRST;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        size_t n = frame(buf, in.len, pos, max_len, batch, starts, &stop);
        lenient_t counted = lenient;
        size_t ok = check(buf, starts, n, stop.pos, version, &counted), i;
        for (i = 0; i < ok; i++) {
            const uint8_t *p = buf + starts[i];
            uint16_t cmd = command_number(p);
            if ((Py_ssize_t)o.len >= max_text) {
                stop.status = ST_FULL;
                break;
            }
            lenient_t one = lenient;
            one.commands = one.attrs = 0;
            tlvs_ok(p, command_len(p), cmd, version, &at, lenient.flags ? &one : NULL);
            /* an unknown command prints nothing, as in btrfs-progs */
            if (cmd != C_END && !(one.commands || dump_line(&d, cmd, &at))) {
                stop.status = ST_STOP;
                break;
            }
            lenient.commands += one.commands;
            lenient.attrs += one.attrs;
            count++;
        }
        if (i < n) {
            if (i == ok)
                stop.status = ST_STOP;
            stop.pos = starts[i];
            stop.need = 0;
            break;
        }
        if (stop.status != ST_FULL)
            break;
        pos = stop.pos;
        if (batch < FRAME_BATCH)
            batch *= 4;
    }
    Py_END_ALLOW_THREADS
    PyMem_RawFree(starts);
    pos = stop.pos;
    put_lenient(&unknown, &lenient);
    unsigned long long nbytes = (unsigned long long)(pos - first);
    int status = stop.status;
    Py_ssize_t need = stop.need;
    if (o.failed || subvol.failed || tmp.failed) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("niniKy#y#", pos, status, need, count, nbytes, o.buf ? o.buf : "", (Py_ssize_t)o.len,
                           subvol.buf, (Py_ssize_t)subvol.len);
out:
    if (unknown.have) PyBuffer_Release(&unknown.view);
    free(o.buf);
    free(subvol.buf);
    free(tmp.buf);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&in);
    return result;
}

/* ---- mapped input that may lose its data under us ----
 * A regular file read through mmap raises SIGBUS where the file has no data
 * any more: truncated or rewritten by another process, or an I/O error of
 * NFS or FUSE. guard() registers a mapping; a SIGBUS inside it maps zero
 * pages over the rest of it, so the access completes, and records where it
 * happened; the Python side asks faulted() and reports an I/O error at that
 * offset instead of using what it read. Other faults go to the handler that
 * was there before (faulthandler, or the default: the process dies). */
#define GUARDS 256
static struct {
    volatile uintptr_t start, end;
    volatile intptr_t fault;
} guards[GUARDS];
static struct sigaction previous_bus;
static uintptr_t page_size = 4096;

static void on_bus(int sig, siginfo_t *info, void *context)
{
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (int i = 0; i < GUARDS; i++) {
        uintptr_t start = guards[i].start, end = guards[i].end;
        if (start && addr >= start && addr < end) {
            uintptr_t from = addr & ~(page_size - 1);
            if (mmap((void *)from, end - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
                break;
            intptr_t at = (intptr_t)(addr - start);
            if (guards[i].fault < 0 || at < guards[i].fault)
                guards[i].fault = at;
            return;
        }
    }
    if (previous_bus.sa_flags & SA_SIGINFO) {
        previous_bus.sa_sigaction(sig, info, context);
    } else if (previous_bus.sa_handler != SIG_DFL && previous_bus.sa_handler != SIG_IGN) {
        previous_bus.sa_handler(sig);
    } else {
        signal(SIGBUS, SIG_DFL);
        raise(SIGBUS);
    }
}

/* guard(mapping) -> slot, or -1 when every slot is taken (the mapping then goes unguarded). */
static PyObject *guard(PyObject *self, PyObject *args)
{
    Py_buffer in;
    if (!PyArg_ParseTuple(args, "y*", &in))
        return NULL;
    uintptr_t start = (uintptr_t)in.buf, end = start + (uintptr_t)in.len;
    PyBuffer_Release(&in);
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) == 0 && current.sa_sigaction != on_bus) {
        /* (again) when something else, e.g. faulthandler, took SIGBUS since */
        struct sigaction ours;
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = on_bus;
        ours.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&ours.sa_mask);
        if (sigaction(SIGBUS, &ours, &previous_bus) != 0)
            return PyErr_SetFromErrno(PyExc_OSError);
    }
    for (int i = 0; i < GUARDS; i++) {
        if (!guards[i].start && start) {
            guards[i].fault = -1;
            guards[i].end = end;
            guards[i].start = start;
            return PyLong_FromLong(i);
        }
    }
    return PyLong_FromLong(-1);
}

static int slot_of(PyObject *args)
{
    int i;
    if (!PyArg_ParseTuple(args, "i", &i))
        return -1;
    if (i < 0 || i >= GUARDS) {
        PyErr_SetString(PyExc_ValueError, "bad guard slot");
        return -1;
    }
    return i;
}

/* faulted(slot) -> offset of the first byte that had no data in that mapping, or -1. */
static PyObject *faulted(PyObject *self, PyObject *args)
{
    int i = slot_of(args);
    return i < 0 ? NULL : PyLong_FromSsize_t((Py_ssize_t)guards[i].fault);
}

/* unguard(slot): the mapping is going away. */
static PyObject *unguard(PyObject *self, PyObject *args)
{
    int i = slot_of(args);
    if (i < 0)
        return NULL;
    guards[i].start = 0;
    guards[i].end = 0;
    Py_RETURN_NONE;
}

/* The kernel of KERNELS named key, or NULL with a ValueError. */
static const struct crc_kernel *kernel_named(const char *key)
{
    for (int i = 0; i < kernel_count; i++)
        if (strcmp(kernels[i].key, key) == 0)
            return &kernels[i];
    PyErr_Format(PyExc_ValueError, "no CRC kernel %s on this processor", key);
    return NULL;
}

static PyObject *use_crc(PyObject *self, PyObject *args)
{
    const char *key;
    if (!PyArg_ParseTuple(args, "s", &key))
        return NULL;
    const struct crc_kernel *k = kernel_named(key);
    if (!k)
        return NULL;
    crc_fn = k->fn; /* (set once, before any scan: the backend asks at its first use) */
    crc_name = k->name;
    return PyUnicode_FromString(crc_name);
}

static PyObject *crc32c_py(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"data", "crc", "kernel", NULL};
    Py_buffer in;
    unsigned int crc = 0;
    const char *key = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*|Iz", names, &in, &crc, &key))
        return NULL;
    uint32_t (*fn)(uint32_t, const uint8_t *, size_t) = crc_fn;
    if (key) {
        const struct crc_kernel *k = kernel_named(key);
        if (!k) {
            PyBuffer_Release(&in);
            return NULL;
        }
        fn = k->fn;
    }
    uint32_t r;
    Py_BEGIN_ALLOW_THREADS
    r = fn(crc, in.buf, (size_t)in.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&in);
    return PyLong_FromUnsignedLong(r);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS,
     "Walk and check every complete command from pos; stop at END, a partial or an unusual command."},
    {"dump_text", dump_text, METH_VARARGS, "Like scan(), printing each clean command as btrfs receive --dump."},
    {"crc32c", (PyCFunction)(void (*)(void))crc32c_py, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0, kernel=None): the btrfs CRC-32C (kernel: one of KERNELS, else the chosen one)."},
    {"use_crc", use_crc, METH_VARARGS, "use_crc(kernel) -> its name: every later CRC by that kernel of KERNELS."},
    {"guard", guard, METH_VARARGS, "guard(mapping) -> slot: survive SIGBUS in a file mapping and record it."},
    {"faulted", faulted, METH_VARARGS, "faulted(slot) -> the first offset that had no data, or -1."},
    {"unguard", unguard, METH_VARARGS, "unguard(slot): forget a mapping that goes away."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT, .m_name = "_native", .m_doc = "Native batch scanner.", .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    crc_init();
    escape_init();
    page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    shift_init();
    shift_block_init();
#ifdef HAVE_X86_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        kernels[kernel_count++] = (struct crc_kernel){"sse4.2", "x86-64 SSE4.2 crc32", crc_hw};
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq") &&
            __builtin_cpu_supports("pclmul")) {
            fold_init();
            kernels[kernel_count++] =
                (struct crc_kernel){"vpclmulqdq", "x86-64 AVX-512 VPCLMULQDQ folding, SSE4.2 crc32", crc_vpclmul};
        }
    }
#elif defined(HAVE_ARM_CRC)
    kernels[kernel_count++] = (struct crc_kernel){"armv8", "ARMv8 crc32c", crc_hw};
#endif
    crc_fn = kernels[kernel_count - 1].fn;
    crc_name = kernels[kernel_count - 1].name;
    PyObject *m = PyModule_Create(&module);
    PyObject *keys = m ? PyTuple_New(kernel_count) : NULL;
    for (int i = 0; keys && i < kernel_count; i++)
        PyTuple_SET_ITEM(keys, i, PyUnicode_FromString(kernels[i].key));
    if (!keys || PyModule_AddStringConstant(m, "CRC", crc_name) < 0 || PyModule_AddObject(m, "KERNELS", keys) < 0) {
        Py_XDECREF(keys);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
