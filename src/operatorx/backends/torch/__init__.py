"""torch backends: `torch/gemm.py` (cuBLASLt / torch._scaled_mm) and `torch/moe/` (a modular MoE).

Listed in the backend table (backends/names.py); nothing registers on import.
"""
