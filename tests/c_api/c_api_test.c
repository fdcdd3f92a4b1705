/* The public header compiles as C and the shared library works from C: two ranks as threads of
 * one process driven by one thread through a group, an AllReduce, and error reporting. */
#include <loom/loom.h>
#include <stdio.h>
#include <string.h>

/* result must be want and loomGetLastError() must contain text. */
static int expectError(loomResult_t result, loomResult_t want, const char* text, const char* what) {
  if (result != want || strstr(loomGetLastError(), text) == NULL) {
    fprintf(stderr, "%s: expected %s with '%s', got %s: '%s'\n", what, loomGetErrorString(want),
            text, loomGetErrorString(result), loomGetLastError());
    return 1;
  }
  return 0;
}

/* loomCommRegister / loomCommDeregister: bad input, overlapping ranges, a collective on
 * registered buffers, registrations left for loomCommDestroy. */
static int registration(loomComm_t* comms) {
  float in[2][64], out[2][64];
  void *h[2] = {NULL, NULL}, *inner = NULL, *left = NULL, *other = NULL;
  int r, i, bad = 0;
  bad |= expectError(loomCommRegister(NULL, in[0], sizeof(in[0]), &h[0]), loomInvalidArgument,
                     "comm is NULL", "register on a NULL comm");
  bad |= expectError(loomCommRegister(comms[0], NULL, 16, &h[0]), loomInvalidArgument,
                     "buff is NULL", "register a NULL buffer");
  bad |= expectError(loomCommRegister(comms[0], in[0], 0, &h[0]), loomInvalidArgument, "size is 0",
                     "register 0 bytes");
  bad |= expectError(loomCommRegister(comms[0], in[0], sizeof(in[0]), NULL), loomInvalidArgument,
                     "handle is NULL", "register without a handle pointer");
  bad |= expectError(loomCommDeregister(NULL, in[0]), loomInvalidArgument, "comm is NULL",
                     "deregister on a NULL comm");
  bad |= expectError(loomCommDeregister(comms[0], NULL), loomInvalidArgument, "handle is NULL",
                     "deregister a NULL handle");
  if (bad) return 1;
  for (r = 0; r < 2; ++r) {
    if (loomCommRegister(comms[r], in[r], sizeof(in[r]), &h[r]) != loomSuccess || h[r] == NULL) {
      fprintf(stderr, "register: %s\n", loomGetLastError());
      return 1;
    }
  }
  /* Overlapping ranges are allowed, each with its own handle. */
  if (loomCommRegister(comms[0], in[0] + 8, 16 * sizeof(float), &inner) != loomSuccess ||
      inner == NULL || inner == h[0] ||
      loomCommRegister(comms[0], out[0], sizeof(out[0]), &left) != loomSuccess ||
      loomCommRegister(comms[1], out[1], sizeof(out[1]), &other) != loomSuccess) {
    fprintf(stderr, "overlapping register: %s\n", loomGetLastError());
    return 1;
  }
  bad |= expectError(loomCommDeregister(comms[0], other), loomInvalidArgument,
                     "not a registration of this communicator", "deregister another comm's handle");
  for (r = 0; r < 2; ++r)
    for (i = 0; i < 64; ++i) in[r][i] = (float)(r * i);
  loomGroupStart();
  for (r = 0; r < 2; ++r) loomAllReduce(in[r], out[r], 64, loomFloat32, loomMax, comms[r], NULL);
  if (loomGroupEnd() != loomSuccess) {
    fprintf(stderr, "allreduce on registered buffers: %s\n", loomGetLastError());
    return 1;
  }
  for (r = 0; r < 2; ++r)
    for (i = 0; i < 64; ++i)
      if (out[r][i] != (float)i) {
        fprintf(stderr, "registered: rank %d element %d: %f\n", r, i, out[r][i]);
        return 1;
      }
  if (loomCommDeregister(comms[0], h[0]) != loomSuccess ||
      loomCommDeregister(comms[0], inner) != loomSuccess) {
    fprintf(stderr, "deregister: %s\n", loomGetLastError());
    return 1;
  }
  bad |= expectError(loomCommDeregister(comms[0], h[0]), loomInvalidArgument,
                     "deregistered already", "deregister twice");
  bad |= expectError(loomCommDeregister(comms[1], h[0]), loomInvalidArgument,
                     "not a registration of this communicator", "deregister on the wrong comm");
  if (loomCommDeregister(comms[1], h[1]) != loomSuccess ||
      loomCommDeregister(comms[1], other) != loomSuccess) {
    fprintf(stderr, "deregister: %s\n", loomGetLastError());
    return 1;
  }
  /* `left` stays registered: loomCommDestroy releases it. */
  (void)left;
  return bad;
}

int main(void) {
  loomComm_t comms[2];
  float in[2][5], out[2][5];
  int r, i, version = 0;
  if (loomGetVersion(&version) != loomSuccess || version != LOOM_VERSION_CODE) return 1;
  if (loomCommInitAll(comms, 2, NULL) != loomSuccess) {
    fprintf(stderr, "init: %s\n", loomGetLastError());
    return 1;
  }
  for (r = 0; r < 2; ++r)
    for (i = 0; i < 5; ++i) in[r][i] = (float)(r + i);
  loomGroupStart();
  for (r = 0; r < 2; ++r) loomAllReduce(in[r], out[r], 5, loomFloat32, loomSum, comms[r], NULL);
  if (loomGroupEnd() != loomSuccess) {
    fprintf(stderr, "allreduce: %s\n", loomGetLastError());
    return 1;
  }
  for (r = 0; r < 2; ++r)
    for (i = 0; i < 5; ++i)
      if (out[r][i] != (float)(2 * i + 1)) {
        fprintf(stderr, "rank %d element %d: %f\n", r, i, out[r][i]);
        return 1;
      }
  if (loomAllReduce(NULL, out[0], 5, loomFloat32, loomSum, comms[0], NULL) != loomInvalidArgument ||
      strstr(loomGetLastError(), "sendbuff is NULL") == NULL) {
    fprintf(stderr, "expected an invalid-argument error, got '%s'\n", loomGetLastError());
    return 1;
  }
  if (registration(comms) != 0) return 1;
  for (r = 0; r < 2; ++r) loomCommDestroy(comms[r]);
  printf("c_api: OK\n");
  return 0;
}
