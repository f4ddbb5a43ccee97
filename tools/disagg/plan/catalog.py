"""Built-in models, GPUs and fabrics, each value with where it came from.

Models are stored as the relevant keys of their real Hugging Face ``config.json`` so the same
parser reads them and a user's own file. GPU peaks are dense (no 2:4 sparsity) datasheet
numbers; fabrics give the RDMA bandwidth one GPU can reach (rails wired to its PCIe switch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from disagg.plan.model_spec import ModelConfigError, ModelSpec, spec_from_hf_config

# Qwen/Qwen3-32B config.json (huggingface.co/Qwen/Qwen3-32B/blob/main/config.json), the keys
# the model uses. 64 layers, GQA 64 query / 8 KV heads of 128, bf16: 32.8B parameters.
QWEN3_32B_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 128,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_attention_heads": 64,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}

# zai-org/GLM-5 config.json (GlmMoeDsaForCausalLM), as quoted in vllm-project/vllm issue
# "vllm serve quantized GLM-5 failed" and cross-checked with the GLM-5 technical report's
# architecture table (744B total / 40B active, 78 layers = 3 dense + 75 MoE, 64 heads, MLA with
# kv_lora_rank 512 and qk_rope_head_dim 64, QK head 192+64, V head 256, DSA indexer 32 heads
# x 128 picking 2048 keys). GLM-5-FP8 is the same architecture with block-FP8 weights
# (quantization_config.quant_method "fp8"); vLLM keeps its MLA cache in bf16 by default
# (DeepseekV32ForCausalLM.verify_and_update_config maps only an fp8 request to fp8_ds_mla).
GLM_5_FP8_CONFIG: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "first_k_dense_replace": 3,
    "hidden_size": 6144,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_topk": 2048,
    "intermediate_size": 12288,
    "kv_lora_rank": 512,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 64,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 78,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "v_head_dim": 256,
    "vocab_size": 154880,
}

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3-32b": QWEN3_32B_CONFIG,
    "glm-5-fp8": GLM_5_FP8_CONFIG,
}


@dataclass(frozen=True)
class Gpu:
    """Dense tensor-core peaks, HBM bandwidth and NVLink bandwidth (one direction) of one GPU."""

    name: str
    peak_flops: Mapping[str, float]
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float

    def peak_for(self, dtype: str) -> float:
        """Peak dense FLOP/s for matmuls in ``dtype``: its own peak where the entry has one,
        else the bf16 tensor-core peak (fp8 weights run fp8 tensor cores)."""
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        return self.peak_flops["fp8" if dtype == "fp8" else "bf16"]


# NVIDIA H100 and H200 SXM datasheets: FP8 3,958 and BF16 1,979 TFLOPS are quoted *with*
# 2:4 sparsity; dense is half. HBM: H100 SXM 3.35 TB/s, H200 4.8 TB/s. NVLink 4: 900 GB/s
# per GPU both directions together, 450 GB/s each way.
#
# One AMD EPYC Zen 5 core, the local rig's engine (one core per server): the Software
# Optimization Guide for the AMD Zen5 Microarchitecture gives two 512-bit FMA
# pipes, 2 x 16 fp32 FMAs = 64 FLOP per cycle, twice that in bf16 (AVX512_BF16 dot products);
# the clock is the rig's 2.6 GHz TSC (lscpu). Memory and core-to-core bandwidth are a nominal
# 30 GB/s, one core's share of DRAM streaming (no datasheet figure): the rig's prefill passes
# are compute-bound by two orders of magnitude, so neither enters its predictions.
GPUS: dict[str, Gpu] = {
    "h100": Gpu("NVIDIA H100 SXM", {"bf16": 989.5e12, "fp8": 1979e12}, 3.35e12, 450e9),
    "h200": Gpu("NVIDIA H200 SXM", {"bf16": 989.5e12, "fp8": 1979e12}, 4.8e12, 450e9),
    "epyc-zen5-core": Gpu(
        "AMD EPYC Zen 5, one core at 2.6 GHz", {"fp32": 166.4e9, "bf16": 332.8e9}, 30e9, 30e9
    ),
}


@dataclass(frozen=True)
class Fabric:
    """Inter-node RDMA fabric as one GPU sees it."""

    name: str
    rails_per_gpu: int
    rail_gbit_per_s: float

    @property
    def bytes_per_s_per_gpu(self) -> float:
        """Line rate of the rails one GPU's KV reads use, in bytes per second."""
        return self.rails_per_gpu * self.rail_gbit_per_s * 1e9 / 8


# AWS P5 family pages: p5en.48xlarge 3,200 Gbps of EFAv3 over 16 network cards for 8 H200
# (16 x 200 Gbps); p5.48xlarge 3,200 Gbps of EFA over 32 cards for 8 H100 (32 x 100 Gbps).
# NIXL's LIBFABRIC backend registers each GPU's KV on the rails of its PCIe switch (the seed's
# appendix: 2 of the 16 on p5en), so one GPU reads at 2 x 200 Gb/s = 50 GB/s.
#
# The local rig's NIXL runs UCX over TCP on 127.0.0.1: a kernel copy with no line rate, given a
# nominal 100 Gb/s so that a link efficiency fitted on the rig (disagg plan --calibrate) is a
# fraction of that figure.
FABRICS: dict[str, Fabric] = {
    "p5en-efa": Fabric("AWS p5en EFAv3 (16 x 200 Gb/s, 2 rails per GPU)", 2, 200.0),
    "p5-efa": Fabric("AWS p5 EFA (32 x 100 Gb/s, 4 rails per GPU)", 4, 100.0),
    "loopback-tcp": Fabric("UCX over loopback TCP (nominal 100 Gb/s)", 1, 100.0),
}


_T = TypeVar("_T")


def _lookup(table: Mapping[str, _T], key: str, what: str) -> _T:
    try:
        return table[key.lower()]
    except KeyError:
        known = ", ".join(sorted(table))
        raise ModelConfigError(f"unknown {what} {key!r}; known: {known}") from None


def gpu(name: str) -> Gpu:
    """A catalog GPU by name, or an error listing the known ones."""
    return _lookup(GPUS, name, "GPU")


def fabric(name: str) -> Fabric:
    """A catalog fabric by name, or an error listing the known ones."""
    return _lookup(FABRICS, name, "fabric")


def model(name_or_path: str, kv_dtype: str | None = None) -> ModelSpec:
    """A catalog model by name, or a Hugging Face config.json given by path."""
    path = Path(name_or_path)
    if name_or_path.lower() not in MODEL_CONFIGS and (path.suffix == ".json" or path.exists()):
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ModelConfigError(f"cannot read model config {path}: {exc.strerror}") from None
        except json.JSONDecodeError as exc:
            raise ModelConfigError(f"model config {path} is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise ModelConfigError(f"model config {path} must be a JSON object")
        return spec_from_hf_config(config, path.stem, kv_dtype)
    config = _lookup(MODEL_CONFIGS, name_or_path, "model (or a path to a config.json)")
    return spec_from_hf_config(config, name_or_path.lower(), kv_dtype)
