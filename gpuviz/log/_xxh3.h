/*
 * _xxh3.h -- self-contained XXH3-64 (seed 0, default 192-byte secret) for
 * gpuviz's C extensions.
 *
 *   uint64_t gv_xxh3_64(const void *data, size_t len);   one-shot hash
 *   void     gv_hex16(uint64_t h, char out[16]);          16 lowercase hex digits, no NUL
 *
 * The result must equal xxhash.xxh3_64(data).intdigest() from the `xxhash`
 * Python package (a dependency of this project) for every input, and
 * gv_hex16 must print exactly what xxhash.xxh3_64_hexdigest prints, so that
 * checksums computed natively and checksums computed in Python agree.
 * tests/test_xxh3.py proves both (every length 0..2100, stripe/block
 * boundaries up to 300 000 bytes, and hypothesis-generated inputs).
 *
 * Portable C99, no allocation; every function is static so several extension
 * sources may include this header.  Little-endian loads go through memcpy (plus
 * a byte swap on big-endian hosts).
 *
 * Inputs over 240 bytes (the ~160 KB blocks of _batchwriter.c) take one of two
 * paths, which give identical results:
 *   - AVX2: x86-64 built by gcc or clang only.  Compiled with
 *     __attribute__((target("avx2"))), so the extensions keep their baseline
 *     (SSE2) flags; used when __builtin_cpu_supports("avx2") says the CPU and OS
 *     can run it.  That check runs on the first long input and its answer is
 *     cached (one per including source, thread-safe).  ~4x the scalar path.
 *   - scalar: every other machine and compiler, and x86-64 CPUs without AVX2.
 * Inputs of 240 bytes or less are always scalar.  Test-only switches:
 * GV_XXH_NO_SIMD compiles the AVX2 path out; GV_XXH_NO_INT128 replaces the
 * unsigned __int128 multiply with 32-bit limbs.  tests/test_xxh3.py builds the
 * default, -DGV_XXH_NO_SIMD and -DGV_XXH_NO_INT128 -DGV_XXH_NO_SIMD variants.
 */
#ifndef GPUVIZ_LOG_XXH3_H
#define GPUVIZ_LOG_XXH3_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define GV_XXH_UNUSED __attribute__((unused))
#else
#define GV_XXH_UNUSED
#endif

#define GV_XXH_P32_1 0x9E3779B1U
#define GV_XXH_P32_2 0x85EBCA77U
#define GV_XXH_P32_3 0xC2B2AE3DU
#define GV_XXH_P64_1 0x9E3779B185EBCA87ULL
#define GV_XXH_P64_2 0xC2B2AE3D27D4EB4FULL
#define GV_XXH_P64_3 0x165667B19E3779F9ULL
#define GV_XXH_P64_4 0x85EBCA77C2B2AE63ULL
#define GV_XXH_P64_5 0x27D4EB2F165667C5ULL
#define GV_XXH_MX1 0x165667919E3779F9ULL
#define GV_XXH_MX2 0x9FB21C651E98DF25ULL

#define GV_XXH_SECRET_SIZE 192
#define GV_XXH_SECRET_SIZE_MIN 136
#define GV_XXH_STRIPE 64
#define GV_XXH_CONSUME 8 /* secret bytes advanced per stripe */
#define GV_XXH_STRIPES_PER_BLOCK ((GV_XXH_SECRET_SIZE - GV_XXH_STRIPE) / GV_XXH_CONSUME) /* 16 */
#define GV_XXH_BLOCK (GV_XXH_STRIPE * GV_XXH_STRIPES_PER_BLOCK)                           /* 1024 */

static const uint8_t gv_xxh_secret[GV_XXH_SECRET_SIZE] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

/* ---- primitives -------------------------------------------------------- */

static inline uint32_t gv_xxh_bswap32(uint32_t x) {
    return ((x << 24) & 0xff000000U) | ((x << 8) & 0x00ff0000U) | ((x >> 8) & 0x0000ff00U) |
           ((x >> 24) & 0x000000ffU);
}

static inline uint64_t gv_xxh_bswap64(uint64_t x) {
    return ((uint64_t)gv_xxh_bswap32((uint32_t)x) << 32) | (uint64_t)gv_xxh_bswap32((uint32_t)(x >> 32));
}

#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define GV_XXH_BIG_ENDIAN 1
#else
#define GV_XXH_BIG_ENDIAN 0
#endif

static inline uint32_t gv_xxh_r32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
#if GV_XXH_BIG_ENDIAN
    v = gv_xxh_bswap32(v);
#endif
    return v;
}

static inline uint64_t gv_xxh_r64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
#if GV_XXH_BIG_ENDIAN
    v = gv_xxh_bswap64(v);
#endif
    return v;
}

static inline uint64_t gv_xxh_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* 64x64 -> 128 multiply, folded: low half XOR high half.  GV_XXH_NO_INT128 forces the
 * portable 32-bit-limb version (the test builds both). */
static inline uint64_t gv_xxh_mul128_fold64(uint64_t a, uint64_t b) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(__SIZEOF_INT128__) && !defined(GV_XXH_NO_INT128)
    __extension__ typedef unsigned __int128 gv_u128; /* __extension__: quiet under -pedantic */
    gv_u128 p = (gv_u128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
#else
    uint64_t lo_lo = (a & 0xFFFFFFFFULL) * (b & 0xFFFFFFFFULL);
    uint64_t hi_lo = (a >> 32) * (b & 0xFFFFFFFFULL);
    uint64_t lo_hi = (a & 0xFFFFFFFFULL) * (b >> 32);
    uint64_t hi_hi = (a >> 32) * (b >> 32);
    uint64_t cross = (lo_lo >> 32) + (hi_lo & 0xFFFFFFFFULL) + lo_hi;
    uint64_t upper = (hi_lo >> 32) + (cross >> 32) + hi_hi;
    uint64_t lower = (cross << 32) | (lo_lo & 0xFFFFFFFFULL);
    return lower ^ upper;
#endif
}

static inline uint64_t gv_xxh64_avalanche(uint64_t h) {
    h ^= h >> 33;
    h *= GV_XXH_P64_2;
    h ^= h >> 29;
    h *= GV_XXH_P64_3;
    h ^= h >> 32;
    return h;
}

static inline uint64_t gv_xxh3_avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= GV_XXH_MX1;
    h ^= h >> 32;
    return h;
}

static inline uint64_t gv_xxh3_rrmxmx(uint64_t h, uint64_t len) {
    h ^= gv_xxh_rotl64(h, 49) ^ gv_xxh_rotl64(h, 24);
    h *= GV_XXH_MX2;
    h ^= (h >> 35) + len;
    h *= GV_XXH_MX2;
    return h ^ (h >> 28);
}

/* ---- short inputs (0..240 bytes) --------------------------------------- */

static inline uint64_t gv_xxh3_len_1to3(const uint8_t *in, size_t len, const uint8_t *s) {
    uint8_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
    uint32_t combined = ((uint32_t)c1 << 16) | ((uint32_t)c2 << 24) | ((uint32_t)c3 << 0) | ((uint32_t)len << 8);
    uint64_t bitflip = (uint64_t)(gv_xxh_r32(s) ^ gv_xxh_r32(s + 4));
    return gv_xxh64_avalanche((uint64_t)combined ^ bitflip);
}

static inline uint64_t gv_xxh3_len_4to8(const uint8_t *in, size_t len, const uint8_t *s) {
    uint32_t in1 = gv_xxh_r32(in);
    uint32_t in2 = gv_xxh_r32(in + len - 4);
    uint64_t bitflip = gv_xxh_r64(s + 8) ^ gv_xxh_r64(s + 16);
    uint64_t in64 = (uint64_t)in2 + ((uint64_t)in1 << 32);
    return gv_xxh3_rrmxmx(in64 ^ bitflip, (uint64_t)len);
}

static inline uint64_t gv_xxh3_len_9to16(const uint8_t *in, size_t len, const uint8_t *s) {
    uint64_t bitflip1 = gv_xxh_r64(s + 24) ^ gv_xxh_r64(s + 32);
    uint64_t bitflip2 = gv_xxh_r64(s + 40) ^ gv_xxh_r64(s + 48);
    uint64_t lo = gv_xxh_r64(in) ^ bitflip1;
    uint64_t hi = gv_xxh_r64(in + len - 8) ^ bitflip2;
    uint64_t acc = (uint64_t)len + gv_xxh_bswap64(lo) + hi + gv_xxh_mul128_fold64(lo, hi);
    return gv_xxh3_avalanche(acc);
}

static inline uint64_t gv_xxh3_mix16(const uint8_t *in, const uint8_t *s) {
    return gv_xxh_mul128_fold64(gv_xxh_r64(in) ^ gv_xxh_r64(s), gv_xxh_r64(in + 8) ^ gv_xxh_r64(s + 8));
}

static inline uint64_t gv_xxh3_len_17to128(const uint8_t *in, size_t len, const uint8_t *s) {
    uint64_t acc = (uint64_t)len * GV_XXH_P64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += gv_xxh3_mix16(in + 48, s + 96);
                acc += gv_xxh3_mix16(in + len - 64, s + 112);
            }
            acc += gv_xxh3_mix16(in + 32, s + 64);
            acc += gv_xxh3_mix16(in + len - 48, s + 80);
        }
        acc += gv_xxh3_mix16(in + 16, s + 32);
        acc += gv_xxh3_mix16(in + len - 32, s + 48);
    }
    acc += gv_xxh3_mix16(in, s);
    acc += gv_xxh3_mix16(in + len - 16, s + 16);
    return gv_xxh3_avalanche(acc);
}

#define GV_XXH_MID_STARTOFFSET 3
#define GV_XXH_MID_LASTOFFSET 17

static GV_XXH_UNUSED uint64_t gv_xxh3_len_129to240(const uint8_t *in, size_t len, const uint8_t *s) {
    uint64_t acc = (uint64_t)len * GV_XXH_P64_1;
    size_t rounds = len / 16, i;
    for (i = 0; i < 8; i++) acc += gv_xxh3_mix16(in + 16 * i, s + 16 * i);
    acc = gv_xxh3_avalanche(acc);
    for (i = 8; i < rounds; i++) acc += gv_xxh3_mix16(in + 16 * i, s + 16 * (i - 8) + GV_XXH_MID_STARTOFFSET);
    acc += gv_xxh3_mix16(in + len - 16, s + GV_XXH_SECRET_SIZE_MIN - GV_XXH_MID_LASTOFFSET);
    return gv_xxh3_avalanche(acc);
}

/* ---- long inputs (> 240 bytes) ----------------------------------------- */

/* One 64-byte stripe into the 8 accumulators: lane i adds the 32x32->64 product of
 * the halves of (input word i ^ secret word i) plus the raw input word of its
 * neighbour i^1.  Written as a loop over lane pairs so the swap is plain data flow:
 * gcc -O2 then keeps it as tight scalar code (the one-lane-per-iteration form with
 * acc[i ^ 1] gets half-vectorised at -O2 into something 3x slower). */
static inline void gv_xxh3_accumulate_512(uint64_t acc[8], const uint8_t *in, const uint8_t *s) {
    size_t i;
    for (i = 0; i < 8; i += 2) {
        uint64_t d0 = gv_xxh_r64(in + 8 * i), d1 = gv_xxh_r64(in + 8 * i + 8);
        uint64_t k0 = d0 ^ gv_xxh_r64(s + 8 * i), k1 = d1 ^ gv_xxh_r64(s + 8 * i + 8);
        acc[i] += d1 + (k0 & 0xFFFFFFFFULL) * (k0 >> 32);
        acc[i + 1] += d0 + (k1 & 0xFFFFFFFFULL) * (k1 >> 32);
    }
}

static inline void gv_xxh3_accumulate(uint64_t acc[8], const uint8_t *in, const uint8_t *s, size_t nstripes) {
    size_t n;
    for (n = 0; n < nstripes; n++) gv_xxh3_accumulate_512(acc, in + n * GV_XXH_STRIPE, s + n * GV_XXH_CONSUME);
}

static inline void gv_xxh3_scramble(uint64_t acc[8], const uint8_t *s) {
    size_t i;
    for (i = 0; i < 8; i++) {
        uint64_t a = acc[i];
        a ^= a >> 47;
        a ^= gv_xxh_r64(s + 8 * i);
        acc[i] = a * GV_XXH_P32_1;
    }
}

#define GV_XXH_LASTACC_START 7
#define GV_XXH_MERGEACCS_START 11

/* The initial accumulators, shared by every path. */
#define GV_XXH_ACC_INIT                                                                                    \
    {GV_XXH_P32_3, GV_XXH_P64_1, GV_XXH_P64_2, GV_XXH_P64_3, GV_XXH_P64_4, GV_XXH_P32_2, GV_XXH_P64_5, \
     GV_XXH_P32_1}

static inline uint64_t gv_xxh3_merge(const uint64_t acc[8], size_t len) {
    uint64_t result = (uint64_t)len * GV_XXH_P64_1;
    size_t i;
    for (i = 0; i < 4; i++) {
        const uint8_t *k = gv_xxh_secret + GV_XXH_MERGEACCS_START + 16 * i;
        result += gv_xxh_mul128_fold64(acc[2 * i] ^ gv_xxh_r64(k), acc[2 * i + 1] ^ gv_xxh_r64(k + 8));
    }
    return gv_xxh3_avalanche(result);
}

static inline uint64_t gv_xxh3_hash_long_scalar(const uint8_t *in, size_t len) {
    const uint8_t *s = gv_xxh_secret;
    uint64_t acc[8] = GV_XXH_ACC_INIT;
    size_t nblocks = (len - 1) / GV_XXH_BLOCK, n;

    for (n = 0; n < nblocks; n++) {
        gv_xxh3_accumulate(acc, in + n * GV_XXH_BLOCK, s, GV_XXH_STRIPES_PER_BLOCK);
        gv_xxh3_scramble(acc, s + GV_XXH_SECRET_SIZE - GV_XXH_STRIPE);
    }
    /* last partial block, then the final stripe (which may overlap it) */
    gv_xxh3_accumulate(acc, in + nblocks * GV_XXH_BLOCK, s, ((len - 1) - nblocks * GV_XXH_BLOCK) / GV_XXH_STRIPE);
    gv_xxh3_accumulate_512(acc, in + len - GV_XXH_STRIPE, s + GV_XXH_SECRET_SIZE - GV_XXH_STRIPE - GV_XXH_LASTACC_START);
    return gv_xxh3_merge(acc, len);
}

/* ---- long inputs, SIMD (x86-64 with gcc or clang) ------------------------ */

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(GV_XXH_NO_SIMD)
#define GV_XXH_HAVE_SIMD 1
#include <immintrin.h>

/* The same lane arithmetic as gv_xxh3_accumulate_512 / gv_xxh3_scramble, four lanes per
 * 256-bit register: acc[0] holds lanes 0..3, acc[1] lanes 4..7.  Accumulate: key = data ^
 * secret; acc += lo32(key) * hi32(key) (mul_epu32 against key shuffled so its high halves
 * sit in the even slots) + data with the 64-bit words of each pair swapped.  Scramble:
 * acc ^= acc >> 47; acc ^= secret; acc *= PRIME32_1 as lo*P + ((hi*P) << 32).  Loads are
 * unaligned: neither the input nor the secret offsets are 32-byte aligned. */
__attribute__((target("avx2"))) static inline void gv_xxh3_accumulate_512_avx2(__m256i acc[2], const uint8_t *in,
                                                                                const uint8_t *s) {
    int i;
    for (i = 0; i < 2; i++) {
        __m256i d = _mm256_loadu_si256((const __m256i *)(const void *)(in + 32 * i));
        __m256i k = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(const void *)(s + 32 * i)));
        __m256i prod = _mm256_mul_epu32(k, _mm256_shuffle_epi32(k, _MM_SHUFFLE(0, 3, 0, 1)));
        acc[i] = _mm256_add_epi64(prod, _mm256_add_epi64(acc[i], _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2))));
    }
}

__attribute__((target("avx2"))) static inline void gv_xxh3_scramble_avx2(__m256i acc[2], const uint8_t *s) {
    const __m256i prime = _mm256_set1_epi32((int)GV_XXH_P32_1);
    int i;
    for (i = 0; i < 2; i++) {
        __m256i a = _mm256_xor_si256(acc[i], _mm256_srli_epi64(acc[i], 47));
        __m256i k = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(const void *)(s + 32 * i)));
        __m256i lo = _mm256_mul_epu32(k, prime);
        __m256i hi = _mm256_mul_epu32(_mm256_shuffle_epi32(k, _MM_SHUFFLE(0, 3, 0, 1)), prime);
        acc[i] = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
    }
}

__attribute__((target("avx2"))) static inline void gv_xxh3_accumulate_avx2(__m256i acc[2], const uint8_t *in,
                                                                            const uint8_t *s, size_t nstripes) {
    size_t n;
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#pragma GCC unroll 4 /* +20 % here; gcc -O2 does not unroll on its own (clang does) */
#endif
    for (n = 0; n < nstripes; n++) gv_xxh3_accumulate_512_avx2(acc, in + n * GV_XXH_STRIPE, s + n * GV_XXH_CONSUME);
}

__attribute__((target("avx2"))) static GV_XXH_UNUSED uint64_t gv_xxh3_hash_long_avx2(const uint8_t *in, size_t len) {
    const uint8_t *s = gv_xxh_secret;
    uint64_t acc[8] = GV_XXH_ACC_INIT;
    __m256i v[2];
    size_t nblocks = (len - 1) / GV_XXH_BLOCK, n;

    v[0] = _mm256_loadu_si256((const __m256i *)(const void *)acc);
    v[1] = _mm256_loadu_si256((const __m256i *)(const void *)(acc + 4));
    for (n = 0; n < nblocks; n++) {
        gv_xxh3_accumulate_avx2(v, in + n * GV_XXH_BLOCK, s, GV_XXH_STRIPES_PER_BLOCK);
        gv_xxh3_scramble_avx2(v, s + GV_XXH_SECRET_SIZE - GV_XXH_STRIPE);
    }
    gv_xxh3_accumulate_avx2(v, in + nblocks * GV_XXH_BLOCK, s, ((len - 1) - nblocks * GV_XXH_BLOCK) / GV_XXH_STRIPE);
    gv_xxh3_accumulate_512_avx2(v, in + len - GV_XXH_STRIPE,
                                s + GV_XXH_SECRET_SIZE - GV_XXH_STRIPE - GV_XXH_LASTACC_START);
    _mm256_storeu_si256((__m256i *)(void *)acc, v[0]);
    _mm256_storeu_si256((__m256i *)(void *)(acc + 4), v[1]);
    return gv_xxh3_merge(acc, len);
}

/* 1 when the CPU (and OS) can run AVX2.  Decided on the first long input and cached; threads
 * racing on the first call all store the same value, through relaxed atomics. */
static inline int gv_xxh_use_avx2(void) {
    static int cached; /* 0: not decided yet, 1: no, 2: yes */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == 0) {
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 2 : 1;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v == 2;
}
#endif

static GV_XXH_UNUSED uint64_t gv_xxh3_hash_long(const uint8_t *in, size_t len) {
#ifdef GV_XXH_HAVE_SIMD
    if (gv_xxh_use_avx2()) return gv_xxh3_hash_long_avx2(in, len);
#endif
    return gv_xxh3_hash_long_scalar(in, len);
}

/* ---- public ------------------------------------------------------------ */

static GV_XXH_UNUSED uint64_t gv_xxh3_64(const void *data, size_t len) {
    const uint8_t *in = (const uint8_t *)data;
    const uint8_t *s = gv_xxh_secret;
    if (len <= 16) {
        if (len > 8) return gv_xxh3_len_9to16(in, len, s);
        if (len >= 4) return gv_xxh3_len_4to8(in, len, s);
        if (len) return gv_xxh3_len_1to3(in, len, s);
        return gv_xxh64_avalanche(gv_xxh_r64(s + 56) ^ gv_xxh_r64(s + 64));
    }
    if (len <= 128) return gv_xxh3_len_17to128(in, len, s);
    if (len <= 240) return gv_xxh3_len_129to240(in, len, s);
    return gv_xxh3_hash_long(in, len);
}

static GV_XXH_UNUSED void gv_hex16(uint64_t h, char out[16]) {
    static const char digits[] = "0123456789abcdef";
    int i;
    for (i = 15; i >= 0; i--) {
        out[i] = digits[h & 0xF];
        h >>= 4;
    }
}

#endif /* GPUVIZ_LOG_XXH3_H */
