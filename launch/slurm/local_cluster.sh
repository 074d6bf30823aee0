#!/usr/bin/env bash
# A SLURM "cluster" of two nodes on this one machine, to try launch/slurm/lesson.sbatch for
# real (the course's tests do). Debian/Ubuntu packages: slurmctld slurmd slurm-client munge.
# Needs root (slurmd starts the job's processes). Everything lives in STATE_DIR: its own
# munge key and socket, slurm.conf, logs; nothing system-wide is changed.
#
#   eval "$(bash launch/slurm/local_cluster.sh start /tmp/slurm-course)"   # prints: export SLURM_CONF=...
#   sbatch --wait launch/slurm/lesson.sbatch 8 --replicas 2 --metrics runs/slurm/metrics.json
#   bash launch/slurm/local_cluster.sh stop /tmp/slurm-course
#
# Nodes n0 and n1 (2 CPUs each) both listen on 127.0.0.1, each slurmd on its own port.
set -euo pipefail

action="${1:-}"
state="${2:-/tmp/slurm-course}"
die() { echo "local_cluster.sh: $*" >&2; exit 2; }

stop() {
    local name
    for name in slurmd-n1 slurmd-n0 slurmctld munged; do
        if [[ -f "$state/$name.pid" ]]; then
            kill "$(cat "$state/$name.pid")" 2>/dev/null || true
            rm -f "$state/$name.pid"
        fi
    done
}

case "$action" in
    stop) stop; exit 0 ;;
    start) ;;
    *) die "usage: local_cluster.sh start|stop [STATE_DIR]" ;;
esac

for tool in munged slurmctld slurmd sbatch srun scontrol; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found: install Debian's slurmctld slurmd slurm-client munge"
done
[[ "$(id -u)" == "0" ]] || die "needs root (slurmd starts the jobs' processes as their users)"

stop
mkdir -p "$state/munge" "$state/spool" "$state/ctld"
chmod 700 "$state/munge"
chmod 711 "$state"
[[ -f "$state/munge.key" ]] || { head -c 128 /dev/urandom >"$state/munge.key"; chmod 600 "$state/munge.key"; }

# Four free ports on loopback (controller, two slurmds, srun's range start).
read -r ctld_port d0_port d1_port < <(python3 - <<'PY'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
PY
)
host=$(hostname)
cat >"$state/slurm.conf" <<CONF
ClusterName=course
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/sock
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
# sbatch --wait polls every 2 s, not at 2, 10, 42 s: it waits up to MinJobAge/2 between polls so
# as to see a finished job before slurmctld forgets it, and the default MinJobAge is 300 s.
MinJobAge=5
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool/%n
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd-%n.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd-%n.log
NodeName=n0 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d0_port CPUs=2 State=UNKNOWN
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$d1_port CPUs=2 State=UNKNOWN
PartitionName=course Nodes=n0,n1 Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$state/slurm.conf"

munged -f -S "$state/munge/sock" --key-file="$state/munge.key" --log-file="$state/munged.log" \
    --pid-file="$state/munged.pid" --seed-file="$state/munge.seed" || die "munged did not start ($state/munged.log)"
slurmctld -f "$SLURM_CONF" -i || die "slurmctld did not start ($state/slurmctld.log)"
for node in n0 n1; do
    slurmd -f "$SLURM_CONF" -N "$node" || die "slurmd $node did not start ($state/slurmd-$node.log)"
done
for _ in $(seq 1 60); do  # up to 30 s for both nodes to register as idle
    if [[ "$(sinfo -h -o '%t %D' 2>/dev/null)" == "idle 2" ]]; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.5
done
die "the nodes did not come up: $(sinfo 2>&1 | tail -n +2); logs in $state"
