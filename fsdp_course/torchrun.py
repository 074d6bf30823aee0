"""``python -m fsdp_course.torchrun [torchrun flags] script.py [script flags]``: torchrun, quieter.

The launchers call this instead of ``torch.distributed.run``. It runs the same agent with the
same flags; what differs is what a learner sees when a rank fails: one line naming the rank
whose failure came first and its exit code or signal (the rank's own message is already above
it) instead of the agent's traceback, and that rank's exit code passed on (2 for bad input, as
the scripts use it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import parse_args, run

from fsdp_course.dist import say


def _exit_code(code: int) -> int:
    if code < 0:  # killed by a signal: report it the way a shell would
        return 128 + (-code)
    return code if 0 < code < 256 else 1


def _how(failure: ProcessFailure) -> str:
    code = failure.exitcode
    if code < 0:
        return f"was killed by {failure.signal_name()} (signal {-code})"
    return f"exited with code {code}"


def _stopped_by_agent(failure: ProcessFailure) -> bool:
    """SIGTERM is how the agent stops the ranks still running once one has failed."""
    return failure.exitcode == -signal.SIGTERM


def root_cause(failures: dict[int, ProcessFailure]) -> tuple[int, ProcessFailure]:
    """The rank whose failure caused the others. The agent stamps each failure in whole seconds
    when it notices it (every 0.1 s, ``--monitor-interval``), so a rank that died and a peer
    that failed on the broken connection can share a stamp. Among the failures of the first
    second or so: a rank killed by a signal (nothing a peer does causes that), else the first
    (a rank that lost a peer waits a second before it exits: see fsdp_course.dist), and a rank
    the agent stopped with SIGTERM last; then the lowest rank."""
    first = min(failure.timestamp for failure in failures.values())
    together = {rank: f for rank, f in failures.items() if f.timestamp <= first + 1}

    def order(item: tuple[int, ProcessFailure]):
        rank, failure = item
        killed = failure.exitcode < 0 and not _stopped_by_agent(failure)
        return (not killed, _stopped_by_agent(failure), failure.timestamp, rank)

    return min(together.items(), key=order)


def report(failures: dict[int, ProcessFailure]) -> tuple[str, int]:
    """The launcher's one line about a failed run, and the exit code to leave with."""
    rank, failure = root_cause(failures)
    line = f"torchrun: rank {rank} {_how(failure)}"
    line += "; its message is above" if failure.exitcode > 0 else ""
    after = [
        f"rank {r} {_how(f)}"
        for r, f in sorted(failures.items())
        if r != rank and not _stopped_by_agent(f)
    ]
    if after:
        line += f"; after it, {', '.join(after)}"
    return line + " (COURSE_DEBUG=1 shows the agent's report)", _exit_code(failure.exitcode)


def note_launch(args) -> None:
    """Append one line per launch to ``$COURSE_LAUNCH_LOG`` when it is set: the test suite
    counts its torchrun launches this way (tests/conftest.py prints the count)."""
    path = os.environ.get("COURSE_LAUNCH_LOG")
    if not path:
        return
    line = f"{args.nproc_per_node} {args.training_script} {' '.join(args.training_script_args)}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one append per line: several launchers share the file
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    note_launch(args)
    if "OMP_NUM_THREADS" not in os.environ and str(args.nproc_per_node) not in ("1", "auto"):
        # torchrun would set this too, with a banner; several ranks sharing the cores should not
        # each start a thread per core.
        os.environ["OMP_NUM_THREADS"] = "1"
    if not os.environ.get("COURSE_DEBUG"):
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(args)
    except ChildFailedError as exc:
        line, code = report(exc.failures)
        say(line)
        return code
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
