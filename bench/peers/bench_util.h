/* Helpers shared by the peer benchmark programs (mpi_coll_bench.c, gloo_coll_bench.cc,
 * memcpy_bw.cc, cma_bw.cc); C and C++.
 */
#ifndef LOOM_BENCH_PEERS_UTIL_H
#define LOOM_BENCH_PEERS_UTIL_H

#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Copies with non-temporal stores where the CPU has them (dst and src 64-byte aligned, bytes a
 * multiple of 64): they skip the read of each destination line that an ordinary store costs.
 * memcpy elsewhere. */
static inline void stream_copy(char* dst, const char* src, size_t bytes) {
#if defined(__SSE2__)
  for (size_t i = 0; i < bytes; i += 64)
    for (size_t k = 0; k < 64; k += 16)
      _mm_stream_si128((__m128i*)(dst + i + k), _mm_load_si128((const __m128i*)(src + i + k)));
  _mm_sfence();
#else
  memcpy(dst, src, bytes);
#endif
}

/* "64", "64K", "1M", "2G" (binary), an optional trailing B: 0 and *out set, or -1 when malformed.
 */
static inline int parse_bytes(const char* s, size_t* out) {
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) return -1;
  switch (toupper((unsigned char)*end)) {
    case 'K':
      v <<= 10;
      ++end;
      break;
    case 'M':
      v <<= 20;
      ++end;
      break;
    case 'G':
      v <<= 30;
      ++end;
      break;
    default:
      break;
  }
  if (*end == 'B' || *end == 'b') ++end;
  if (*end != '\0') return -1;
  *out = (size_t)v;
  return 0;
}

#endif
