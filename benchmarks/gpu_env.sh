# Sourced by the GPU scripts (gpu_check.sh, gpu_reference.sh): Pyro from the carried wheels
# in .whl (a lent GPU machine has PyTorch but neither Pyro nor a network), then this
# checkout, where neither is importable yet.
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! python3 -c "import bnn_zoo.guides" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
fi
