#!/usr/bin/env bash
# The references a CPU cannot afford, on a GPU: `hmc` on SPLITS splits (default 20) of each
# UCI set in DATA (default: bostonHousing yacht), all splits of a set in one pass as the
# entry runs them, with `map` measured against them. SPLIT_IDS names the splits in place of
# SPLITS, SAMPLES the draws a chain in place of the entry's (benchmarks/reference_sampler.py):
# concrete's smallest-noise splits need about 16,000, e.g.
# `DATA=concrete SPLIT_IDS="8 11 13" SAMPLES=16000`.
# Writes the comparison, the reference's diagnostics and gates, the distances and the
# fidelity ranking under $OUT/reference (the device tool's folder) or
# benchmarks/results/gpu/reference.
#
# Set up as for gpu_check.sh (Pyro's wheels carried in .whl), and carry the UCI data inside
# the checkout in an ignored folder (never commit it), e.g.
#
#   echo /.uci/ >> .git/info/exclude && cp -r ../shared/data/uci .uci
#
# then run `BNN_ZOO_DATA=.uci bash benchmarks/gpu_reference.sh` there with `.whl` and
# `.uci` carried. DEVICE=cpu SPLITS=1 DATA=yacht is a dry run on the CPU (minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
device="${DEVICE:-cuda}"
out="${OUT:-benchmarks/results/gpu}/reference"
source benchmarks/gpu_env.sh
sets=()
for name in ${DATA:-bostonHousing yacht}; do sets+=("uci/$name"); done
splits=(--splits "${SPLITS:-20}")
if [ -n "${SPLIT_IDS:-}" ]; then splits=(--split-ids $SPLIT_IDS); fi
samples=()
if [ -n "${SAMPLES:-}" ]; then samples=(--samples "$SAMPLES"); fi
python3 benchmarks/reference_sampler.py --data "${sets[@]}" --entries map --reference hmc \
    "${splits[@]}" ${samples[@]+"${samples[@]}"} --device "$device" --out "$out"
