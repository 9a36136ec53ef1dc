#!/usr/bin/env bash
# A Slurm cluster and a PostgreSQL server on this machine, to rehearse a cluster job or a sweep of many
# workers before spending a real cluster's queue on it (`make cluster`, `make cluster-stop`).
#   kit/scripts/cluster.sh start    installs slurm-wlm and munge when missing (Debian, as root), starts munged,
#                                   slurmctld, one slurmd per node and postgres; prints sinfo and the --storage URL
#   kit/scripts/cluster.sh postgres starts postgres alone (a sweep's --storage needs no Slurm)
#   kit/scripts/cluster.sh stop     stops them, by the PIDs they wrote
#   kit/scripts/cluster.sh install  only installs what is missing (CI does it while the other tests run)
# Everything lives in .cluster/ of the checkout (ignored by git): configs, state, logs, the munge key
# and the database `sweeps` (UTF-8, whatever the locale). Starting again leaves running daemons alone.
# Only loopback addresses are used.
# NODES (default 1) slurmd daemons play as many nodes, each on a port of its own: one is named localhost,
# more are node1, node2, ... (which need MASTER_ADDR=127.0.0.1 in a job's environment: Lightning takes
# the first node's name as the address of rank 0, and these names resolve nowhere).
set -euo pipefail
cd "$(dirname "$0")/../.." # the checkout, whatever the folder it is started from
root=$(pwd)/.cluster
nodes=${NODES:-1}
cpus=${CLUSTER_CPUS:-8}
ctld_port=${SLURMCTLD_PORT:-16817}
node_port=${SLURMD_PORT:-16818}
pg_port=${PG_PORT:-15432}
pg_bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
# The cluster's and the database's names: the kit's, the same in every project.
cluster_name=local
database=sweeps
export SLURM_CONF=$root/slurm/slurm.conf

fail() {
  echo "error: make cluster: $*" >&2
  exit 1
}

node_names() { if [[ $nodes -eq 1 ]]; then echo localhost; else seq -f "node%g" -s " " "$nodes"; fi; }

alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The last lines of a daemon's log, for the message that says it did not start.
log_tail() { [[ -f $1 ]] && tail -n 5 "$1" | sed 's/^/  /'; }

wait_for() {
  local what=$1 log=$2
  shift 2
  for _ in $(seq 100); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  fail "$what did not start; its log, $log, ends with:
$(log_tail "$log")"
}

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  [[ -x $pg_bin/postgres ]] || missing+=(postgresql-15)
  [[ ${#missing[@]} -eq 0 ]] && return
  [[ $(id -u) -eq 0 ]] || fail "${missing[*]} missing; install them (sudo apt-get install ${missing[*]}) or run as root"
  command -v apt-get >/dev/null || fail "${missing[*]} missing and no apt-get here; install them with your package manager"
  echo "Installing ${missing[*]} (apt-get) ..."
  apt-get update -q >"$root/apt.log" 2>&1 || fail "apt-get update failed; see $root/apt.log"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
    >>"$root/apt.log" 2>&1 || fail "apt-get install ${missing[*]} failed; see $root/apt.log:
$(log_tail "$root/apt.log")"
}

start_munge() {
  local dir=$root/munge
  mkdir -p "$dir"
  chmod 700 "$dir"
  alive "$dir/munged.pid" && return
  [[ -f $dir/munge.key ]] || mungekey --create --keyfile="$dir/munge.key" >/dev/null
  munged --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" --force 2>>"$dir/munged.log" ||
    fail "munged did not start; its log, $dir/munged.log, ends with:
$(log_tail "$dir/munged.log")"
  wait_for munged "$dir/munged.log" test -S "$dir/munge.socket"
}

write_slurm_conf() {
  local dir=$root/slurm names
  mkdir -p "$dir/state" "$dir/spool"
  names=localhost
  [[ $nodes -gt 1 ]] && names="node[1-$nodes]"
  {
    cat <<EOF
# Written by kit/scripts/cluster.sh: a cluster of $nodes node(s) on this machine, for rehearsals.
ClusterName=$cluster_name
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
AuthInfo=socket=$root/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
# No cgroups in a container: processes tracked by their parents, tasks not bound to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# No accounting daemon: \`scontrol show job\` answers while a finished job is kept (MinJobAge).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A laptop's cores may be fewer than the nodes declare: jobs share them.
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MpiDefault=none
EOF
    local i=0
    for name in $(node_names); do
      echo "NodeName=$name NodeAddr=127.0.0.1 NodeHostname=localhost Port=$((node_port + i)) CPUs=$cpus State=UNKNOWN"
      i=$((i + 1))
    done
    echo "PartitionName=local Nodes=$names Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } >"$dir/slurm.conf"
}

# The nodes of the cluster whose config is on disk (none before the first start).
conf_nodes() { grep -c '^NodeName=' "$root/slurm/slurm.conf" 2>/dev/null || true; }

start_slurm() {
  local dir=$root/slurm
  if alive "$dir/slurmctld.pid"; then
    [[ $(conf_nodes) -eq $nodes ]] || fail "a cluster of $(conf_nodes) node(s) is running, not $nodes; \
stop it first: make cluster-stop, then NODES=$nodes make cluster"
  else
    # The saved state of a cluster of another size names nodes this one lacks, and slurmctld refuses
    # that of another name (an earlier kit's cluster): neither is kept.
    [[ -f $dir/slurm.conf && $(conf_nodes) -ne $nodes ]] && rm -rf "$dir/state" "$dir/spool"
    [[ -f $dir/state/clustername && $(cat "$dir/state/clustername") != "$cluster_name" ]] &&
      rm -rf "$dir/state" "$dir/spool"
    write_slurm_conf
    slurmctld -i 2>>"$dir/slurmctld.log" ||
      fail "slurmctld did not start; its log, $dir/slurmctld.log, ends with:
$(log_tail "$dir/slurmctld.log")"
    wait_for slurmctld "$dir/slurmctld.log" scontrol ping
  fi
  for name in $(node_names); do
    alive "$dir/slurmd-$name.pid" && continue
    mkdir -p "$dir/spool/$name"
    slurmd -N "$name" 2>>"$dir/slurmd-$name.log" ||
      fail "slurmd ($name) did not start; its log, $dir/slurmd-$name.log, ends with:
$(log_tail "$dir/slurmd-$name.log")"
  done
  wait_for "slurmd (the nodes never became idle)" "$dir/slurmd-$(node_names | cut -d' ' -f1).log" \
    bash -c "[[ \$(sinfo -h -o %t | sort -u) == idle ]]"
}

start_postgres() {
  local dir=$root/postgres
  # The server refuses to run as root: it runs as the postgres user, which owns its folder.
  id postgres >/dev/null 2>&1 || fail "no 'postgres' user (the postgresql-15 package creates it)"
  [[ -L $dir && ! -e $dir ]] && rm "$dir" # its folder outside the checkout is gone (a reboot)
  mkdir -p "$dir"
  chown postgres: "$dir/"
  # A checkout below a folder only root may enter (mktemp -d makes such ones) is out of the postgres
  # user's reach: its database then lives in a folder of its own under /tmp, linked from here.
  if ! runuser -u postgres -- test -w "$(readlink -f "$dir")/"; then
    [[ -L $dir || -f $dir/data/PG_VERSION ]] && fail "the postgres user cannot write $dir"
    rm -rf "$dir"
    ln -s "$(mktemp -d /tmp/cluster-postgres.XXXXXX)" "$dir"
    chown postgres: "$dir/"
  fi
  dir=$(readlink -f "$dir") # the server itself goes by a path it can reach
  if [[ ! -f $dir/data/PG_VERSION ]]; then
    # UTF-8 whatever the caller's locale: without LANG, initdb makes SQL_ASCII databases, whose
    # bytes SQLAlchemy's driver hands back undecoded (a sweep then fails deep inside SQLAlchemy).
    runuser -u postgres -- "$pg_bin/initdb" -D "$dir/data" --auth=trust --username=postgres \
      --encoding=UTF8 --locale=C >"$dir/initdb.log" 2>&1 || fail "initdb failed; see $dir/initdb.log:
$(log_tail "$dir/initdb.log")"
  fi
  if ! runuser -u postgres -- "$pg_bin/pg_ctl" status -D "$dir/data" >/dev/null 2>&1; then
    runuser -u postgres -- "$pg_bin/pg_ctl" start -D "$dir/data" -l "$dir/postgres.log" -w -t 30 \
      -o "-c listen_addresses=127.0.0.1 -c port=$pg_port -c unix_socket_directories=$dir" >/dev/null ||
      fail "postgres did not start; its log, $dir/postgres.log, ends with:
$(log_tail "$dir/postgres.log")"
  fi
  if ! runuser -u postgres -- "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -tAc \
    "SELECT 1 FROM pg_database WHERE datname = '$database'" postgres | grep -q 1; then
    runuser -u postgres -- "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -E UTF8 --locale=C -T template0 "$database"
  fi
  local encoding
  encoding=$(runuser -u postgres -- "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -tAc \
    "SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = '$database'" postgres)
  [[ $encoding == UTF8 ]] || fail "the database '$database' in $dir is $encoding, not UTF8 (made by an earlier \
make cluster without LANG): make cluster-stop, then rm -rf $dir and make cluster again (its studies go)"
}

# SIGTERM, or the signal given third (postgres: SIGINT, its fast shutdown; SIGTERM waits for clients).
stop_pid() {
  local name=$1 file=$2 signal=${3:-TERM}
  alive "$file" || return 0
  local pid
  pid=$(cat "$file")
  kill "-$signal" "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || {
      echo "stopped $name (PID $pid)"
      return 0
    }
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  echo "killed $name (PID $pid): it did not stop in 10 s"
}

case ${1:-} in
install)
  mkdir -p "$root"
  install_packages
  ;;
start)
  mkdir -p "$root"
  install_packages
  start_munge
  start_slurm
  start_postgres
  sinfo
  echo
  echo "Slurm's commands find this cluster through: export SLURM_CONF=$SLURM_CONF"
  echo "Sweep storage: --storage postgresql://postgres@127.0.0.1:$pg_port/$database"
  ;;
postgres)
  # The database server alone: what a sweep's --storage needs, without Slurm.
  mkdir -p "$root"
  install_packages
  start_postgres
  echo "Sweep storage: --storage postgresql://postgres@127.0.0.1:$pg_port/$database"
  ;;
stop)
  for f in "$root"/slurm/slurmd-*.pid; do
    [[ -e $f ]] && stop_pid "slurmd $(basename "$f" .pid | cut -d- -f2)" "$f"
  done
  stop_pid slurmctld "$root/slurm/slurmctld.pid"
  if [[ -s $root/postgres/data/postmaster.pid ]]; then
    head -n 1 "$root/postgres/data/postmaster.pid" >"$root/postgres/postgres.pid"
    stop_pid postgres "$root/postgres/postgres.pid" INT
  fi
  stop_pid munged "$root/munge/munged.pid"
  ;;
*)
  echo "usage: kit/scripts/cluster.sh start|postgres|stop|install" >&2
  exit 2
  ;;
esac
