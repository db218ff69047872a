"""Serving-engine budgets: a deployment's memory as the engine itself accounts for it.

``calibration`` loads the versioned engine constants (``data/vllm_calibration.json``), ``kv``
follows vLLM's KV-cache specs, grouping and block arithmetic, ``engine_args`` fills the
engine settings, ``quantities`` computes each profile-run quantity, ``vllm`` puts the profile-run
accounting together into a budget. Kept import-light: ``spec`` imports ``calibration`` for the
allowed engine versions, so nothing here may import ``spec`` at package import time.
"""
