"""How long a rank waits in a collective before it gives up (lesson 0): what this job uses, and
PyTorch's defaults as the installed torch defines them. Code only lesson 0 needs."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.constants as constants

NCCL_HEADER = "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"


def nccl_default_timeout() -> tuple[timedelta | None, str]:
    """NCCL's default timeout and where it was read. A torch built with NCCL exposes it as
    ``torch.distributed.constants.default_pg_nccl_timeout``; a CPU-only build sets that to None,
    but still ships the C++ header that defines it (``kProcessGroupNCCLDefaultTimeout``)."""
    if constants.default_pg_nccl_timeout is not None:
        source = "torch.distributed.constants.default_pg_nccl_timeout"
        return constants.default_pg_nccl_timeout, source
    header = Path(torch.__file__).parent / NCCL_HEADER
    text = header.read_text() if header.is_file() else ""
    match = re.search(r"kProcessGroupNCCLDefaultTimeout\s*=\s*"
                      r"std::chrono::milliseconds\(([\d\s*]+)\)", text)
    if not match:
        return None, "not found in this torch"
    milliseconds = math.prod(int(factor) for factor in match.group(1).split("*"))
    source = f"torch/{NCCL_HEADER} (kProcessGroupNCCLDefaultTimeout)"
    return timedelta(milliseconds=milliseconds), source


def collective_timeouts(device: torch.device) -> dict:
    """Seconds: this job's process-group timeout (read back from the group itself), and the
    defaults ``init_process_group`` uses when no ``timeout=`` is given: gloo (and any backend
    but NCCL) ``torch.distributed.constants.default_pg_timeout``, NCCL its own."""
    job = dist.group.WORLD._get_backend(device).options._timeout
    nccl, nccl_source = nccl_default_timeout()
    return {"this_job_s": job.total_seconds(),
            "gloo_default_s": constants.default_pg_timeout.total_seconds(),
            "gloo_source": "torch.distributed.constants.default_pg_timeout",
            "nccl_default_s": nccl.total_seconds() if nccl else None, "nccl_source": nccl_source}
