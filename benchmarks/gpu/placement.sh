#!/bin/bash
# Start-to-start noise against CPU placement (round 14): one configuration started again and again,
# alternating free starts (wherever the OS puts server and client) and pinned ones (server on the
# GPU's local cores, client on cores of its own: benchmarks/gpu/cpus.py), on one machine.
#
#     . .gpu/setup-device.sh && bash benchmarks/gpu/placement.sh SECONDS ARMS WORKLOAD CONFIG_JSON
#
# ARMS: a string of F (free), P (pinned) and N (free, vLLM's compile cache off:
# VLLM_DISABLE_COMPILE_CACHE=1, so the start compiles its own graphs), in order ("FPFP"); a start begins only when the
# longest start so far, and at least FIRST_START_S (default 170 s), fits in SECONDS. WINDOWS=N in
# the environment measures N steady windows per start (measure_points.py --windows): the time a
# start lives against the start itself. Rows go to points.jsonl under
# the labels placement-free / placement-pinned (out of every grid); a sampler writes every 2 s
# the GPU's clocks, power and temperature and the busiest threads with the CPU each last ran on
# (host-samples.log), and topology.txt says which CPU is on which node and core.
set -u
SECONDS_MAX=$1 ARMS=$2 W=$3 CONFIG=$4
R=/tmp/h200
export PYTHONPATH=$PWD:${PYTHONPATH:-}:/tmp/atsite
mkdir -p $R/results
T0=$(date +%s)
{
  echo "allowed: $(grep Cpus_allowed_list /proc/self/status)"
  lscpu 2>/dev/null | grep -iE 'model name|socket|core|thread|numa|mhz'
  command -v numactl >/dev/null && numactl -H
  nvidia-smi topo -m 2>/dev/null
  python3 benchmarks/gpu/cpus.py --explain 2>&1
} > $R/results/topology.txt 2>&1
cat $R/results/topology.txt
( while sleep 2; do
    echo "@ $(date +%s.%N | cut -c1-14) $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv,noheader 2>/dev/null)"
    ps -eLo pid,tid,psr,pcpu,comm --sort=-pcpu --no-headers 2>/dev/null | head -8
  done >> $R/results/host-samples.log ) &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null' EXIT
longest=${FIRST_START_S:-170}
for arm in $(echo "$ARMS" | grep -o .); do
  left=$(( SECONDS_MAX - ($(date +%s) - T0) ))
  if [ "$left" -lt "$longest" ]; then echo "[placement] $left s left < $longest s: stop"; break; fi
  t=$(date +%s)
  if [ "$arm" = P ]; then
    ( eval "$(python3 benchmarks/gpu/cpus.py)"; echo "[placement] pinned: server $AUTOTUNE__SERVER_CPUS client $AUTOTUNE__CLIENT_CPUS"
      bash benchmarks/gpu/round.sh "points:$W:placement-pinned:[$CONFIG]" )
  elif [ "$arm" = N ]; then
    ( unset AUTOTUNE__SERVER_CPUS AUTOTUNE__CLIENT_CPUS; export VLLM_DISABLE_COMPILE_CACHE=1
      bash benchmarks/gpu/round.sh "points:$W:placement-nocache:[$CONFIG]" )
  else
    ( unset AUTOTUNE__SERVER_CPUS AUTOTUNE__CLIENT_CPUS; bash benchmarks/gpu/round.sh "points:$W:placement-free:[$CONFIG]" )
  fi
  d=$(( $(date +%s) - t )); [ "$d" -gt "$longest" ] && longest=$d
  echo "[placement] arm $arm took $d s"
done
