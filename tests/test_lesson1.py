"""Lesson 1 under torchrun on CPU ranks: every strategy's bytes per rank and per collective equal
the theory to the byte; shards are equal and padded only where needed; reduce-scatter averages;
torch.nn.utils.clip_grad_norm_ sees the shard, FSDP.clip_grad_norm_ the whole; use_orig_params's
names, groups and alignment padding; sync_module_states refused on CPU; the instruments watch one
step and ms/step times the others.

The launches are the notebook's own, declared once in lessons/01_fsdp_strategies/launches.toml:
within one test run the notebook's test and these share them (tests/run_cache.py). The 2-rank
runs are one launch: the strategies, then --variants (sync_module_states, mixed precision,
use_orig_params, HYBRID_SHARD without a mesh)."""

import importlib.util
import math
import statistics
from pathlib import Path

import pytest

from course_lab.exercises.lesson1 import cases_from_metrics, check_predict_bytes
from course_lab.notebook import mib
from fsdp_course import theory
from fsdp_course.theory import sharding
from helpers import lesson_script
from lesson_runs import launch, ok

REPO = Path(__file__).resolve().parents[1]
STATE = ("params", "grads", "optimizer")
SYNC, BF16, ORIG, NO_MESH = (
    "FULL_SHARD + sync_module_states",
    "FULL_SHARD + bf16 mixed precision",
    "FULL_SHARD + use_orig_params",
    "HYBRID_SHARD + no device mesh",
)


def notebook_launch(name, check=True):
    """A launch of the notebook's (lessons/01_fsdp_strategies/launches.toml)."""
    proc, metrics = launch(1, name)
    if check:
        ok(proc)
    return proc, metrics


@pytest.fixture(scope="module")
def m2():
    return notebook_launch("two_ranks")[1]


@pytest.fixture(scope="module")
def variants(m2):
    return {r["label"]: r for r in m2["results"]["variants"]}


@pytest.fixture(scope="module")
def n2(m2):
    return {r["strategy"]: r for r in m2["results"]["runs"]}


@pytest.fixture(scope="module")
def m4():
    return notebook_launch("four_ranks")[1]


@pytest.fixture(scope="module")
def n4(m4):
    return {r["strategy"]: r for r in m4["results"]["runs"]}


@pytest.fixture(scope="module")
def orig(variants):
    return variants[ORIG]


@pytest.fixture(scope="module")
def mixed(variants):
    return variants[BF16]


def state(run):
    return {k: run["bytes"][k] for k in STATE}


def rank_theory(run, world_size, rank):
    return sharding.rank_state_bytes(
        run["unit_param_numels"],
        world_size,
        run["strategy"],
        run["replicas"],
        rank,
        run["use_orig_params"],
        compute_bytes=2 if run["mixed_precision"] else 4,
    )


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_bytes_per_rank_and_per_collective_equal_theory(n2, strategy):
    run = n2[strategy]
    units = run["unit_numels"]
    assert units == [sum(u) for u in run["unit_param_numels"]]
    assert state(run) == theory.model_state_bytes(units, 2, strategy)
    for rank, measured in enumerate(run["bytes_per_rank"]):
        assert {k: measured[k] for k in STATE} == rank_theory(run, 2, rank)
    assert run["bytes"]["gathered"] == theory.gathered_peak_bytes(units, 2, strategy)
    assert {k: v["bytes"] for k, v in run["collectives"].items()} == theory.collective_bytes(
        units, 2, strategy
    )


def test_full_shard_vs_shard_grad_op(n2):
    fs, sgo = n2["FULL_SHARD"], n2["SHARD_GRAD_OP"]
    P = 4 * fs["num_params"]
    assert state(fs) == state(sgo)  # same sharded state...
    # ...SGO holds all params gathered
    assert sgo["bytes"]["gathered"] > 1.9 * fs["bytes"]["gathered"]
    assert 1.9 < fs["collectives"]["all_gather"]["bytes"] / P < 2.0  # FS gathers twice (minus root)
    assert 0.99 < sgo["collectives"]["all_gather"]["bytes"] / P < 1.01
    units = len(fs["unit_numels"])
    assert fs["collectives"]["all_gather"]["calls"] == 2 * units - 1  # the root is gathered once
    assert sgo["collectives"]["all_gather"]["calls"] == units


def test_every_strategy_trains_the_same_model(n2):
    # FSDP does not shard activations: the same batch saves the same bytes for backward.
    assert len({r["bytes"]["activations"] for r in n2.values()}) == 1
    assert n2["FULL_SHARD"]["bytes"]["activations"] > 0
    losses = {s: [h["loss"] for h in r["history"]] for s, r in n2.items()}
    for s in ("SHARD_GRAD_OP", "NO_SHARD"):
        assert losses[s] == pytest.approx(losses["FULL_SHARD"], abs=1e-4)
    assert n2["FULL_SHARD"]["loss_last"] < n2["FULL_SHARD"]["loss_first"] - 0.25


def test_model_state_falls_as_one_over_n_a_few_padding_bytes_above_16p_over_n(n2, n4):
    unsharded = sum(state(n2["NO_SHARD"]).values())
    P = n2["NO_SHARD"]["num_params"]
    assert unsharded == 16 * P
    for n, run in ((2, n2["FULL_SHARD"]), (4, n4["FULL_SHARD"])):
        total = sum(state(run).values())
        assert total == sum(theory.model_state_bytes(run["unit_numels"], n, "FULL_SHARD").values())
        above = total - 16 * P / n  # the notebook's "above 16P/N" column: padding, in bytes
        assert above == 16 * sum(math.ceil(u / n) - u / n for u in run["unit_numels"])
        assert 0 < above < 16 * len(run["unit_numels"])  # less than one element per unit and rank


def test_shards_are_equal_and_padded_only_where_the_count_needs_it(n2, n4):
    for n, run in ((2, n2["FULL_SHARD"]), (4, n4["FULL_SHARD"])):
        layout = run["shard_layout"]  # rank -> unit -> {stored, padding}, as FSDP recorded it
        assert len(layout) == n
        for unit, numel in enumerate(run["unit_numels"]):
            stored = {layout[rank][unit]["stored"] for rank in range(n)}
            assert stored == {sharding.shard_numel(numel, n)}  # equal shards on every rank
            assert [layout[rank][unit]["padding"] for rank in range(n)] == [
                r["padding"] for r in sharding.shard_ranges(numel, n)
            ]
            if numel % n == 0:
                assert all(layout[rank][unit]["padding"] == 0 for rank in range(n))
        root = run["unit_numels"][0]
        assert root % n and layout[n - 1][0]["padding"] == n * sharding.shard_numel(root, n) - root


def test_shard_ranges_pad_at_the_end_and_only_when_needed():
    assert [r["padding"] for r in sharding.shard_ranges(10, 4)] == [0, 0, 0, 2]
    assert [r["padding"] for r in sharding.shard_ranges(5, 4)] == [0, 0, 1, 2]  # tail spans ranks
    assert [r["padding"] for r in sharding.shard_ranges(8, 2)] == [0, 0]
    for numel in range(1, 40):
        for shards in range(1, 6):
            ranges = sharding.shard_ranges(numel, shards)
            assert sum(r["stop"] - r["start"] for r in ranges) == numel
            assert {r["stop"] - r["start"] + r["padding"] for r in ranges} == {
                sharding.shard_numel(numel, shards)
            }
    assert "rank 3  [ p9 ·  ·  ]   2 padding" in sharding.shard_diagram(10, 4)


def test_hybrid_shard_shards_within_a_group_and_all_reduces_across(n4):
    run = n4["HYBRID_SHARD"]
    units = run["unit_numels"]
    assert state(run) == theory.model_state_bytes(units, 4, "HYBRID_SHARD", replicas=2)
    assert state(run) == theory.model_state_bytes(units, 2, "FULL_SHARD")  # shards over 2, not 4
    assert {k: v["bytes"] for k, v in run["collectives"].items()} == theory.collective_bytes(
        units, 4, "HYBRID_SHARD", replicas=2
    )
    assert [h["loss"] for h in run["history"]] == pytest.approx(
        [h["loss"] for h in n4["FULL_SHARD"]["history"]], abs=1e-4
    )


def test_hybrid_shard_without_a_mesh_shards_nothing_and_syncs_nothing(variants, n4, n2):
    """Issue 22 item 13: without a mesh FSDP builds the shard group from the devices a node
    counts (1 on CPU): a group of one rank, so it runs NO_SHARD there and all-reduces over that
    group only. The replica group exists but carries nothing: the ranks' gradients and weights
    differ, where the 2 x 2 mesh's replicas stay bitwise equal."""
    run = variants[NO_MESH]
    assert run["groups"]["shard_group"] == 1 and run["groups"]["replica_group"] == 2
    assert run["ran_as"] == run["groups"]["ran_as"] == "NO_SHARD" and run["mesh"] is False
    assert run["groups"]["grad_spread"] > 1e-3 and run["groups"]["weight_spread"] > 1e-3
    assert state(run) == state(n2["NO_SHARD"])  # a full replica on every rank
    # One all-reduce per unit, over a group of one rank: the bytes of NO_SHARD, sent nowhere.
    assert {k: v["bytes"] for k, v in run["collectives"].items()} == theory.collective_bytes(
        run["unit_numels"], 2, "NO_SHARD"
    )
    # Divided by the replica count before a reduction that sums one rank: half a local gradient.
    assert (run["divide_factors"]["pre"], run["divide_factors"]["post"]) == (2, 1)
    local = run["grad_norms"]["torch_nn_utils_per_rank"]
    assert local[0] != pytest.approx(local[1], rel=1e-3)
    meshed = n4["HYBRID_SHARD"]["groups"]
    assert (meshed["shard_group"], meshed["replica_group"], meshed["ran_as"]) == (
        2,
        2,
        "HYBRID_SHARD",
    )
    assert meshed["grad_spread"] == 0 and meshed["weight_spread"] == 0


def test_reduce_scatter_averages_with_torchs_divide_factors(m2, m4):
    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    for d in range(1, 1025):
        pre = DefaultState._get_gradient_predivide_factor(d)
        assert sharding.gradient_divide_factors(d) == (pre, d / pre)
    for m in (m2, m4):
        n = m["world_size"]
        for run in m["results"]["runs"]:
            factors = run["divide_factors"]
            assert (factors["pre"], factors["post"]) == sharding.gradient_divide_factors(n)
            assert factors["pre"] * factors["post"] == n
            norms = run["grad_norms"]  # the mean, not the sum (a sum would be n times larger)
            assert norms["fsdp"] == pytest.approx(norms["single_process"], rel=1e-5)


def test_clip_grad_norm_torch_sees_the_shard_fsdp_the_whole(n2, n4):
    for run in (n2["FULL_SHARD"], n2["SHARD_GRAD_OP"], n4["FULL_SHARD"], n4["HYBRID_SHARD"]):
        norms = run["grad_norms"]
        local = norms["torch_nn_utils_per_rank"]
        assert all(value < norms["fsdp"] * 0.99 for value in local)  # each rank: its shard only
        assert len({round(v, 6) for v in local}) > 1  # a different wrong norm on each rank
        shards = (
            local if run["strategy"] != "HYBRID_SHARD" else local[: len(local) // run["replicas"]]
        )
        assert math.sqrt(sum(v * v for v in shards)) == pytest.approx(norms["fsdp"], rel=1e-5)
    no_shard = n2["NO_SHARD"]["grad_norms"]
    assert no_shard["torch_nn_utils_per_rank"] == pytest.approx([no_shard["fsdp"]] * 2, rel=1e-6)


def test_figures_the_quiz_cites_as_measured_in_lesson_1_still_hold(n2):
    # The lesson 1 bank's q_clip_grad_norm and q_tiny_model_memory cite these figures.
    fs, no_shard = n2["FULL_SHARD"], n2["NO_SHARD"]
    norms = fs["grad_norms"]
    assert [round(v, 2) for v in norms["torch_nn_utils_per_rank"]] == [3.64, 4.06]
    assert round(norms["fsdp"], 2) == 5.45
    total = sum(fs["bytes"][k] for k in ("params", "grads", "optimizer", "gathered", "activations"))
    assert f"{fs['bytes']['activations'] / total:.0%}" == "68%"
    assert mib(sum(state(no_shard).values()) - sum(state(fs).values())) == 6.168
    assert mib(fs["bytes"]["gathered"]) == 1.571
    assert sum(state(fs).values()) - 16 * fs["num_params"] // 2 == 8  # padding, bytes per rank


def test_sync_module_states_is_refused_on_cpu_in_one_line_and_the_launch_goes_on(variants):
    proc, _ = notebook_launch("two_ranks")
    message = (
        "ValueError: The module has CPU parameters or buffers when `sync_module_states=True`, "
        "which requires them to be on GPU. Please specify the `device_id` argument or move "
        "the module to GPU before passing it to FSDP."
    )
    assert variants[SYNC]["refused"] == message and variants[SYNC]["history"] == []
    assert proc.stdout.count(f"torch refused to wrap the model: {message}\n") == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    labels = list(variants)  # the runs after the refusal trained
    assert labels == [SYNC, BF16, ORIG, NO_MESH] and all(variants[k]["history"] for k in labels[1:])


def test_use_orig_params_names_groups_and_alignment_padding(orig, n2):
    run = orig
    flat = n2["FULL_SHARD"]
    assert run["d_model"] == 130  # sizes that are not multiples of 4: padding appears
    # Names and groups: flat parameters, one per unit, all in one group; the model's own otherwise.
    assert flat["parameters"]["count"] == len(flat["unit_numels"])
    assert all(name.endswith("_flat_param") for name in flat["parameters"]["first_names"])
    assert len(flat["parameters"]["groups"]) == 1
    assert run["parameters"]["count"] == sum(len(u) for u in run["unit_param_numels"])
    assert run["parameters"]["first_names"][0].endswith("tok_emb.weight")
    assert [g["weight_decay"] for g in run["parameters"]["groups"]] == [0.01, 0.0]
    # Bytes: every rank to the byte; more than the plain formula (alignment); the optimizer
    # holds real elements only, so it is under 2 x params and differs between ranks.
    plain = theory.model_state_bytes(run["unit_numels"], 2, "FULL_SHARD")
    for rank, measured in enumerate(run["bytes_per_rank"]):
        assert {k: measured[k] for k in STATE} == rank_theory(run, 2, rank)
        assert measured["params"] > plain["params"]
        assert measured["optimizer"] < 2 * measured["params"]
    assert len({r["optimizer"] for r in run["bytes_per_rank"]}) == 2
    # cited by q_use_orig_params (bank notes)
    assert run["bytes"]["params"] - plain["params"] == 112
    flat_numels = sharding.unit_flat_numels(
        run["unit_param_numels"], 2, "FULL_SHARD", use_orig_params=True
    )
    assert {k: v["bytes"] for k, v in run["collectives"].items()} == theory.collective_bytes(
        flat_numels, 2, "FULL_SHARD"
    )
    assert run["bytes"]["gathered"] == theory.gathered_peak_bytes(flat_numels, 2, "FULL_SHARD")


def test_alignment_layout_follows_fsdp_rule():
    spans, length = sharding.flat_param_layout([130, 130, 50700, 390, 16900], align=4)
    assert spans == [(0, 130), (132, 130), (264, 50700), (50964, 390), (51356, 16900)]
    assert length == 51356 + 16900
    assert sharding.flat_param_layout([3, 5], align=0) == ([(0, 3), (3, 5)], 8)
    assert sharding.alignment_numel(4) == 4 and sharding.alignment_numel(2) == 8


def test_mixed_precision_halves_the_wire_not_the_state(mixed, n2):
    bf16, fp32 = mixed, n2["FULL_SHARD"]
    assert state(bf16) == state(fp32)
    for kind in ("all_gather", "reduce_scatter"):
        assert bf16["collectives"][kind]["bytes"] * 2 == fp32["collectives"][kind]["bytes"]


def test_exercise_covers_every_measured_run_including_hybrid_and_orig_params(m2, m4):
    cases = cases_from_metrics(m2, m4)
    assert len(cases) == 3 + 2 + 2  # not cases: the refused sync_module_states run, and the
    # HYBRID_SHARD run without a mesh (FSDP ran it as NO_SHARD)
    assert {c["strategy"] for c in cases} == set(theory.STRATEGIES)
    assert any(c["use_orig_params"] for c in cases) and any(c["mixed_precision"] for c in cases)
    spec = importlib.util.spec_from_file_location("solution", "solutions/lesson1_predict_bytes.py")
    solution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(solution)
    assert check_predict_bytes(solution.predict_model_state_bytes, cases) == (
        True,
        f"all {len(cases)} measured runs predicted to the byte.",
    )

    def lesson_formula(
        units, n, strategy, replicas=1, mixed_precision=False, use_orig_params=False
    ):
        shards = 1 if strategy == "NO_SHARD" else n  # what sections 1-5 print, and no more
        local = sum(math.ceil(sum(u) / shards) for u in units)
        return {"params": 4 * local, "grads": 4 * local, "optimizer": 8 * local}

    passed, message = check_predict_bytes(lesson_formula, cases)
    assert not passed and "HYBRID_SHARD" in message and "ceil" not in message

    def calls_the_library(
        units, n, strategy, replicas=1, mixed_precision=False, use_orig_params=False
    ):
        return sharding.rank_state_bytes(units, n, strategy, replicas, 0, use_orig_params)

    passed, message = check_predict_bytes(calls_the_library, cases)
    assert not passed and "rank_state_bytes" in message


def test_bad_strategy_input_is_one_line_and_exit_2():
    """The real command once, with the refusal that depends on the world size: HYBRID_SHARD on
    2 ranks, which cannot split into 2 groups of 2 or more (the other refusals go through the
    same plan(), in-process below)."""
    proc, _ = launch(1, "--strategy", "HYBRID_SHARD", "--steps", "1", nproc=2)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: HYBRID_SHARD: 2 ranks do not split into --replicas 2 groups of 2 "
        "or more (try NPROC=4)"
    ], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "argv, world_size, said",
    [
        (
            ["--strategy", "ZERO4"],
            2,
            "argument --strategy: 'ZERO4': choose from "
            "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD",
        ),
        (["--strategy", "full_shard,ZERO4"], 4, "argument --strategy: 'ZERO4': choose from"),
        (
            ["--strategy", "HYBRID_SHARD"],
            2,
            "HYBRID_SHARD: 2 ranks do not split into --replicas 2 groups of 2 or more",
        ),
        (
            ["--strategy", "HYBRID_SHARD"],
            3,
            "HYBRID_SHARD: 3 ranks do not split into --replicas 2 groups",
        ),
        (["--variants", "strategy=HYBRID_SHARD"], 2, "HYBRID_SHARD: 2 ranks do not split"),
    ],
)
def test_bad_strategies_are_refused_in_one_line_by_the_scripts_parser(
    capsys, argv, world_size, said
):
    """What train.py's main() does with --strategy before anything runs, in this process: the
    config reads it once (a name that is no strategy: argparse's one line, exit 2), then plan()
    checks each run against the world size torchrun gave (a CourseError, which the script turns
    into its one line and exit 2; the test above shows that through torchrun)."""
    from fsdp_course.config import parse_config
    from fsdp_course.dist import CourseError

    train = lesson_script(1)
    try:
        train.plan(parse_config(train.Config, argv=argv), world_size)
    except SystemExit as exc:
        assert exc.code == 2
        assert said in capsys.readouterr().err.strip().splitlines()[-1]
    except CourseError as exc:
        assert said in str(exc) and "\n" not in str(exc)
    else:
        pytest.fail(f"{argv} on {world_size} ranks accepted")
    assert train.Strategies("hybrid_shard, full_shard") == ("HYBRID_SHARD", "FULL_SHARD")
    assert str(train.Strategies("hybrid_shard, full_shard")) == "HYBRID_SHARD,FULL_SHARD"


def test_no_shard_deprecation_is_said_once(n2):
    proc, _ = notebook_launch("two_ranks")
    assert proc.stdout.count("deprecates NO_SHARD") == 1
    assert "sharding strategy is deprecated" not in proc.stdout


def test_instruments_watch_step_1_and_ms_per_step_times_the_others(m2, m4):
    """Issue 9: the instruments slow the step they watch; ms/step is the median of the steps
    after step 0 that they did not watch, whose memory and traffic columns read None ("-")."""
    proc, _ = notebook_launch("two_ranks")
    for m in (m2, m4):
        for run in m["results"]["runs"] + [
            v for v in m["results"].get("variants", []) if "refused" not in v
        ]:
            history = run["history"]
            watched = [row["step"] for row in history if row["peak_mib"] is not None]
            assert watched == [run["watched_step"]] == [1], run["label"]
            assert history[1]["sent_mib"] > 0 and all(
                row["sent_mib"] is None for row in history if row["step"] != 1
            )
            plain = [row["ms"] for row in history if row["step"] > 1]
            assert run["ms_per_step"] == statistics.median(plain)
    line = next(line for line in proc.stdout.splitlines() if line.strip().startswith("0 |"))
    assert [cell.strip() for cell in line.split("|")[3:]] == ["-", "-"]  # not watched: not measured


def test_variants_parse_once_and_bad_ones_are_one_line():
    """plan(): each --strategy on the command line's config, then each variant's; every value
    typed once, by the flag's own parser (a variant's strategy too), the label made once."""
    train = lesson_script(1)
    from fsdp_course.config import parse_config, parse_variants
    from fsdp_course.dist import CourseError

    cfg = parse_config(
        train.Config,
        argv=[
            "--strategy",
            "NO_SHARD",
            "--variants",
            "mixed-precision=true; strategy=full_shard,d-model=130,steps=2",
        ],
    )
    assert [str(v) for v in cfg.variants] == [
        "(mixed-precision=true)",
        "(strategy=full_shard,d-model=130,steps=2)",
    ]
    base, (first, s1, label1, v1), (second, s2, label2, v2) = train.plan(cfg, 2)
    assert base[1:] == ("NO_SHARD", "NO_SHARD", None) and base[0] is cfg
    assert (s1, first.mixed_precision, first.d_model, label1) == (
        "NO_SHARD",
        True,
        128,
        "NO_SHARD + bf16 mixed precision",
    )
    assert (s2, second.d_model, second.steps, second.mixed_precision) == (
        "FULL_SHARD",
        130,
        2,
        False,
    )
    assert second.strategy == ("FULL_SHARD",) and (v1, v2) == tuple(str(v) for v in cfg.variants)
    for text, needle in (
        ("warp=1", "no flag --warp"),
        ("d-model=wide", "not a number"),
        ("mixed-precision=yes", "true or false"),
        ("strategy=ZERO4", "strategy=ZERO4: 'ZERO4'"),
    ):
        with pytest.raises(CourseError, match=needle):
            train.plan(parse_config(train.Config, argv=["--variants", text]), 2)
    with pytest.raises(Exception, match="write flag=value"):
        parse_variants("mixed-precision")
