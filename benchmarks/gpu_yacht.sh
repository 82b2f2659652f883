#!/usr/bin/env bash
# Yacht's complete UCI protocol on a GPU, timed: every entry on its 20 splits (each entry's
# splits as replicas of one pass where it can), measured against the `hmc` reference, with
# the wall time of the whole protocol in wall_seconds.txt. Writes the comparison, the
# reference's gates, the distances and the fidelity ranking under $OUT/yacht (the device
# tool's folder) or benchmarks/results/gpu/yacht. The floor: at most 5 minutes.
#
# Set up as for gpu_reference.sh (Pyro's wheels in .whl, the UCI data in .uci, both carried),
# then run `BNN_ZOO_DATA=.uci bash benchmarks/gpu_yacht.sh` there.
# DEVICE=cpu SPLITS=1 ENTRIES="map bbb" is a dry run on the CPU (minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
device="${DEVICE:-cuda}"
out="${OUT:-benchmarks/results/gpu}/yacht"
mkdir -p "$out"
source benchmarks/gpu_env.sh
started=$(date +%s)
# shellcheck disable=SC2086  # ENTRIES is a list of names
python3 benchmarks/uci.py --data yacht --entries ${ENTRIES:-all} --reference hmc \
    --splits "${SPLITS:-20}" --device "$device" --out "$out"
echo "$(( $(date +%s) - started ))" > "$out/wall_seconds.txt"
