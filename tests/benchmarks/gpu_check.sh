#!/usr/bin/env bash
# One prepared command for a lent GPU machine (run from the checkout's root, with `.gpu` carried when the
# machine lacks cattrs: see ../shared/gpu/README.md for the wheels). It prints the Llama-shaped stack's
# calibration cost against its float forward on the CPU and on CUDA (fp32 and bf16 at width 4096, the
# synchronizing calls of one observed batch, report()'s seconds) and the 7B-width report file's size.
# Copy the numbers into docs/performance.md. About 5 minutes on an H100.
set -euo pipefail
site=$(mktemp -d)
if compgen -G ".gpu/whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --target "$site" .gpu/whl/*.whl
fi
export PYTHONPATH="$site:$PWD"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
timeout 420 python3 tests/benchmarks/bench_calibration.py --stack
timeout 240 python3 tests/benchmarks/bench_files.py --width 4096 --device cuda
