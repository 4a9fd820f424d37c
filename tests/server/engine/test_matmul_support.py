"""matmul_support: the weight types each backend multiplies, per the vendored ggml sources."""

from __future__ import annotations

from server.engine.matmul_support import cann_family, needed_types, unsupported
from server.engine.model_weights import WeightTensor


def weights(*types: str, expert: bool = False) -> list[WeightTensor]:
    suffix = "_exps.weight" if expert else ".weight"
    return [WeightTensor(f"blk.{i}.ffn_up{suffix}", t) for i, t in enumerate(types)]


def test_cann_910b_multiplies_q8_0_q4_0_and_floats_only():
    assert unsupported("CANN", "Ascend910B3", weights("Q8_0", "Q4_0", "F16", "BF16", "F32")) == {}
    assert unsupported("CANN", "Ascend910B3", weights("Q4_K", "Q4_K", "Q6_K", "Q8_0")) == {"Q4_K": 2, "Q6_K": 1}


def test_cann_310p_multiplies_f16_and_f32_only():
    assert cann_family("Ascend310P3") == "310P" and cann_family("Ascend910B4") == "910B"
    assert unsupported("CANN", "Ascend310P3", weights("F16", "F32")) == {}
    assert unsupported("CANN", "Ascend310P3", weights("Q8_0", "Q4_0", "BF16")) == {"Q8_0": 1, "Q4_0": 1, "BF16": 1}
    assert needed_types("CANN", "Ascend310P3") == ["F16", "F32"]


def test_cann_expert_matmuls_have_no_bf16_case():
    assert unsupported("CANN", "Ascend910B3", weights("BF16")) == {}
    assert unsupported("CANN", "Ascend910B3", weights("BF16", expert=True)) == {"BF16": 1}
    assert needed_types("CANN", "Ascend910B3") == ["F16", "F32", "Q4_0", "Q8_0"]


def test_cuda_multiplies_the_k_quants():
    assert unsupported("CUDA", None, weights("Q4_K", "Q6_K", "IQ4_XS", "Q8_0", "BF16")) == {}


def test_a_backend_without_a_table_claims_nothing():
    assert unsupported("Vulkan", None, weights("Q4_K")) is None
    assert needed_types("Vulkan", None) == []
