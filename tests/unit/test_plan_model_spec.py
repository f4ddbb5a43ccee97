"""Model shapes: parameter counts and KV bytes against published figures, config parsing errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disagg.plan import catalog
from disagg.plan.model_spec import (
    AttentionKind,
    ModelConfigError,
    spec_from_hf_config,
)
from disagg.plan.physics import kv_bytes_per_token_per_gpu
from plan_samples import LLAMA_8B


def test_qwen3_32b_matches_its_published_size() -> None:
    spec = catalog.model("qwen3-32b")
    assert spec.attention is AttentionKind.GQA
    assert spec.params == pytest.approx(32.8e9, rel=0.01)
    assert spec.active_params == spec.params


def test_glm5_matches_the_technical_report() -> None:
    spec = catalog.model("glm-5-fp8")
    assert spec.attention is AttentionKind.MLA
    assert spec.sparse is not None and spec.sparse.top_k == 2048
    assert spec.weight_dtype == "fp8"
    assert spec.kv_dtype == "bf16"
    assert spec.params == pytest.approx(744e9, rel=0.01)
    assert spec.active_params == pytest.approx(40e9, rel=0.06)


def test_kv_bytes_per_token_follow_the_cache_layout() -> None:
    qwen = catalog.model("qwen3-32b")
    # 64 layers x (K and V) x 1 of 8 KV heads per rank x 128 x 2 bytes.
    assert kv_bytes_per_token_per_gpu(qwen, 8) == 64 * 2 * 1 * 128 * 2
    assert kv_bytes_per_token_per_gpu(qwen, 1) == 8 * kv_bytes_per_token_per_gpu(qwen, 8)
    # More ranks than KV heads replicate a head on each rank.
    assert kv_bytes_per_token_per_gpu(qwen, 16) == kv_bytes_per_token_per_gpu(qwen, 8)
    glm = catalog.model("glm-5-fp8")
    # MLA latent (512 + 64 rope, bf16) is replicated on every rank; the indexer adds 128 FP8
    # values and one fp32 scale per token and layer.
    assert kv_bytes_per_token_per_gpu(glm, 8) == 78 * ((512 + 64) * 2 + 128 + 4)
    assert kv_bytes_per_token_per_gpu(glm, 1) == kv_bytes_per_token_per_gpu(glm, 8)


def test_kv_dtype_override_halves_the_cache() -> None:
    bf16 = catalog.model("qwen3-32b")
    fp8 = catalog.model("qwen3-32b", kv_dtype="fp8")
    assert 2 * kv_bytes_per_token_per_gpu(fp8, 8) == kv_bytes_per_token_per_gpu(bf16, 8)


def test_user_config_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "llama-8b.json"
    path.write_text(json.dumps({"text_config": LLAMA_8B}), encoding="utf-8")
    spec = catalog.model(str(path))
    assert spec.name == "llama-8b"
    assert spec.attention is AttentionKind.GQA
    assert spec.head_dim == 128
    assert spec.params == pytest.approx(8.03e9, rel=0.01)


def test_missing_field_is_named() -> None:
    config = dict(LLAMA_8B)
    del config["num_hidden_layers"]
    with pytest.raises(ModelConfigError, match="num_hidden_layers"):
        spec_from_hf_config(config, "broken")


def test_bad_field_type_is_named() -> None:
    with pytest.raises(ModelConfigError, match="'hidden_size' must be a non-negative integer"):
        spec_from_hf_config({**LLAMA_8B, "hidden_size": "4096"}, "broken")


def test_unknown_dtype_lists_the_known_ones() -> None:
    with pytest.raises(ModelConfigError, match=r"torch_dtype: unknown dtype 'int3'.*bf16"):
        spec_from_hf_config({**LLAMA_8B, "torch_dtype": "int3"}, "broken")


def test_unknown_model_lists_the_catalog() -> None:
    with pytest.raises(ModelConfigError, match="known: glm-5-fp8, qwen3-32b"):
        catalog.model("llama-9000")


def test_unreadable_config_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelConfigError, match="is not JSON"):
        catalog.model(str(path))
