"""PyTorch workloads built from the same spec the service accepts (torch is imported here).

The trace tier runs them on fake tensors; the probe agent runs them for real on the GPU. Both
see the same allocations, so an estimate-vs-measured difference isolates what only hardware adds.
Weights are synthetic, of the real shapes: nothing is downloaded.
"""
