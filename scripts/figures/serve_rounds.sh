#!/bin/bash
# Rounds of `ds4d bench serve` over several trees, the order rotated each round (ABC, BCA,
# CAB, ...), so that every tree runs in every position and each round's runs share the
# machine's load; the 1-minute load average and the UTC time are logged before each run.
#
#   scripts/figures/serve_rounds.sh ROUNDS CSV LOG NAME=DS4D[:LIB] NAME=DS4D[:LIB] ...
#
# DS4D is a tree's ds4d (its own venv); LIB, when given, is the native library it loads
# (DS4D_NATIVE_LIB), so two builds of native/ can share one venv. Each run is
#   DS4D bench serve --start --label NAME-ROUND --clients $CLIENTS --csv CSV -- --slots 4
# as in docs/serving-loop.md (CLIENTS from the environment, default 1,2,4).
#
# With CLIENT=PATH/ds4d in the environment every run is that ds4d's bench client instead, the
# tree's daemon started by `--serve-python` with the python beside the tree's DS4D (its venv):
# one client for every tree, and each request's gaps kept in LOG.requests.jsonl
# (`--requests-log`).
set -u
rounds=$1 csv=$2 log=$3 clients=${CLIENTS:-1,2,4} client=${CLIENT:-}
shift 3
trees=("$@")
n=${#trees[@]}
for ((r = 1; r <= rounds; r++)); do
    for ((k = 0; k < n; k++)); do
        spec=${trees[$(((r - 1 + k) % n))]}
        name=${spec%%=*} rest=${spec#*=}
        ds4d=${rest%%:*} lib=""
        [[ $rest == *:* ]] && lib=${rest#*:}
        echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) start $name-$r" >>"$log"
        if [[ -n $client ]]; then
            env ${lib:+DS4D_NATIVE_LIB=$lib} "$client" bench serve --start --serve-python "$(dirname "$ds4d")/python" \
                --label "$name-$r" --clients "$clients" --csv "$csv" --requests-log "$log.requests.jsonl" \
                -- --slots 4 >"$log.$name-$r.out" 2>&1
        elif [[ -n $lib ]]; then
            DS4D_NATIVE_LIB=$lib "$ds4d" bench serve --start --label "$name-$r" --clients "$clients" \
                --csv "$csv" -- --slots 4 >"$log.$name-$r.out" 2>&1
        else
            "$ds4d" bench serve --start --label "$name-$r" --clients "$clients" \
                --csv "$csv" -- --slots 4 >"$log.$name-$r.out" 2>&1
        fi
        echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg) end $name-$r rc $?" >>"$log"
    done
done
