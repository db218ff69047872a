"""Research data and the scripts that fit the engine calibration from it; not part of the wheel.

- ``data/vllm_runs.json``: published vLLM launch logs, as structured runs (``vllm_accounting.md``
  gives provenance, quotes and caveats per run).
- ``data/overhead_measurements.json``: public measurements of CUDA context and allocator
  overheads (summarised in ``overhead_measurements.md``).
- ``vllm_runs.py``: the runs as budget requests, and predicted-vs-measured comparisons.
- ``calibrate_vllm.py``: fits ``vrambudget/core/data/vllm_calibration.json`` (which the package
  reads) from the calibrate split.
- ``vllm_accuracy.py``: prints the accuracy table of ``docs/ACCURACY.md``.

Run the scripts from the repository root: ``python -m research.calibrate_vllm [--check]``,
``python -m research.vllm_accuracy``.
"""
