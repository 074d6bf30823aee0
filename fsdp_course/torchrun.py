"""``python -m fsdp_course.torchrun [torchrun flags] script.py [script flags]``: torchrun, quieter.

The launchers call this instead of ``torch.distributed.run``. It runs the same agent with the
same flags; what differs is what a learner sees when a rank fails: one line naming the rank and
its exit code (the rank's own message is already above it) instead of the agent's traceback,
and the rank's exit code passed on (2 for bad input, as the scripts use it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run


def _exit_code(code: int) -> int:
    if code < 0:  # killed by a signal: report it the way a shell would
        return 128 + (-code)
    return code if 0 < code < 256 else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "OMP_NUM_THREADS" not in os.environ and str(args.nproc_per_node) not in ("1", "auto"):
        # torchrun would set this too, with a banner; several ranks sharing the cores should not
        # each start a thread per core.
        os.environ["OMP_NUM_THREADS"] = "1"
    if not os.environ.get("COURSE_DEBUG"):
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(args)
    except ChildFailedError as exc:
        # The rank that failed on its own, not one the agent then stopped with SIGTERM.
        exited = {r: f for r, f in exc.failures.items() if f.exitcode > 0}
        rank, failure = min(exited.items()) if exited else exc.get_first_failure()
        code = failure.exitcode
        how = (f"was killed by {signal.Signals(-code).name}" if code < 0
               else f"exited with code {code}")
        print(f"torchrun: rank {rank} {how}; its message is above "
              f"(COURSE_DEBUG=1 shows the agent's report)", file=sys.stderr)
        return _exit_code(code)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
