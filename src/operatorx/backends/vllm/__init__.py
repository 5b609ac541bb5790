"""vllm backends: vLLM's own layers (ReplicatedLinear, FusedMoE) under the quant config a
checkpoint of the case's scheme loads with. Listed in the backend table (backends/names.py); vLLM
itself is imported only when a case is prepared, so without vLLM every case is `unsupported` with
the reason.
"""
