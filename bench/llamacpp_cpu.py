#!/usr/bin/env python3
"""Measure llama.cpp's model / KV / output / compute buffers on the CPU backend.

Writes small synthetic llama-architecture GGUF files with gguf.GGUFWriter (random
weights, several tensor types), loads each with llama_cpp.Llama under a grid of
settings, captures llama.cpp's own log through llama_cpp.llama_log_set and parses
every buffer line. Results go to bench/results/llamacpp_cpu.json.

Needs: llama-cpp-python (tested 0.3.36), gguf (tested 0.19.0), numpy. Does not
import vrambudget. If llama-cpp-python was installed without its bundled library
(CMAKE_ARGS="-DLLAMA_BUILD=OFF"), point LLAMA_CPP_LIB_PATH at a directory with
libllama.so built from the same vendored llama.cpp.

    python bench/llamacpp_cpu.py            # full grid (< 5 min on 2 cores)
    python bench/llamacpp_cpu.py --quick    # ~30 s subset
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "llamacpp_cpu.json"

# --------------------------------------------------------------------------- models

# weight type per tensor role; norms are always F32.
MODELS = [
    dict(
        name="l4_e512_h8_kv2_ff1536_v4096_q8",
        n_layer=4,
        n_embd=512,
        n_head=8,
        n_head_kv=2,
        n_ff=1536,
        vocab=4096,
        tied=False,
        types=dict(
            embd="F16", attn="Q8_0", attn_o="Q8_0", ffn="Q8_0", ffn_down="Q8_0", output="Q8_0"
        ),
    ),
    dict(
        name="l6_e768_h12_kv4_ff2048_v8192_q4_tied",
        n_layer=6,
        n_embd=768,
        n_head=12,
        n_head_kv=4,
        n_ff=2048,
        vocab=8192,
        tied=True,
        types=dict(
            embd="Q4_0", attn="Q4_1", attn_o="Q4_0", ffn="Q4_0", ffn_down="Q4_1", output=None
        ),
    ),
    dict(
        name="l8_e1024_h16_kv8_ff2816_v32000_q5",
        n_layer=8,
        n_embd=1024,
        n_head=16,
        n_head_kv=8,
        n_ff=2816,
        vocab=32000,
        tied=False,
        types=dict(
            embd="Q5_0", attn="Q5_1", attn_o="Q5_0", ffn="Q5_0", ffn_down="Q5_1", output="BF16"
        ),
    ),
    dict(
        name="l4_e512_h8_kv8_ff1536_v16000_f16_tied",
        n_layer=4,
        n_embd=512,
        n_head=8,
        n_head_kv=8,
        n_ff=1536,
        vocab=16000,
        tied=True,
        types=dict(embd="F16", attn="F16", attn_o="F16", ffn="F16", ffn_down="F16", output=None),
    ),
    dict(
        name="l4_e1024_h8_kv2_ff2816_v4096_bf16",
        n_layer=4,
        n_embd=1024,
        n_head=8,
        n_head_kv=2,
        n_ff=2816,
        vocab=4096,
        tied=False,
        types=dict(
            embd="BF16", attn="BF16", attn_o="BF16", ffn="BF16", ffn_down="Q8_0", output="F16"
        ),
    ),
]


def tensor_plan(m: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml ne shape, type) for every tensor, in llama.cpp's llama layout."""
    E, F, V = m["n_embd"], m["n_ff"], m["vocab"]
    hd = E // m["n_head"]
    q_out = hd * m["n_head"]
    kv_out = hd * m["n_head_kv"]
    t = m["types"]
    plan = [("token_embd.weight", (E, V), t["embd"]), ("output_norm.weight", (E,), "F32")]
    if not m["tied"]:
        plan.append(("output.weight", (E, V), t["output"]))
    for i in range(m["n_layer"]):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", (E,), "F32"),
            (b + "attn_q.weight", (E, q_out), t["attn"]),
            (b + "attn_k.weight", (E, kv_out), t["attn"]),
            (b + "attn_v.weight", (E, kv_out), t["attn"]),
            (b + "attn_output.weight", (q_out, E), t["attn_o"]),
            (b + "ffn_norm.weight", (E,), "F32"),
        ]
        if m.get("n_expert"):  # Mixtral's layout: a router and merged expert tensors
            X = m["n_expert"]
            plan += [
                (b + "ffn_gate_inp.weight", (E, X), "F32"),
                (b + "ffn_gate_exps.weight", (E, F, X), t["ffn"]),
                (b + "ffn_down_exps.weight", (F, E, X), t["ffn_down"]),
                (b + "ffn_up_exps.weight", (E, F, X), t["ffn"]),
            ]
        else:
            plan += [
                (b + "ffn_gate.weight", (E, F), t["ffn"]),
                (b + "ffn_up.weight", (E, F), t["ffn"]),
                (b + "ffn_down.weight", (F, E), t["ffn_down"]),
            ]
    return plan


def write_gguf(m: dict, path: Path, seed: int = 0) -> dict:
    """Write the model with GGUFWriter; return the GGUF facts actually written."""
    import gguf
    import numpy as np
    from gguf import GGMLQuantizationType as QT

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch="llama")
    hd = m["n_embd"] // m["n_head"]
    w.add_name(m["name"])
    w.add_context_length(4096)
    w.add_embedding_length(m["n_embd"])
    w.add_block_count(m["n_layer"])
    w.add_feed_forward_length(m["n_ff"])
    w.add_head_count(m["n_head"])
    w.add_head_count_kv(m["n_head_kv"])
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(m["vocab"])
    if m.get("n_expert"):
        w.add_expert_count(m["n_expert"])
        w.add_expert_used_count(m["n_expert_used"])
    w.add_file_type(1)  # nominal (MOSTLY_F16); llama.cpp only prints it
    # minimal SentencePiece ("llama") vocab: <unk>, <s>, </s>, 256 byte tokens, fillers.
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, CONTROL, BYTE...
    toks += [f"\u2581t{i}" for i in range(m["vocab"] - len(toks))]
    types += [1] * (m["vocab"] - len(types))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(m["vocab"] - 259)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    facts = []
    data_bytes = 0
    for name, ne, tname in tensor_plan(m):
        qt = QT[tname]
        shape_np = tuple(reversed(ne))  # numpy order is the reverse of ggml ne
        x = rng.standard_normal(shape_np, dtype=np.float32) * 0.02
        if name.endswith("norm.weight"):
            x = np.ones(shape_np, dtype=np.float32)
        if qt == QT.F32:
            arr = x.astype(np.float32)
            w.add_tensor(name, arr)
        elif qt == QT.F16:
            arr = x.astype(np.float16)
            w.add_tensor(name, arr)
        else:
            arr = gguf.quants.quantize(x, qt)
            w.add_tensor(name, arr, raw_shape=arr.shape, raw_dtype=qt)
        facts.append(dict(name=name, type=tname, ne=list(ne), nbytes=int(arr.nbytes)))
        data_bytes += int(arr.nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    align = 32  # GGUF default general.alignment
    padded = sum(-(-f["nbytes"] // align) * align for f in facts)
    return dict(
        arch="llama",
        n_layer=m["n_layer"],
        n_embd=m["n_embd"],
        n_head=m["n_head"],
        n_head_kv=m["n_head_kv"],
        head_dim=hd,
        n_embd_k_gqa=hd * m["n_head_kv"],
        n_embd_v_gqa=hd * m["n_head_kv"],
        n_ff=m["n_ff"],
        n_expert=m.get("n_expert", 0),
        n_expert_used=m.get("n_expert_used", 0),
        vocab=m["vocab"],
        tied_output=m["tied"],
        file_bytes=path.stat().st_size,
        tensor_nbytes_sum=data_bytes,
        tensor_nbytes_sum_padded32=padded,
        n_tensors=len(facts),
        tensors=facts,
    )


# --------------------------------------------------------------------------- log parsing

MIB = r"([0-9]+\.[0-9]+)"
PATTERNS = {
    "model_buffer": re.compile(r"(\w+): +(\S+) model buffer size = +" + MIB + " MiB"),
    "kv_buffer": re.compile(r"(\w+): +(\S+) KV buffer size = +" + MIB + " MiB"),
    "kv_self": re.compile(r"KV self size += +" + MIB + " MiB"),
    "kv_summary": re.compile(
        r"(\w+): size = +" + MIB + r" MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
        r"K \((\w+)\): +" + MIB + r" MiB, V \((\w+)\): +" + MIB + " MiB"
    ),
    "output_buffer": re.compile(r"(\w+): +(\S+) +output buffer size = +" + MIB + " MiB"),
    "compute_buffer": re.compile(r"(\w+): +(\S+) compute buffer size = +" + MIB + " MiB"),
    "compute_buffer_exact": re.compile(
        r"(\w+): +(\S+) compute buffer size (?:is|of) +"
        + MIB
        + " MiB, (?:matches|does not match) expectation of +"
        + MIB
        + " MiB"
    ),
    "cparam": re.compile(
        r"llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|flash_attn|kv_unified"
        r"|causal_attn|n_outputs_max) += (\S+)"
    ),
    "graph": re.compile(r"graph.*: nodes = ([^,]+), splits = ([^,]+)"),
    "file_size": re.compile(r"file size += " + MIB + r" MiB"),
}
DROP = re.compile(r"llama_graph_n_input_tensors|create_tensor|llama_model_loader: - kv")
KEEP = re.compile(
    r"buffer|KV|kv_cache|size =|n_ctx|n_batch|n_ubatch|n_seq|flash_attn|kv_unified|graph|"
    r"file (type|size)|error|failed|repack|REPACK|AMX|mmap|type +\w+: +\d+ tensors|system_info|"
    r"model params|CPU :",
    re.I,
)


def parse_log(text: str) -> dict:
    out: dict = {
        "model_buffers": {},
        "kv_buffers": {},
        "output_buffers": {},
        "compute_buffers": {},
        "compute_buffers_exact": {},
        "context": {},
        "kv_summary": None,
        "graph": None,
        "file_size_MiB": None,
    }
    for line in text.splitlines():
        if m := PATTERNS["model_buffer"].search(line):
            out["model_buffers"][m.group(2)] = out["model_buffers"].get(m.group(2), 0.0) + float(
                m.group(3)
            )
        elif m := PATTERNS["kv_buffer"].search(line):
            out["kv_buffers"][m.group(2)] = out["kv_buffers"].get(m.group(2), 0.0) + float(
                m.group(3)
            )
        elif m := PATTERNS["kv_self"].search(line):
            out["kv_buffers"]["self"] = float(m.group(1))
        elif m := PATTERNS["kv_summary"].search(line):
            out["kv_summary"] = dict(
                total_MiB=float(m.group(2)),
                cells=int(m.group(3)),
                layers=int(m.group(4)),
                seqs=int(m.group(5)),
                streams=int(m.group(6)),
                type_k=m.group(7),
                K_MiB=float(m.group(8)),
                type_v=m.group(9),
                V_MiB=float(m.group(10)),
            )
        elif m := PATTERNS["output_buffer"].search(line):
            out["output_buffers"][m.group(2)] = float(m.group(3))
        elif m := PATTERNS["compute_buffer"].search(line):
            out["compute_buffers"][m.group(2)] = float(m.group(3))
        elif m := PATTERNS["compute_buffer_exact"].search(line):
            out["compute_buffers_exact"][m.group(2)] = dict(
                actual_MiB=float(m.group(3)), expected_MiB=float(m.group(4))
            )
        elif m := PATTERNS["cparam"].search(line):
            v = m.group(2)
            out["context"][m.group(1)] = int(v) if v.isdigit() else v
        elif m := PATTERNS["graph"].search(line):
            out["graph"] = dict(nodes=m.group(1), splits=m.group(2))
        elif m := PATTERNS["file_size"].search(line):
            out["file_size_MiB"] = float(m.group(1))
    return out


# ------------------------------------------------------------- worker (runs in a child process)

_LOG: list[str] = []


def _install_log_capture(llama_cpp) -> object:
    @llama_cpp.llama_log_callback
    def cb(level, text, user_data):
        _LOG.append(text.decode("utf-8", "replace"))

    llama_cpp.llama_log_set(cb, ctypes.c_void_p(0))
    return cb


def _ggml_type(llama_cpp, name: str) -> int:
    return {
        "f16": llama_cpp.GGML_TYPE_F16,
        "q8_0": llama_cpp.GGML_TYPE_Q8_0,
        "q4_0": llama_cpp.GGML_TYPE_Q4_0,
        "f32": llama_cpp.GGML_TYPE_F32,
    }[name]


def run_one_llama(llama_cpp, path: str, s: dict, n_threads: int) -> dict:
    """One load through the high-level llama_cpp.Llama class."""
    _LOG.clear()
    t0 = time.time()
    err = None
    model_size = n_params = None
    try:
        llm = llama_cpp.Llama(
            model_path=path,
            n_ctx=s["n_ctx"],
            n_batch=s["n_batch"],
            n_ubatch=s["n_ubatch"],
            flash_attn=s["flash_attn"],
            type_k=_ggml_type(llama_cpp, s["type_k"]),
            type_v=_ggml_type(llama_cpp, s["type_v"]),
            use_mmap=s["use_mmap"],
            n_gpu_layers=0,
            n_threads=n_threads,
            verbose=True,
        )
        model_size = int(llama_cpp.llama_model_size(llm._model.model))
        n_params = int(llama_cpp.llama_model_n_params(llm._model.model))
        llm.close()  # the context destructor logs the exact compute buffer size (DEBUG level)
        del llm
    except Exception as e:  # noqa: BLE001
        err = f"{type(e).__name__}: {e}"
    text = "".join(_LOG)
    return dict(
        settings=s,
        api="llama_cpp.Llama",
        error=err,
        seconds=round(time.time() - t0, 3),
        llama_model_size_bytes=model_size,
        llama_model_n_params=n_params,
        parsed=parse_log(text),
        log_lines=[ln for ln in text.splitlines() if KEEP.search(ln) and not DROP.search(ln)],
        _full_log=text,
    )


def run_one_lowlevel(llama_cpp, path: str, s: dict, n_threads: int) -> dict:
    """One load through the C API (exposes n_seq_max and kv_unified, which Llama() does not)."""
    _LOG.clear()
    t0 = time.time()
    err = None
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_mmap = s["use_mmap"]
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    model_size = None
    if not model:
        err = "model load failed"
    else:
        model_size = int(llama_cpp.llama_model_size(model))
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = s["n_ctx"], s["n_batch"], s["n_ubatch"]
        cp.n_seq_max = s["n_seq_max"]
        cp.kv_unified = s["kv_unified"]
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if s["flash_attn"]
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        cp.type_k = _ggml_type(llama_cpp, s["type_k"])
        cp.type_v = _ggml_type(llama_cpp, s["type_v"])
        ctx = llama_cpp.llama_init_from_model(model, cp)
        if not ctx:
            err = "context init failed"
        else:
            llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    text = "".join(_LOG)
    return dict(
        settings=s,
        api="llama_cpp C API",
        error=err,
        seconds=round(time.time() - t0, 3),
        llama_model_size_bytes=model_size,
        parsed=parse_log(text),
        log_lines=[ln for ln in text.splitlines() if KEEP.search(ln) and not DROP.search(ln)],
        _full_log=text,
    )


def worker(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    import llama_cpp

    keep = _install_log_capture(llama_cpp)  # noqa: F841 (keep the callback alive)
    results = []
    for i, s in enumerate(job["settings"]):
        fn = run_one_lowlevel if s.get("api") == "capi" else run_one_llama
        r = fn(llama_cpp, job["path"], s, job["n_threads"])
        if i > 0:
            r.pop("_full_log")
        results.append(r)
        # write after every run so a crash keeps earlier results
        Path(job["out"]).write_text(json.dumps(results))
    info = dict(
        llama_cpp_version=getattr(llama_cpp, "__version__", None),
        system_info=llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip(),
    )
    for fn in ("ggml_version", "ggml_commit"):
        try:
            lib = (
                llama_cpp.llama_cpp._lib
            )  # dlsym on libllama's handle also searches its deps (libggml-base)
            g = getattr(lib, fn)
            g.restype = ctypes.c_char_p
            info[fn] = g().decode()
        except Exception as e:  # noqa: BLE001
            info[fn] = f"unavailable ({type(e).__name__})"
    Path(job["out"] + ".info").write_text(json.dumps(info))


# --------------------------------------------------------------------------- grid


def grid(quick: bool) -> list[dict]:
    runs = []
    ctxs = [256, 1024, 4096] if not quick else [256, 4096]
    ubs = [128, 512] if not quick else [512]
    for n_ctx in ctxs:
        for fa in (True, False):
            caches = (
                [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0")]
                if fa
                else [("f16", "f16"), ("q8_0", "f16"), ("q4_0", "f16")]
            )
            if quick:
                caches = caches[:2]
            for tk, tv in caches:
                for ub in ubs:
                    runs.append(
                        dict(
                            api="Llama",
                            n_ctx=n_ctx,
                            n_batch=512,
                            n_ubatch=ub,
                            flash_attn=fa,
                            type_k=tk,
                            type_v=tv,
                            use_mmap=True,
                        )
                    )
    # no-mmap loads (model buffer becomes "CPU" instead of "CPU_Mapped")
    runs.append(
        dict(
            api="Llama",
            n_ctx=1024,
            n_batch=512,
            n_ubatch=512,
            flash_attn=True,
            type_k="f16",
            type_v="f16",
            use_mmap=False,
        )
    )
    # the one setting that must fail: quantized V without flash attention
    if not quick:
        runs.append(
            dict(
                api="Llama",
                n_ctx=256,
                n_batch=512,
                n_ubatch=512,
                flash_attn=False,
                type_k="q8_0",
                type_v="q8_0",
                use_mmap=True,
            )
        )
        # n_batch > n_ubatch and n_ctx not a multiple of 256
        runs.append(
            dict(
                api="Llama",
                n_ctx=1000,
                n_batch=2048,
                n_ubatch=512,
                flash_attn=True,
                type_k="f16",
                type_v="f16",
                use_mmap=True,
            )
        )
        runs.append(
            dict(
                api="Llama",
                n_ctx=3000,
                n_batch=1024,
                n_ubatch=1024,
                flash_attn=False,
                type_k="f16",
                type_v="f16",
                use_mmap=True,
            )
        )
    # extra compute-buffer sweep (other n_ctx / n_ubatch values, n_batch = max(512, n_ubatch))
    if not quick:
        for n_ctx in (512, 2048, 8192):
            for fa in (True, False):
                for ub in (64, 256, 1024, 2048):
                    runs.append(
                        dict(
                            api="Llama",
                            n_ctx=n_ctx,
                            n_batch=max(512, ub),
                            n_ubatch=ub,
                            flash_attn=fa,
                            type_k="f16",
                            type_v="f16",
                            use_mmap=True,
                            sweep="compute",
                        )
                    )
    # n_seq_max / kv_unified through the C API
    seqs = [(1, False), (4, False), (4, True)] if not quick else [(4, False)]
    for nseq, uni in seqs:
        for fa in (True, False) if not quick else (True,):
            runs.append(
                dict(
                    api="capi",
                    n_ctx=4096,
                    n_batch=512,
                    n_ubatch=512,
                    flash_attn=fa,
                    type_k="f16",
                    type_v="f16",
                    use_mmap=True,
                    n_seq_max=nseq,
                    kv_unified=uni,
                )
            )
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="~30 s subset (2 models, fewer settings)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument(
        "--workdir", default=None, help="where GGUF files go (default: a temp dir; reused if given)"
    )
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._worker:
        worker(a._worker)
        return

    t_start = time.time()
    import gguf  # noqa: F401

    tmp = None
    if a.workdir:
        wd = Path(a.workdir)
        wd.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="llamacpp_cpu_")
        wd = Path(tmp.name)
    models = MODELS if not a.quick else [MODELS[0], MODELS[1]]
    settings = grid(a.quick)
    all_runs = []
    info = {}
    model_facts = {}
    for m in models:
        path = wd / f"{m['name']}.gguf"
        t0 = time.time()
        facts_path = wd / f"{m['name']}.facts.json"
        if path.exists() and facts_path.exists():
            facts = json.loads(facts_path.read_text())
        else:
            facts = write_gguf(m, path)
            facts_path.write_text(json.dumps(facts))
        facts["write_seconds"] = round(time.time() - t0, 2)
        model_facts[m["name"]] = facts
        job = dict(
            path=str(path),
            settings=settings,
            n_threads=a.threads,
            out=str(wd / f"{m['name']}.runs.json"),
        )
        jp = wd / f"{m['name']}.job.json"
        jp.write_text(json.dumps(job))
        Path(job["out"]).unlink(missing_ok=True)
        t1 = time.time()
        p = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--_worker", str(jp)],
            capture_output=True,
            text=True,
        )
        runs = json.loads(Path(job["out"]).read_text()) if Path(job["out"]).exists() else []
        if p.returncode != 0:
            runs.append(
                dict(
                    error=f"worker exited {p.returncode}",
                    stderr_tail=p.stderr[-3000:],
                    settings=settings[len(runs)] if len(runs) < len(settings) else None,
                )
            )
        if Path(job["out"] + ".info").exists():
            info = json.loads(Path(job["out"] + ".info").read_text())
        full_log = None
        for r in runs:
            r["model"] = m["name"]
            if "_full_log" in r:
                full_log = r.pop("_full_log")
        facts["first_run_full_log"] = full_log
        all_runs.extend(runs)
        print(
            f"{m['name']}: wrote GGUF in {facts['write_seconds']}s, {len(runs)} runs in "
            f"{time.time() - t1:.1f}s, errors={sum(1 for r in runs if r.get('error'))}",
            file=sys.stderr,
        )
    # the build line llama.cpp's common library would print is not emitted by libllama itself;
    # record the commit from the vendored tree when we can find it.
    out = dict(
        generated_by="bench/llamacpp_cpu.py",
        quick=a.quick,
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        host=dict(
            machine=platform.machine(),
            python=platform.python_version(),
            cpu_count=os.cpu_count(),
            threads=a.threads,
        ),
        llama_cpp=info,
        gguf_version=getattr(__import__("gguf"), "__version__", None),
        llama_cpp_lib_path=os.environ.get("LLAMA_CPP_LIB_PATH"),
        build_commit_env=os.environ.get("LLAMA_CPP_BUILD_COMMIT"),
        models=model_facts,
        runs=all_runs,
        seconds=round(time.time() - t_start, 1),
    )
    try:
        import importlib.metadata as md

        out["gguf_version"] = md.version("gguf")
        out["llama_cpp_python_version"] = md.version("llama-cpp-python")
    except Exception:  # noqa: BLE001
        pass
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}: {len(all_runs)} runs in {out['seconds']}s", file=sys.stderr)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
