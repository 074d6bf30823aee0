"""Lesson 7's memory calculator: sliders in, the planner's per-rank bytes out.

    from calculator import memory_calculator
    memory_calculator()          # in the notebook: sliders, a stacked bar, fits / does not fit

Every number comes from ``fsdp_course.theory.memory.plan``, the function the lesson checks
against measured runs; ``figure(settings)`` draws the same bar without widgets.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course_lab.figures import color
from fsdp_course.plan import MODELS
from fsdp_course.theory import memory

GIB = 1024 ** 3
PARTS = ("params", "grads", "optimizer", "buffers", "gathered", "activations", "working")
COLORS = tuple(color(part) for part in PARTS)  # the course's colours: params blue in every lesson
# It starts at section 1's model: the planner's course-gpt-7b, by its own count.
DEFAULTS = {"params_b": MODELS["course-gpt-7b"]().num_params / 1e9, "world_size": 8,
            "strategy": "FULL_SHARD", "precision": "bf16-mixed", "ac": "none", "batch": 1,
            "seq": 2048, "gpu_gib": 80.0}


def plan_for(params_b: float, world_size: int, strategy: str, precision: str, ac: str,
             batch: int, seq: int, gpu_gib: float) -> dict:
    """The planner for exactly ``params_b`` billion parameters, as ``python -m fsdp_course.plan
    --params`` plans them (``memory.model_for_params``: a 32-block GPT of that size for the
    activations)."""
    shape = memory.model_for_params(params_b * 1e9, seq=seq)
    return memory.plan(shape, batch, world_size, strategy=strategy, api="fsdp2",
                       precision=precision, ac=ac, gpu_bytes=gpu_gib * GIB)


def figure(settings: dict, ax=None):
    """A stacked bar of the peak's parts (GiB per rank) and a line at the GPU's size."""
    result = plan_for(**settings)
    ax = ax or plt.subplots(figsize=(7, 3.2))[1]
    bottom = 0.0
    for part, shade in zip(PARTS, COLORS):
        value = result["at_peak"].get(part, 0) / GIB
        if value:
            ax.barh([0], [value], left=bottom, color=shade, label=f"{part} {value:.1f}")
            bottom += value
    allowance = result["allowance"] / GIB
    ax.barh([0], [allowance], left=bottom, color="white", edgecolor="black", hatch="//",
            label=f"allowance {allowance:.1f}")
    ax.axvline(settings["gpu_gib"], color="black", linestyle="--")
    verdict = "fits" if result["fits"] else "does NOT fit"
    ax.set_title(f"{result['num_params'] / 1e9:.3f}B params, {settings['strategy']} on "
                 f"{settings['world_size']} GPUs: {result['needed'] / GIB:.1f} GiB per rank "
                 f"at the peak ({result['peak_moment']}) -> {verdict} in {settings['gpu_gib']:g} "
                 "GiB")
    ax.set_yticks([])
    ax.set_xlabel("GiB per rank")
    ax.set_xlim(0, max(settings["gpu_gib"], result["needed"] / GIB) * 1.05)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8, frameon=False)
    return result


def memory_calculator(**start):
    """Sliders for the settings; the bar redraws from the planner on every change."""
    import ipywidgets as widgets
    from IPython.display import display

    values = {**DEFAULTS, **start}
    controls = {
        "params_b": widgets.FloatLogSlider(value=values["params_b"], base=10, min=-1, max=2.5,
                                           step=0.05, readout_format=".3f",
                                           description="params (B)"),
        "world_size": widgets.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                                              value=values["world_size"], description="GPUs"),
        "strategy": widgets.Dropdown(options=list(memory.STRATEGIES[:2]) + ["DDP"],
                                     value=values["strategy"], description="strategy"),
        "precision": widgets.Dropdown(options=list(memory.PRECISIONS), value=values["precision"],
                                      description="precision"),
        "ac": widgets.Dropdown(options=["none", "every-2", "full"], value=values["ac"],
                               description="act. ckpt"),
        "batch": widgets.IntSlider(value=values["batch"], min=1, max=32, description="batch/GPU"),
        "seq": widgets.SelectionSlider(options=[512, 1024, 2048, 4096, 8192, 16384],
                                       value=values["seq"], description="sequence"),
        "gpu_gib": widgets.SelectionSlider(options=[16.0, 24.0, 40.0, 48.0, 80.0, 94.0, 141.0,
                                                    192.0],
                                           value=values["gpu_gib"], description="GPU GiB"),
    }
    out = widgets.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            figure({name: control.value for name, control in controls.items()})
            plt.show()

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    display(widgets.VBox([widgets.HBox(list(controls.values())[:4]),
                          widgets.HBox(list(controls.values())[4:]), out]))
    return controls
