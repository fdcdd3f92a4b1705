/* The public header compiles as C and the shared library works from C: two ranks as threads of
 * one process driven by one thread through a group, an AllReduce, and error reporting. */
#include <loom/loom.h>
#include <stdio.h>
#include <string.h>

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
  for (r = 0; r < 2; ++r) loomCommDestroy(comms[r]);
  printf("c_api: OK\n");
  return 0;
}
