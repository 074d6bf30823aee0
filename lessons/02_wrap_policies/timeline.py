"""One training step of classic FSDP as a timeline, per unit and per rank (lesson 2).

``StepTimeline(model)`` records, while a step runs inside ``with StepTimeline(model) as tl:``,
for every FSDP unit of this rank:

    held            its all-gathered (unsharded) flat parameter is allocated: from the moment its
                    storage appears until FSDP frees it (storage resized to zero)
    all_gather      the collective that fills it: from the operator's call until the next thing
                    the rank does (FSDP waits for the data before it goes on)
    forward         the unit is the innermost unit running: its module's code and FSDP's work
    backward        around it (time in a nested unit belongs to that unit; collectives are cut
                    out and recorded on their own)
    reduce_scatter  its gradient's collective, issued by FSDP right after the gradient is ready

Events are measured, not modelled: hooks on the modules and on each flat parameter, and a
dispatch mode that sees every operator (collectives included) and, around each one, which
gathered buffers are allocated. ``tl.events`` is a list of ``{"unit", "what", "start", "end",
"bytes"}`` in milliseconds since the ``with`` began; ``phase("forward")`` marks step phases
(unit ``"(step)"``). ``held_peak(events)`` recomputes the all-gather peak from the events alone.
Times are those of the rank's CPU thread: on CPU ranks, when the work ran; on a GPU, when the
thread queued it (the GPU runs it later, on its own streams).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from fsdp_course.measure import op_name, tensors_in
from fsdp_course.wrapping import unit_name

STEP = "(step)"


def _gathered_bytes(fsdp_module) -> int:
    """Bytes of the unit's all-gathered flat parameter allocated now (0: freed, or not yet made:
    FSDP creates the buffer at its first forward)."""
    buffer = getattr(fsdp_module._handle.flat_param, "_full_param_padded", None)
    return 0 if buffer is None else buffer.untyped_storage().nbytes()


class StepTimeline(TorchDispatchMode):
    """Records when each classic FSDP unit is gathered, computes and is freed (module doc)."""

    def __init__(self, model: nn.Module, enabled: bool = True):
        super().__init__()
        self.enabled = enabled  # False: records nothing and costs nothing (steps not traced)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        self.units = {unit_name(path): module for path, module in model.named_modules()
                      if isinstance(module, FSDP) and module._handle is not None}
        self.events: list[dict] = []
        self._held: dict[str, dict] = {}     # unit -> its open "held" event
        self._stack: list[list] = []         # [unit, phase, its current event]; the top computes
        self._open_collective: dict | None = None
        self._last_grad_ready: str | None = None
        self._hooks = []

    # --- recording ------------------------------------------------------------------------
    def _now(self) -> float:
        return (time.perf_counter() - self._t0) * 1e3

    def _event(self, unit: str, what: str, num_bytes: int = 0) -> dict:
        event = {"unit": unit, "what": what, "start": self._now(), "end": None, "bytes": num_bytes}
        self.events.append(event)
        return event

    def _close(self, event: dict | None) -> None:
        if event is not None and event["end"] is None:
            event["end"] = self._now()

    def _poll(self, resume: bool = True) -> None:
        """Anything that happens next ends an open collective (the unit that was computing
        resumes, unless a hook is about to change it); note the gathered buffers freed or
        allocated since the last look."""
        if self._open_collective is not None:
            self._close(self._open_collective)
            self._open_collective = None
            if resume and self._stack:
                unit, phase, _ = self._stack[-1]
                self._stack[-1][2] = self._event(unit, phase)
        for unit, module in self.units.items():
            size = _gathered_bytes(module)
            if size == 0 and unit in self._held:
                self._close(self._held.pop(unit))
            elif size > 0 and unit not in self._held:
                self._held[unit] = self._event(unit, "held", size)

    def _push(self, unit: str, phase: str) -> None:
        self._poll(resume=False)
        if self._stack:  # the unit that was computing pauses while this one runs
            self._close(self._stack[-1][2])
        self._stack.append([unit, phase, self._event(unit, phase)])

    def _pop(self, unit: str) -> None:
        self._poll(resume=False)
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == unit:
                top = i == len(self._stack) - 1
                self._close(self._stack.pop(i)[2])
                if top and self._stack:
                    outer_unit, phase, _ = self._stack[-1]
                    self._stack[-1][2] = self._event(outer_unit, phase)
                return

    def _on_forward_output(self, unit: str, output) -> None:
        self._pop(unit)
        for tensor in tensors_in(output):  # backward reaches this unit when its output's grad does
            if tensor.requires_grad:
                tensor.register_hook(lambda grad, unit=unit: self._push(unit, "backward"))

    def _on_grad_ready(self, unit: str) -> None:
        self._last_grad_ready = unit  # FSDP reduce-scatters this unit's gradient next
        self._pop(unit)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._poll()
        if func.namespace == "c10d" and func.name().split("::")[-1] not in ("wait", "barrier"):
            kind = op_name(func)
            if self._stack:  # computing pauses while the rank waits for the collective
                self._close(self._stack[-1][2])
            self._open_collective = self._event(self._collective_unit(kind, args), kind)
        out = func(*args, **(kwargs or {}))
        if self._open_collective is None:
            self._poll()
        return out

    def _collective_unit(self, kind: str, args) -> str:
        if kind == "reduce_scatter":
            return self._last_grad_ready or "?"
        pointers = {t.untyped_storage().data_ptr() for t in tensors_in(list(args))}
        for unit, module in self.units.items():
            buffer = getattr(module._handle.flat_param, "_full_param_padded", None)
            if buffer is not None and buffer.untyped_storage().data_ptr() in pointers:
                return unit
        return "?"

    @contextmanager
    def phase(self, name: str):
        """Mark a phase of the step (forward, backward, optimizer) on the ``(step)`` row."""
        event = self._event(STEP, name) if self.enabled else None
        try:
            yield
        finally:
            self._close(event)

    # --- lifetime ---------------------------------------------------------------------------
    def __enter__(self):
        self._t0 = time.perf_counter()
        if not self.enabled:
            return self
        for unit, fsdp_module in self.units.items():
            inner = fsdp_module._fsdp_wrapped_module
            self._hooks += [
                inner.register_forward_pre_hook(lambda m, a,
                                                unit=unit: self._push(unit, "forward")),
                inner.register_forward_hook(lambda m, a, out,
                                            unit=unit: self._on_forward_output(unit, out)),
                fsdp_module._handle.flat_param.register_hook(
                    lambda grad, unit=unit: self._on_grad_ready(unit)),
            ]
        self._poll()
        return super().__enter__()

    def __exit__(self, *exc):
        if not self.enabled:
            return None
        result = super().__exit__(*exc)
        self._poll()
        for hook in self._hooks:
            hook.remove()
        for event in self.events:
            self._close(event)
        return result


def held_peak(events: list[dict]) -> int:
    """The most bytes of gathered parameters held at once, from the ``held`` events alone
    (a buffer freed at the same instant another is allocated is counted as freed first)."""
    changes = sorted([(e["start"], 1, e["bytes"]) for e in events if e["what"] == "held"]
                     + [(e["end"], 0, -e["bytes"]) for e in events if e["what"] == "held"])
    peak = held = 0
    for _, _, delta in changes:
        held += delta
        peak = max(peak, held)
    return peak
