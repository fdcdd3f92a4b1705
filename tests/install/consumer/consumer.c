/* A program outside Loom's tree, built against an installed Loom (tests/install/install_test.sh):
 * two ranks as threads of this process sum a buffer; it prints the result and exits 0 when every
 * element is right. */
#include <loom/loom.h>
#include <pthread.h>
#include <stdio.h>

#define COUNT 1024

struct rank {
  loomComm_t comm;
  float in[COUNT], out[COUNT];
  loomResult_t result;
};

static void* run(void* arg) {
  struct rank* r = (struct rank*)arg;
  r->result = loomAllReduce(r->in, r->out, COUNT, loomFloat32, loomSum, r->comm, NULL);
  return NULL;
}

int main(void) {
  int version = 0;
  loomComm_t comms[2];
  static struct rank ranks[2];
  pthread_t threads[2];
  if (loomGetVersion(&version) != loomSuccess || loomCommInitAll(comms, 2, NULL) != loomSuccess) {
    fprintf(stderr, "consumer: %s\n", loomGetLastError());
    return 3;
  }
  for (int r = 0; r < 2; ++r) {
    ranks[r].comm = comms[r];
    for (int i = 0; i < COUNT; ++i) ranks[r].in[i] = (float)(r + 1) * (float)i;
    pthread_create(&threads[r], NULL, run, &ranks[r]);
  }
  for (int r = 0; r < 2; ++r) pthread_join(threads[r], NULL);
  int wrong = 0;
  for (int r = 0; r < 2; ++r) {
    if (ranks[r].result != loomSuccess) {
      fprintf(stderr, "consumer: rank %d: %s\n", r, loomGetErrorString(ranks[r].result));
      return 3;
    }
    for (int i = 0; i < COUNT; ++i) wrong += ranks[r].out[i] != 3.0f * (float)i;
    loomCommDestroy(comms[r]);
  }
  printf("consumer: Loom %d, allreduce of %d floats on 2 ranks, %d wrong\n", version, COUNT, wrong);
  return wrong ? 1 : 0;
}
