#!/usr/bin/env bash
# launch/lab.sh: set up (quietly, when nothing changed) and open the course in JupyterLab.
#
#   bash launch/lab.sh [extra jupyter lab arguments]
#
# Listens on 127.0.0.1 only, always with a token (printed below in the URL to open).
# Environment:
#   LAB_IP            address to listen on (default 127.0.0.1; anything else warns: others can reach it)
#   LAB_PORT          first port to try (default 8888; the next free one is used, as Jupyter does)
#   LAB_TOKEN         the token; unset: a random one; set but empty: refused (a server without a
#                     token lets anyone who reaches the port run code as you)
#   LAB_OPEN_BROWSER  1: open a browser too (default: just print the URL)
#   LAB_DRY_RUN       1: print the jupyter command and exit
#   LAB_ROOT_DIR      folder to serve (default: the course folder; tests serve a temporary copy)
#   PYTHON            use this interpreter and skip launch/setup.sh (e.g. inside a conda env)
#   VENV              the venv launch/setup.sh makes and this script uses (default .venv)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

if [[ -n "${LAB_TOKEN+set}" ]]; then
    TOKEN="$LAB_TOKEN"
    if [[ -z "$TOKEN" ]]; then
        echo "lab.sh: LAB_TOKEN is set but empty; refusing to start JupyterLab without a token (unset LAB_TOKEN for a random one)" >&2
        exit 2
    fi
else
    TOKEN=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
fi

IP="${LAB_IP:-127.0.0.1}"
case "$IP" in
    127.*|localhost|::1|\[::1\]) ;;
    *) echo "lab.sh: WARNING: listening on $IP, not loopback: anyone who can reach this machine and has the token can run code as $(id -un)" >&2 ;;
esac
PORT="${LAB_PORT:-8888}"
if ! course_is_posint "$PORT" || (( 10#$PORT > 65535 )); then
    echo "lab.sh: LAB_PORT must be a port number (1-65535), got '$PORT'" >&2
    exit 2
fi

DRY_RUN="${LAB_DRY_RUN:-0}"
COURSE_SKIP_SETUP="$DRY_RUN" course_setup_python
course_export_pythonpath

# The first free port from LAB_PORT on (Jupyter's own port_retries still applies if it races).
if [[ "$DRY_RUN" != "1" ]]; then
    PORT=$("$PY" - "$IP" "$PORT" <<'PY'
import socket, sys
host, first = sys.argv[1].strip("[]"), int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
for port in range(first, min(first + 51, 65536)):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            continue
        print(port)
        break
else:
    print(first)
PY
)
fi

ROOT_DIR="${LAB_ROOT_DIR:-$COURSE_ROOT}"
if [[ -f "$ROOT_DIR/lessons/home.ipynb" ]]; then
    HOME_PAGE="lessons/home.ipynb"
else
    HOME_PAGE="README.md"
fi

cmd=("$PY" -m jupyterlab
     --ServerApp.root_dir="$ROOT_DIR"
     --ip="$IP" --port="$PORT"
     --IdentityProvider.token="$TOKEN"
     --LabApp.default_url="/lab/tree/$HOME_PAGE")
[[ "$(id -u)" == "0" ]] && cmd+=(--allow-root)
[[ "${LAB_OPEN_BROWSER:-0}" == "1" ]] || cmd+=(--no-browser)
cmd+=("$@")

if [[ "$DRY_RUN" == "1" ]]; then
    printf '%q ' "${cmd[@]}"
    echo
    exit 0
fi

case "$IP" in
    *:*) HOST="[${IP#[}"; HOST="${HOST%]}]" ;;
    0.0.0.0) HOST="$(hostname)" ;;
    *) HOST="$IP" ;;
esac
cat >&2 <<EOF

  fsdp-course in JupyterLab. Open this URL (it carries the token):

      http://$HOST:$PORT/lab/tree/$HOME_PAGE?token=$TOKEN

  Stop with Ctrl-C.

EOF
exec "${cmd[@]}"
