"""Failures on "loom" are Python exceptions carrying Loom's message, never hangs (--mode):
  dead      rank 1 exits without a word; rank 0's all_reduce raises DistBackendError naming rank 1
  mismatch  ranks pass tensors of different sizes to one all_reduce: every rank raises
  timeout   rank 1 never joins; rank 0's all_reduce raises when the group's timeout (5 s) passes
  abort     rank 0 aborts its process group (_abort_process_group) with an all_reduce in flight
            that rank 1 never joins: wait() raises at once; the group's later calls raise too
Every mode ends with destroy_process_group, which must return; a watchdog fails a hung rank.

    python3 tests/torch/failure_test.py --nprocs 2 --mode dead
"""

import argparse
import datetime
import faulthandler
import os
import time

import torch
import torch.distributed as dist

from common import expect, free_port, launch, raises  # noqa: F401

WATCHDOG_S = 90


def main(rank, n, port):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True, choices=["dead", "mismatch", "timeout", "abort"])
    mode = parser.parse_known_args()[0].mode
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)  # a hang fails with a traceback
    timeout = datetime.timedelta(seconds=5 if mode == "timeout" else 30)
    dist.init_process_group("loom", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n, timeout=timeout)
    side = dist.new_group(backend="gloo")  # to line the ranks up outside Loom
    t = torch.ones(1000)
    dist.all_reduce(t)  # everything works first
    start = time.monotonic()
    if mode == "dead":
        if rank == 1:
            os._exit(0)
        msg = raises(lambda: dist.all_reduce(torch.ones(1 << 16)), ["rank 1"],
                     "all_reduce after rank 1 died")
    elif mode == "mismatch":
        msg = raises(lambda: dist.all_reduce(torch.ones(100 if rank == 0 else 300)), ["loom"],
                     "all_reduce of mismatched sizes")
    elif mode == "timeout":
        if rank == 0:
            msg = raises(lambda: dist.all_reduce(torch.ones(10)), ["loom"],
                         "all_reduce that rank 1 never joins")
            expect(time.monotonic() - start < 30, "the 5 s timeout took over 30 s")
        dist.barrier(group=side)
    elif mode == "abort":
        if rank == 0:
            work = dist.all_reduce(torch.ones(10), async_op=True)
            time.sleep(0.3)
            expect(not work.is_completed(), "the all_reduce completed without rank 1")
            dist.distributed_c10d._abort_process_group()
            msg = raises(work.wait, ["loom"], "wait() after the abort")
            expect(time.monotonic() - start < 20, "the abort took over 20 s")
        else:
            time.sleep(1)
            msg = ""
        if rank == 0:
            print(f"failure_test abort: {msg}", flush=True)
            os._exit(0)  # the default group is gone: nothing to destroy
        # rank 1's communicator lost rank 0: its destroy must still return
        dist.destroy_process_group()
        os._exit(0)
    if rank == 0:
        print(f"failure_test {mode}: raised after {time.monotonic() - start:.1f} s: {msg}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    launch(main)
