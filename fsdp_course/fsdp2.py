"""FSDP2 (``fully_shard``) measurement and theory, for lesson 5.

- ``CategoryPeakTracker``: PyTorch's ``FSDPMemTracker`` plus a running maximum per category.
  The tracker's own "peak" snapshot is the breakdown at the moment the *total* peaked, where
  the all-gather or gradient buffers can read 0; the running maxima say how large each
  category ever got.
- ``dtensor_rows``: what a DTensor parameter looks like on every rank (placements, global and
  local shapes, ``full_tensor()`` against a reference tensor).
- Theory (formulas in the docstrings): how ``fully_shard`` splits each parameter, the per-rank
  bytes that follow, and the bytes of each collective per step.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

# FSDPMemTracker's category names -> the course's words (the same as lesson 1's table).
CATEGORIES = {
    "Sharded Param": "params",
    "Sharded Grad": "grads",
    "OptState": "optimizer",
    "Unsharded Param": "gathered",
    "Unsharded Grad": "unsharded_grads",
    "All Gather": "all_gather_buffer",
    "Reduce Scatter": "reduce_scatter_buffer",
    "Activation": "activations",
    "Temp": "temp",
    "Buffer": "buffers",
    "Inputs": "inputs",
}


class CategoryPeakTracker(FSDPMemTracker):
    """``FSDPMemTracker`` that also keeps the largest value each category reached.

        tracker = CategoryPeakTracker(model, optimizer)
        with tracker:
            ...one training step...
        tracker.category_peaks()   # {"params": ..., "gathered": ..., "activations": ..., "peak": ...}
    """

    def __init__(self, mod: nn.Module, optm: torch.optim.Optimizer | None = None):
        super().__init__(mod, optm)
        self.running_max: dict[str, int] = {}

    def _fsdp_state_pre_forward(self, fsdp_mod, orig_fsdp_state_pre_fw):
        # FSDPMemTracker refuses a second forward of the root in one tracked region (gradient
        # accumulation runs several): forget the per-module stats of the previous forward
        # first. The per-category and total peaks are kept.
        inner = super()._fsdp_state_pre_forward(fsdp_mod, orig_fsdp_state_pre_fw)
        if fsdp_mod is not self._root_mod:
            return inner

        def forget_previous_forward(*args, **kwargs):
            if fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                self.reset_mod_stats()
            return inner(*args, **kwargs)

        return forget_previous_forward

    def _update_snap(self, *args, **kwargs) -> None:  # called on every allocation / free
        super()._update_snap(*args, **kwargs)
        for dev_snap in self._curr_mem_snap.values():
            for key, value in dev_snap.items():
                name = str(getattr(key, "value", key))
                if value > self.running_max.get(name, 0):
                    self.running_max[name] = value

    def category_peaks(self) -> dict[str, int]:
        """Bytes: the running maximum of each category, and ``peak`` (the total's maximum)."""
        peaks = {course: self.running_max.get(name, 0) for name, course in CATEGORIES.items()}
        peaks["peak"] = max(self._peak_mem.values(), default=0)
        return peaks


def placements_str(t: torch.Tensor) -> str:
    placements = getattr(t, "placements", None)
    return "(plain tensor)" if placements is None else ", ".join(map(str, placements))


def dtensor_rows(model: nn.Module, reference: nn.Module | None = None) -> list[dict]:
    """One row per parameter: placements, global shape, each rank's local shape, and whether
    ``full_tensor()`` equals the same parameter of ``reference`` (a plain single-process model).

    Collective: every rank must call it (``full_tensor()`` all-gathers; local shapes are
    exchanged with ``all_gather_object``).
    """
    ref = dict(reference.named_parameters()) if reference is not None else {}
    mine = []
    rows = []
    for name, p in model.named_parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        mine.append(list(local.shape))
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        row = {"name": name, "placements": placements_str(p), "global": list(p.shape)}
        if name in ref:
            row["full_equal"] = bool(torch.equal(full.detach().to(ref[name].dtype).cpu(),
                                                 ref[name].detach().cpu()))
        rows.append(row)
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, mine)
    for i, row in enumerate(rows):
        row["local"] = [shapes[i] for shapes in every_rank]
    return rows


def parse_reshard(value: str | bool | int) -> bool | int:
    """``--reshard-after-forward`` as fully_shard wants it: True, False, or an int (a smaller
    group size to reshard to after forward: 1 keeps a full copy on each rank)."""
    if isinstance(value, (bool, int)):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1.0"):
        return True
    if text in ("false", "no"):
        return False
    try:
        number = int(text)
    except ValueError:
        raise ValueError(f"--reshard-after-forward: true, false or a group size, got {value!r}") from None
    if number < 1:
        raise ValueError(f"--reshard-after-forward: a group size must be >= 1, got {number}")
    return number


def causal_mask_errors(model: nn.Module) -> int:
    """How many attention ``mask`` buffers differ from the causal (lower-triangular) mask.
    A model built on the meta device and only ``to_empty()``-ed has garbage there."""
    bad = 0
    for module in model.modules():
        mask = getattr(module, "mask", None)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            want = torch.ones_like(mask, dtype=torch.bool).tril()
            # Compare the raw bytes: uninitialised bool memory may hold values other than 0 / 1.
            if not torch.equal(mask.view(torch.uint8), want.view(torch.uint8)):
                bad += 1
    return bad


# --- script plumbing (what lesson 5 is not about) ---------------------------------------------

class MemoryProbe:
    """Per-rank bytes by category over one step, in the same columns for both APIs.

    FSDP2: ``CategoryPeakTracker`` (PyTorch's FSDPMemTracker). Classic FSDP, which that tracker
    does not understand: lesson 1's counters (``state_bytes`` of the tensors, the gathered flat
    parameters' storages, the tensors autograd saved). ``enabled=False``: measures nothing.
    """

    def __init__(self, model: nn.Module, optimizer, enabled: bool = True):
        from torch.distributed.fsdp import FSDPModule

        self.model, self.optimizer, self.enabled = model, optimizer, enabled
        self.fsdp2 = isinstance(model, FSDPModule) or isinstance(getattr(model, "_orig_mod", None), FSDPModule)
        self.peaks: dict[str, int] = {}
        self._stack = ExitStack()

    def __enter__(self):
        if not self.enabled:
            return self
        if self.fsdp2:
            self.tracker = self._stack.enter_context(CategoryPeakTracker(self.model, self.optimizer))
        else:
            from fsdp_course.measure import GatheredParamTracker, activation_bytes

            self.gathered = self._stack.enter_context(GatheredParamTracker(self.model))
            self.activations = self._stack.enter_context(activation_bytes(self.model))
        return self

    def before_zero_grad(self) -> None:
        """Count parameters, gradients and optimizer state from the tensors while gradients
        exist (both APIs, so the columns compare; FSDPMemTracker's own optimizer category also
        holds step() temporaries: kept as ``optimizer_step``)."""
        if self.enabled:
            from fsdp_course.measure import state_bytes

            self.state = state_bytes(self.model, self.optimizer)

    def __exit__(self, *exc):
        self._stack.close()
        if not self.enabled:
            return False
        if self.fsdp2:
            self.peaks.update(self.tracker.category_peaks())
            self.peaks["optimizer_step"] = self.peaks["optimizer"]
            self.peaks.update(self.state)
        else:
            self.peaks.update(self.state)
            self.peaks.update(gathered=self.gathered.peak, activations=self.activations["bytes"])
            self.peaks["peak"] = sum(self.peaks[k] for k in SUM_KEYS)
        self.peaks["sum"] = sum(self.peaks.get(k, 0) for k in SUM_KEYS)
        return False

    def peak(self) -> int:
        return self.peaks.get("peak", 0)


SUM_KEYS = ("params", "grads", "optimizer", "gathered", "activations")


def expand_variants(cfg, spec: str | None) -> list:
    """``--variants "api=classic;prefetch=2,mixed-precision=true"`` -> one config per variant,
    each the command line's config with those fields replaced (``;`` between variants, ``,``
    between fields). No spec: just ``cfg``."""
    if not spec:
        return [cfg]
    names = {f.name: f for f in dataclasses.fields(cfg)}
    variants = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        changes = {}
        for item in filter(None, (i.strip() for i in part.split(","))):
            key, sep, value = item.partition("=")
            name = key.strip().lstrip("-").replace("-", "_")
            if not sep or name not in names or name in ("variants", "metrics"):
                raise ValueError(f"--variants: cannot read {item!r} (write flag=value, e.g. prefetch=2)")
            current = getattr(cfg, name)
            value = value.strip()
            if isinstance(current, bool):
                changes[name] = value.lower() in ("1", "true", "yes", "on")
            elif isinstance(current, int):
                changes[name] = int(value)
            elif isinstance(current, float):
                changes[name] = float(value)
            else:
                changes[name] = None if value.lower() in ("", "none") else value
        variants.append(dataclasses.replace(cfg, **changes))
    return variants


def variant_label(cfg) -> str:
    """A short name for a run: 'fsdp2 raf=true bf16 prefetch=2'."""
    parts = [cfg.api, f"raf={cfg.reshard_after_forward}"]
    parts += ["bf16"] * cfg.mixed_precision + [f"prefetch={cfg.prefetch}"] * bool(cfg.prefetch)
    parts += [f"accum={cfg.grad_accum}"] * (cfg.grad_accum > 1) + ["offload"] * cfg.cpu_offload
    parts += ["compile"] * cfg.compile + [f"bug={cfg.bug}"] * bool(cfg.bug)
    parts += [f"hsdp {cfg.replicas}x"] * (cfg.replicas > 1) + ["shard-module"] * bool(cfg.shard_module)
    return " ".join(parts)


def load_shard_fn(path: str):
    """``shard(model, mesh)`` from the Python file at ``path`` (the exercise's entry point)."""
    import importlib.util
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--shard-module {path}: no such file")
    spec = importlib.util.spec_from_file_location("learner_shard", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shard = getattr(module, "shard", None)
    if not callable(shard):
        raise AttributeError(f"--shard-module {path}: defines no function shard(model, mesh)")
    return shard


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2] if values else float("nan")


def validate(cfg, world_size: int) -> None:
    """Refuse flag combinations that mean nothing (ValueError: the script turns it into one line)."""
    reshard = parse_reshard(cfg.reshard_after_forward)
    if cfg.bug == "compile-whole":
        cfg.compile = True  # the bug is about how to compile: it implies --compile
    if cfg.api == "classic":
        fsdp2_only = {"--bug": cfg.bug, "--shard-module": cfg.shard_module, "--prefetch": cfg.prefetch,
                      "--cpu-offload": cfg.cpu_offload, "--compile": cfg.compile}
        used = [flag for flag, value in fsdp2_only.items() if value]
        if used:
            raise ValueError(f"api=classic: {', '.join(used)} belong to the FSDP2 path (api=fsdp2)")
        if reshard is not True and reshard is not False:
            raise ValueError("api=classic: reshard-after-forward true (FULL_SHARD) or false (SHARD_GRAD_OP)")
    if reshard is not True and reshard is not False and (reshard > world_size or world_size % reshard):
        raise ValueError(f"--reshard-after-forward {reshard}: must divide the {world_size} ranks")
    if cfg.replicas < 1 or world_size % cfg.replicas:
        raise ValueError(f"--replicas {cfg.replicas}: must divide the {world_size} ranks")
    if cfg.api == "classic" and cfg.replicas > 1:
        raise ValueError("api=classic: --replicas is for fully_shard here (lesson 1 has HYBRID_SHARD)")
    if cfg.grad_accum < 1 or cfg.steps < 1 or cfg.prefetch < 0:
        raise ValueError("--grad-accum and --steps must be >= 1, --prefetch >= 0")


def unit_types() -> tuple:
    """Module classes that mark a sharding unit: FSDP2's FSDPModule and classic FSDP."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel

    return (FSDPModule, FullyShardedDataParallel)


def gather(obj) -> list:
    """Every rank's ``obj`` (a small picklable value), in rank order."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def problems(checks: dict, steps: int) -> list[str]:
    """The pitfalls the checks reveal, one sentence each (empty: none)."""
    found = []
    if checks["mask_errors"]:
        found.append(f"{checks['mask_errors']} attention mask buffer(s) (all ranks) are not causal: "
                     "to_empty() left them uninitialised and the state dict does not carry them "
                     "(call model.init_weights() after to_empty)")
    if not checks["loss0_matches_reference"]:
        found.append(f"step-0 loss {checks['loss0']:.4f} != single-process reference "
                     f"{checks['reference_loss0']:.4f} on the same weights and batch")
    if not checks["optimizer_holds_model_params"]:
        found.append(f"the optimizer does not hold the model's parameters: only "
                     f"{checks['params_changed']} of {checks['num_params']} shards changed in "
                     f"{steps} steps (build the optimizer after fully_shard)")
    elif steps > 1 and checks["params_changed"] < checks["num_params"]:
        found.append(f"only {checks['params_changed']} of {checks['num_params']} shards changed")
    return found


def dtensor_table(rows: list[dict], brief: bool = False) -> list[dict]:
    """Rows for printing: with ``brief``, the parameters outside the blocks and block 0 only."""
    keep = [r for r in rows if not brief or not r["name"].startswith("blocks.")
            or r["name"].startswith("blocks.0.")]
    return [{"parameter": r["name"], "placements": r["placements"], "global": tuple(r["global"]),
             "local per rank": " ".join(str(tuple(s)) for s in r["local"]),
             "full_tensor() == reference": r.get("full_equal", "-")} for r in keep]


def comparison_rows(runs: list[dict]) -> list[dict]:
    """One row per trained run: memory categories (MiB, rank 0), collective MiB, ms per step, loss."""
    rows = []
    for run in runs:
        if not run.get("history"):  # a variant that stopped before training (compile-whole)
            continue
        mem, comm = run["memory"], run["collectives"]
        row = {"run": run["label"]}
        for key in (*SUM_KEYS, "all_gather_buffer", "unsharded_grads", "peak"):
            row[key] = round(mem[key] / 2 ** 20, 3) if key in mem else "-"
        row["all_gather MiB"] = round(comm.get("all_gather", {}).get("bytes", 0) / 2 ** 20, 3)
        row["reduce_scatter MiB"] = round(comm.get("reduce_scatter", {}).get("bytes", 0) / 2 ** 20, 3)
        row["ms/step"] = round(run["ms_per_step"], 1)
        row["loss last"] = round(run["loss_last"], 4)
        rows.append(row)
    return rows
