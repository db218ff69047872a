"""The facts the compatibility rules read, each with the public source it was read from.

Every table here was read from a released artifact or an official page; a version a table does
not list is not guessed (the rule that needs it answers ``unknown``, or uses the newest row read
and says so)."""

from __future__ import annotations

__all__ = [
    "BNB_CUDA_MIN_CC",
    "BNB_ROCM_FIRST",
    "BNB_ROCM_TARGETS",
    "CUDA_ARCH_MIN",
    "CUDA_DROPS_BELOW_CC",
    "CUDA_FAMILY_MIN_DRIVER",
    "CUDA_TOOLKIT_DRIVER",
    "FA2_CK_TARGETS",
    "SOURCES",
    "TORCH_PYPI_CUDA",
    "VLLM_HIP_TARGETS",
    "VLLM_MIN_CAPABILITY",
]

# ------------------------------------------------------------------------------ sources --

_CUDA_NOTES = (
    "NVIDIA CUDA Toolkit 13.2 Release Notes, https://docs.nvidia.com/cuda/"
    "cuda-toolkit-release-notes/index.html"
)
_VLLM_33 = "vLLM 0.33.0 wheel (PyPI vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl)"
_VLLM_11 = "vLLM 0.11.0 wheel (PyPI vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl)"
_VLLM_CMAKE = (
    "vllm-project/vllm CMakeLists.txt at 000a1ee93b2ddc3cb06c62a71fe769c789cbf7b1 "
    "(https://github.com/vllm-project/vllm/blob/000a1ee93b2ddc3cb06c62a71fe769c789cbf7b1/"
    "CMakeLists.txt)"
)
_BNB_INSTALL = (
    "bitsandbytes docs/source/installation.mdx (https://github.com/bitsandbytes-foundation/"
    "bitsandbytes/blob/{tag}/docs/source/installation.mdx)"
)
_FA = (
    "Dao-AILab/flash-attention at 0251105a2fb19d2957484b7f023cd8c115286ced "
    "(https://github.com/Dao-AILab/flash-attention/blob/0251105a2fb19d2957484b7f023cd8c115286ced/"
)

SOURCES: dict[str, str] = {
    "cuda_driver": f"{_CUDA_NOTES}, Table 3 'CUDA Toolkit and Corresponding Driver Versions' "
    "(e.g. 'CUDA 12.8 GA >=570.26', 'CUDA 11.8 GA >=520.61.05') and Table 2 'CUDA Toolkit and "
    "Minimum Required Driver Version for CUDA Minor Version Compatibility' ('13.x >= 580', "
    "'12.x >= 525 < 580', '11.x >= 450 < 525')",
    "cuda_arch_blackwell": "vLLM docs/getting_started/installation/gpu/cuda.inc.md at "
    "0baaf0eaef91351b3916e51f200ea96fe8566f99: 'NVIDIA Blackwell GPUs (B200, GB200) require a "
    "minimum of CUDA 12.8'",
    "cuda_arch_dropped": f"{_CUDA_NOTES}, 2.6.2 Deprecated Architectures: 'Architecture support "
    "for Maxwell, Pascal, and Volta is considered feature-complete. Offline compilation and "
    "library support for these architectures have been removed in CUDA Toolkit 13.0'",
    "torch_cuda": "PyPI metadata of torch's Linux x86_64 wheels (pip install --dry-run --report): "
    "Requires-Dist 'nvidia-cuda-runtime-cu12==12.6.77' (2.7.0), '==12.8.90' (2.8.0-2.10.0), "
    "'cuda-toolkit[...]==13.0.2' (2.11.0, 2.12.0), '==13.0.3' (2.14.0); a '+cuXYZ' local "
    "version names its build",
    "torch_sdpa_math": "torch 2.13.0 aten/src/ATen/native/transformers/cuda/sdp_utils.cpp: "
    "check_flash_attention_hardware_support (sm80+), can_use_mem_efficient_attention "
    "(less_than_sm80_mem_efficient_dtypes = {kHalf, kFloat}; "
    "check_batch_size_and_num_heads_dense<false>: no grouped heads before 2.14, whose "
    "docstring says 'Memory-efficient attention also supports GQA on NVIDIA CUDA', "
    "pytorch#191085); attention.cpp "
    "_scaled_dot_product_attention_math ('Keep query, key, value in high precision'); "
    "transformers 5.23.0 integrations/sdpa_attention.py use_gqa_in_sdpa (no mask: "
    "enable_gqa=True); on a T4 with torch 2.10, transformers#48633: 'SDPA always falls back "
    "to the MATH backend during decode because use_gqa_in_sdpa() returns True'",
    "torch_bf16": "torch 2.13.0 torch/cuda/__init__.py is_bf16_supported: native when "
    "'get_device_properties(device).major >= 8', else bf16 'including_emulation' (a bf16 tensor "
    "is created and runs without bf16 tensor cores)",
    "vllm_bf16": f"{_VLLM_33} vllm/platforms/cuda.py check_if_supports_dtype: 'Bfloat16 is only "
    "supported on GPUs with compute capability of at least 8.0 ... You can use float16 instead "
    "by explicitly setting the `dtype` flag in CLI, for example: --dtype=half.'",
    "vllm_quant": f"{_VLLM_33} and {_VLLM_11}: each QuantizationConfig.get_min_capability() "
    "(e.g. 0.33.0 auto_awq.py AutoAWQConfig 75, fp8.py Fp8Config 75, mxfp4.py Mxfp4Config 80, "
    "modelopt.py ModelOptNvFp4Config 75; 0.11.0 awq.py AWQConfig 75, awq_marlin.py 80, fp8.py "
    "80, modelopt.py ModelOptNvFp4Config 80), enforced by vllm/config/vllm.py: 'The "
    "quantization method ... is not supported for the current GPU. Minimum capability'",
    "vllm_mxfp4_hopper": f"{_VLLM_33} vllm/model_executor/layers/fused_moe/oracle/mxfp4.py: "
    "'SM100+ prefers DeepGEMM FP4 / TRTLLM MXFP8; SM90 falls through to Humming or Marlin'",
    "vllm_torch": "PyPI metadata of vllm (Requires-Dist torch==...), e.g. 0.11.0 'torch==2.8.0', "
    "0.20.0 'torch==2.11.0', 0.33.0 'torch==2.14.0'",
    "vllm_cuda_archs": f"{_VLLM_CMAKE}: CUDA >= 12.8 builds set CUDA_SUPPORTED_ARCHS "
    "'7.5;8.0;8.6;8.7;8.9;9.0;10.0;...' (7.0 only below 12.8)",
    "vllm_rocm": f"{_VLLM_CMAKE}: 'set(HIP_SUPPORTED_ARCHS \"gfx906;gfx908;gfx90a;gfx942;gfx950;"
    "gfx1030;gfx1100;gfx1101;gfx1102;gfx1103;gfx1150;gfx1151;gfx1152;gfx1153;gfx1200;gfx1201\")'",
    "sglang_rocm": "sgl-project/sglang docs/platforms/amd_gpu.md at "
    "0175ceecc13527893407213998a7f449a113f5a7: 'When using AMD GPUs (such as MI300X)' -- the "
    "only AMD GPU the page names; no list of supported gfx targets",
    "transformers_fp8": "transformers 5.23.0 quantizers/quantizer_finegrained_fp8.py: 'FP8 "
    "quantized models is only supported on GPUs with compute capability >= 8.9 (e.g 4090/H100) "
    "... We will default to dequantizing the model to bf16'",
    "transformers_mxfp4": "transformers 5.23.0 quantizers/quantizer_mxfp4.py: 'MXFP4 "
    "quantization is only supported on GPUs with compute capability >= 7.5 (e.g T4, A100, L4, "
    "H100, or B200) ... We will default to dequantizing the model to bf16.'",
    "transformers_nvfp4": "transformers 5.23.0 quantizers/quantizer_nvfp4.py: 'Loading "
    "pre-quantized NVFP4 checkpoints is not supported yet.'; 'NVFP4 requires Blackwell (sm100+) "
    "block-scaled tensor cores'",
    "flash_attn": f"{_FA}README.md): 'FlashAttention-2 with CUDA currently supports: 1. Ampere, "
    "Ada, or Hopper GPUs (e.g., A100, RTX 3090, RTX 4090, H100)'; csrc/flash_attn/flash_api.cpp: "
    "'FlashAttention only supports Ampere GPUs or newer.'",
    "flash_attn_3": f"{_FA}README.md): 'FlashAttention-3 is optimized for Hopper GPUs (e.g. H100)' "
    "(installed from its hopper/ directory)",
    "flash_attn_rocm": f'{_FA}setup.py): \'allowed_archs = ["native", "gfx90a", "gfx942", '
    '"gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1150", "gfx1151", "gfx1200", '
    "\"gfx1201\"]'; README.md 'ROCm 6.0 and above'",
    "bnb_cuda": _BNB_INSTALL.format(tag="0.50.0")
    + ": 'supported on NVIDIA GPUs with Compute Capability 6.0+'; 'LLM.int8() | 7.5+'; "
    "'NF4/FP4 quantization | 6.0+'; '8-bit optimizers/quantization | 6.0+'",
    "bnb_rocm": _BNB_INSTALL.format(tag="0.48.0")
    + ": 'ROCm support is currently only available in our preview wheels or when building from "
    "source'; 0.49.0 and 0.50.0: PyPI wheels with targets 'RDNA: gfx1100, gfx1101, ...' "
    "(tables of supported CDNA and RDNA targets per release)",
    "nvml_cuda_driver": "NVML nvmlSystemGetCudaDriverVersion (the newest CUDA the installed "
    "driver supports) against the minor-version rule of the NVIDIA CUDA Toolkit release notes, "
    "Table 2: a runtime runs on a driver of its own CUDA major",
    "custom_native": "the custom device's native_dtypes (no compute capability is known for it)",
}
"""Where each rule's facts come from (a rule outcome's ``source``)."""

# ---------------------------------------------------------------------------- CUDA/driver --

CUDA_TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    # Table 3, the GA row of each toolkit (Linux x86_64).
    (11, 0): "450.51.05",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
    (13, 2): "595.45.04",
}
"""The driver each CUDA toolkit release (GA) was published with (Table 3)."""

CUDA_FAMILY_MIN_DRIVER: dict[int, int] = {11: 450, 12: 525, 13: 580}
"""The lowest driver branch on which a toolkit of the major runs by minor-version compatibility
(Table 2); features that need the newer driver (PTX JIT of newer code) may still fail."""

CUDA_ARCH_MIN: dict[int, tuple[tuple[int, int], str]] = {
    10: ((12, 8), "cuda_arch_blackwell"),  # B200 / GB200 (sm100)
    12: ((12, 8), "cuda_arch_blackwell"),  # RTX 50 (sm120), the same CUDA 12.8 release
}
"""The first CUDA release that targets a compute-capability major."""

CUDA_DROPS_BELOW_CC: dict[int, tuple[int, int]] = {13: (7, 5)}
"""From this CUDA major on, devices below this compute capability are not targeted (13.0:
Maxwell, Pascal and Volta removed)."""

TORCH_PYPI_CUDA: dict[tuple[int, int], tuple[int, int]] = {
    (2, 4): (12, 1),
    (2, 5): (12, 4),
    (2, 6): (12, 4),
    (2, 7): (12, 6),
    (2, 8): (12, 8),
    (2, 9): (12, 8),
    (2, 10): (12, 8),
    (2, 11): (13, 0),
    (2, 12): (13, 0),
    (2, 14): (13, 0),
}
"""The CUDA runtime of torch's default (PyPI) Linux x86_64 wheel per release (2.13.0 was not
read: it resolved to a CPU build here)."""

# ------------------------------------------------------------------------------- engines --

VLLM_MIN_CAPABILITY: dict[str, dict[str, int]] = {
    # get_min_capability() of the config class vLLM uses for each quantization.
    "0.33.0": {
        "awq": 75,  # AutoAWQConfig (awq and awq_marlin)
        "gptq": 60,  # AutoGPTQConfig (gptq and gptq_marlin)
        "fp8": 75,  # Fp8Config
        "mxfp4": 80,  # Mxfp4Config
        "nvfp4": 75,  # ModelOptNvFp4Config
        "compressed_tensors": 70,  # CompressedTensorsConfig (each scheme checks its own)
        "compressed_tensors_int8": 75,  # CompressedTensorsW8A8Int8
        "compressed_tensors_wna16": 75,  # CompressedTensorsWNA16
        "compressed_tensors_fp8": 75,  # CompressedTensorsW8A16Fp8 (W8A8Fp8: 89)
    },
    "0.11.0": {
        "awq": 75,  # AWQConfig (awq_marlin: 80)
        "gptq": 60,  # GPTQConfig (gptq_marlin: 80)
        "fp8": 80,  # Fp8Config
        "mxfp4": 80,  # Mxfp4Config
        "nvfp4": 80,  # ModelOptNvFp4Config
        "bnb": 70,  # BitsAndBytesConfig
    },
}
"""vLLM's minimum compute capability per quantization, at the releases read (a release between
two uses the earlier; after the newest, the newest)."""

VLLM_HIP_TARGETS: frozenset[str] = frozenset(
    [
        "gfx906",
        "gfx908",
        "gfx90a",
        "gfx942",
        "gfx950",
        "gfx1030",
        "gfx1100",
        "gfx1101",
        "gfx1102",
        "gfx1103",
        "gfx1150",
        "gfx1151",
        "gfx1152",
        "gfx1153",
        "gfx1200",
        "gfx1201",
    ]
)
SGLANG_ROCM_NAMED: frozenset[str] = frozenset({"gfx942"})
"""The gfx target of the one AMD GPU SGLang's AMD page names (MI300X)."""

# ----------------------------------------------------------------------------- libraries --

FA2_CK_TARGETS: frozenset[str] = frozenset(
    [
        "gfx90a",
        "gfx942",
        "gfx950",
        "gfx1100",
        "gfx1101",
        "gfx1102",
        "gfx1150",
        "gfx1151",
        "gfx1200",
        "gfx1201",
    ]
)

BNB_CUDA_MIN_CC: dict[str, tuple[int, int]] = {"int8": (7, 5), "nf4": (6, 0), "optim8bit": (6, 0)}

BNB_ROCM_FIRST: tuple[int, int, int] = (0, 49, 0)
"""The first bitsandbytes release with ROCm wheels on PyPI (0.48.x: preview wheels only)."""

BNB_ROCM_TARGETS: dict[tuple[int, int], frozenset[str]] = {
    (0, 49): frozenset(
        [
            "gfx90a",
            "gfx942",
            "gfx950",
            "gfx1100",
            "gfx1101",
            "gfx1150",
            "gfx1151",
            "gfx1200",
            "gfx1201",
        ]
    ),
    (0, 50): frozenset(
        [
            "gfx908",
            "gfx90a",
            "gfx942",
            "gfx950",
            "gfx1250",
            "gfx1030",
            "gfx1031",
            "gfx1032",
            "gfx1033",
            "gfx1034",
            "gfx1035",
            "gfx1036",
            "gfx1100",
            "gfx1101",
            "gfx1102",
            "gfx1103",
            "gfx1150",
            "gfx1151",
            "gfx1152",
            "gfx1153",
            "gfx1200",
            "gfx1201",
        ]
    ),
}
"""The gfx targets of each release's ROCm wheels (Linux x86_64, every ROCm build listed)."""
