# launch/_common.sh: helpers sourced by the launchers (lessonN.sh, lab.sh, test.sh, bench.sh).
# Not meant to be run on its own. Everything the launchers share lives here once.

# The repository root, wherever the launcher is called from.
COURSE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The Python that runs the course: $PYTHON, else the active virtual environment's, else the
# repository's .venv, else python3 from PATH.
course_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        printf '%s\n' "$PYTHON"
    elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]]; then
        printf '%s\n' "$VIRTUAL_ENV/bin/python"
    elif [[ -x "$COURSE_ROOT/.venv/bin/python" ]]; then
        printf '%s\n' "$COURSE_ROOT/.venv/bin/python"
    else
        printf '%s\n' python3
    fi
}

# Set PY for the tools (test.sh, bench.sh, lab.sh): $PYTHON as given, setup skipped (conda users);
# else the venv at ${VENV:-.venv}, set up first (quiet, and quick when nothing changed).
# COURSE_SKIP_SETUP=1 skips the set-up (lab.sh's dry run).
course_setup_python() {
    if [[ -n "${PYTHON:-}" ]]; then
        PY="$PYTHON"
    else
        VENV="${VENV:-$COURSE_ROOT/.venv}"
        export VENV
        [[ "${COURSE_SKIP_SETUP:-0}" == "1" ]] || bash "$COURSE_ROOT/launch/setup.sh" --quiet
        PY="$VENV/bin/python"
    fi
}

# Make `import fsdp_course` / `import quizzes` work even without `pip install -e .`.
course_export_pythonpath() {
    case ":${PYTHONPATH:-}:" in
        *":$COURSE_ROOT:"*) ;;
        *) export PYTHONPATH="$COURSE_ROOT${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
}

# Print a command on one line, prefixed with "+ ", to stderr (as `set -x` would), so learners
# see the real command. Paths under the current directory are shortened to relative ones.
# (The launchers' lines come before torchrun starts any rank, and bash's echo and printf write
# each of them, newline included, in one write: no rank's line can land inside one.)
course_show_cmd() {
    local out="+" arg
    for arg in "$@"; do
        [[ "$arg" == "$PWD/"* ]] && arg="${arg#"$PWD/"}"
        out+=" $(printf '%q' "$arg")"
    done
    printf '%s\n' "$out" >&2
}

course_is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
course_is_posint() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

# Number of GPUs this launcher should use: CUDA_VISIBLE_DEVICES if it is set, else
# `nvidia-smi -L`; 0 when there is none.
course_gpu_count() {
    local n=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    fi
    if [[ $n -gt 0 && -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
        local visible="${CUDA_VISIBLE_DEVICES//[[:space:]]/}"
        if [[ -z "$visible" || "$visible" == "-1" ]]; then
            n=0
        else
            local -a ids
            IFS=',' read -r -a ids <<<"$visible"
            [[ ${#ids[@]} -lt $n ]] && n=${#ids[@]}
        fi
    fi
    printf '%s\n' "$n"
}

course_launcher_help() {
    local name="$1"
    cat <<EOF
$name [script flags]   runs the lesson script under torchrun (flags pass through to it)
$name --help           the lesson script's own flags
$name --launcher-help  this text (also: LAUNCH_HELP=1 $name)

Environment variables:
  NPROC         processes on this node (default: number of GPUs, else 2 CPU ranks with gloo)
  NNODES        number of nodes (default 1); more than 1 needs MASTER_ADDR
  NODE_RANK     0 .. NNODES-1 (default 0), passed as --node-rank; torchrun uses it only with
                static rendezvous: with c10d (what these launchers use) it warns, ignores it and
                numbers the nodes itself (agents sorted by host name, then process id)
  MASTER_ADDR   address of node 0 (setting it switches to c10d rendezvous, even for one node)
  MASTER_PORT   rendezvous port on MASTER_ADDR (default 29500)
  RDZV_ID       rendezvous id shared by all nodes of one job (default fsdp-course)
  MAX_RESTARTS  restart the workers up to N times after a failure (torchrun --max-restarts)
  PYTHON        interpreter (default: \$VIRTUAL_ENV/bin/python, else .venv/bin/python, else python3)
  COURSE_TIMEOUT_S  collective timeout inside the scripts (default 120): a hang fails instead
  COURSE_DEVICE     cpu: use CPU ranks with gloo even where there are GPUs

Example, two nodes with 2 processes each (run on both; which one becomes node 0 is torchrun's choice):
  NNODES=2 NODE_RANK=0 NPROC=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 bash launch/$name
EOF
}

# run_lesson N [script flags...]: run lessons/NN_*/train.py under torchrun, replacing this shell.
run_lesson() {
    local n="$1"
    shift
    local name="lesson$n.sh"
    local script
    script=$(compgen -G "$COURSE_ROOT/lessons/$(printf '%02d' "$((10#$n))")_*/train.py" | head -n 1 || true)

    if [[ "${1:-}" == "--launcher-help" || "${LAUNCH_HELP:-0}" == "1" ]]; then
        course_launcher_help "$name"
        exit 0
    fi
    # Validate the environment first: one line and exit 2 beats a torchrun stack trace.
    local nproc="${NPROC-}" nnodes="${NNODES:-1}" node_rank="${NODE_RANK:-0}"
    local master_port="${MASTER_PORT:-29500}" max_restarts="${MAX_RESTARTS-}"
    if [[ -z "${NPROC+set}" ]]; then
        nproc=$(course_gpu_count)
        [[ "$nproc" -gt 0 ]] || nproc=2
    fi
    if ! course_is_posint "$nproc"; then
        echo "$name: NPROC must be a positive integer, got '$nproc'" >&2; exit 2
    fi
    if ! course_is_posint "$nnodes"; then
        echo "$name: NNODES must be a positive integer, got '$nnodes'" >&2; exit 2
    fi
    if ! course_is_uint "$node_rank" || (( 10#$node_rank >= 10#$nnodes )); then
        echo "$name: NODE_RANK must be an integer from 0 to NNODES-1 ($((10#$nnodes - 1))), got '$node_rank'" >&2; exit 2
    fi
    if ! course_is_posint "$master_port" || (( 10#$master_port > 65535 )); then
        echo "$name: MASTER_PORT must be a port number (1-65535), got '$master_port'" >&2; exit 2
    fi
    if [[ -n "$max_restarts" ]] && ! course_is_uint "$max_restarts"; then
        echo "$name: MAX_RESTARTS must be a non-negative integer, got '$max_restarts'" >&2; exit 2
    fi
    if (( 10#$nnodes > 1 )) && [[ -z "${MASTER_ADDR:-}" ]]; then
        echo "$name: NNODES=$nnodes needs MASTER_ADDR (the address of node 0, reachable from every node)" >&2; exit 2
    fi

    if [[ -z "$script" ]]; then
        echo "$name: no lessons/$(printf '%02d' "$((10#$n))")_*/train.py in $COURSE_ROOT (lesson $n is not built yet)" >&2
        exit 2
    fi

    local py
    py=$(course_python)
    if ! command -v "$py" >/dev/null 2>&1; then
        echo "$name: Python '$py' not found; run: bash launch/setup.sh" >&2; exit 2
    fi
    if ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null; then
        echo "$name: torch is not installed for $py; run: bash launch/setup.sh" >&2; exit 2
    fi
    course_export_pythonpath

    # torchrun itself is `python -m torch.distributed.run`. The course's thin wrapper around it
    # (fsdp_course/torchrun.py) takes the same flags, passes a failed rank's exit code on and
    # reports it in one line instead of the agent's traceback; replace `-m fsdp_course.torchrun`
    # with `-m torch.distributed.run` (or `torchrun`) to run the same thing without it.
    local runner=torch.distributed.run
    [[ -f "$COURSE_ROOT/fsdp_course/torchrun.py" ]] && runner=fsdp_course.torchrun
    local -a cmd=("$py" -m "$runner")
    if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then
        # One process is enough to print the script's help (and prints it once).
        cmd+=(--standalone --nproc-per-node=1)
    elif (( 10#$nnodes > 1 )) || [[ -n "${MASTER_ADDR:-}" ]]; then
        cmd+=(--nnodes="$nnodes" --node-rank="$node_rank" --nproc-per-node="$nproc"
              --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$master_port"
              --rdzv-id="${RDZV_ID:-fsdp-course}")
    else
        cmd+=(--standalone --nproc-per-node="$nproc")
    fi
    if [[ -n "$max_restarts" ]]; then
        cmd+=(--max-restarts="$max_restarts")
        # Restarts with torchrun's shared TCP store are unreliable (stale worker addresses,
        # "Gloo connectFullMesh failed"): give each attempt its own store.
        export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
    fi
    cmd+=("$script" "$@")

    course_show_cmd "${cmd[@]}"
    exec "${cmd[@]}"
}
