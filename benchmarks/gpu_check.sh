#!/usr/bin/env bash
# The GPU checks in one call: the tests that need CUDA (the recorded CUDA-graph step among
# them), then benchmarks/throughput.py (bbb, replayed from its CUDA graph, against a
# plain-torch step at batch 1024, eager and compiled, and 100 replicas against one fit),
# benchmarks/replicas.py (20 bbb fits as replicas against one, end to end),
# benchmarks/hmc_chains.py (the hmc reference's potential for 8, 64 and 512 chains against
# one) and benchmarks/large_net.py (laplace_last_layer, laplace_kron and bbb on a
# ResNet-18, laplace_full refused) on the GPU. The files come back under $OUT (the device
# tool's folder) or benchmarks/results/gpu: tests.log, throughput/*, replicas/*,
# hmc_chains/* and large_net/*.
#
# A lent GPU machine has PyTorch but neither Pyro nor a network. Fetch Pyro's wheels into
# the checkout first, on this side, and carry them:
#
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: -d .whl pyro-ppl==1.9.2 pyro-api==0.1.2
#
# then run `bash benchmarks/gpu_check.sh` there with `.whl` carried. DEVICE=cpu runs the
# same on the CPU (the CUDA tests skip): a dry run of this script, not a GPU figure; add
# LARGE_NET_FLAGS="--width 4 --n 128 --steps 5" to keep the ResNet small there.
set -euo pipefail
cd "$(dirname "$0")/.."
device="${DEVICE:-cuda}"
out="${OUT:-benchmarks/results/gpu}"
mkdir -p "$out"
source benchmarks/gpu_env.sh
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
    python3 -c "import torch, pyro; print('torch', torch.__version__, 'pyro', pyro.__version__,
                'cuda', torch.cuda.is_available())"
    python3 -m pytest -q -p no:cacheprovider -rs tests/core/test_devices.py tests/core/test_graphs.py \
        tests/zoo/test_contract.py tests/harness/test_memory.py
} 2>&1 | tee "$out/tests.log" && tests=0 || tests=$?
# The benchmarks run whatever the tests said; the script's status is the tests'.
python3 benchmarks/throughput.py --device "$device" --processes 1 --replicas 100 --compiled \
    --out "$out/throughput"
python3 benchmarks/replicas.py --device "$device" --repeats 3 --out "$out/replicas"
python3 benchmarks/hmc_chains.py --device "$device" --out "$out/hmc_chains"
python3 benchmarks/large_net.py --device "$device" ${LARGE_NET_FLAGS:-} --out "$out/large_net"
exit "$tests"
