/* Helpers shared by the peer benchmark programs (mpi_coll_bench.c, gloo_coll_bench.cc); C and C++.
 */
#ifndef LOOM_BENCH_PEERS_UTIL_H
#define LOOM_BENCH_PEERS_UTIL_H

#include <ctype.h>
#include <stddef.h>
#include <stdlib.h>

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
