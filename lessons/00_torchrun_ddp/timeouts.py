"""How long a rank waits in a collective before it gives up (lesson 0): what this job uses, and
PyTorch's defaults as the installed torch defines them. Code only lesson 0 needs."""

from __future__ import annotations

import torch
import torch.distributed as dist

from fsdp_course.dist import default_timeouts


def collective_timeouts(device: torch.device) -> dict:
    """Seconds: this job's process-group timeout (read back from the group itself), and the
    defaults ``init_process_group`` uses when no ``timeout=`` is given: gloo (and any backend
    but NCCL) ``torch.distributed.constants.default_pg_timeout``, NCCL its own."""
    job = dist.group.WORLD._get_backend(device).options._timeout
    defaults = default_timeouts()
    (gloo, gloo_source), (nccl, nccl_source) = defaults["gloo"], defaults["nccl"]
    return {"this_job_s": job.total_seconds(),
            "gloo_default_s": gloo.total_seconds(), "gloo_source": gloo_source,
            "nccl_default_s": nccl.total_seconds() if nccl else None, "nccl_source": nccl_source}
