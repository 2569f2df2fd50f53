"""launcher.runs_per_gpu: runs share a GPU only where their estimated memory need fits it."""

from __future__ import annotations

import pytest

from cart_sweeps.compose import compose_config
from cart_sweeps.config import ConfigError
from cart_sweeps.sweep.cost import GIB, memory_need_bytes
from cart_sweeps.sweep.pools.local import check_packing


def test_paper_runs_need_gigabytes_and_tiny_runs_little():
    paper = memory_need_bytes(compose_config(["model.d_model=1024"]))  # 8 x 1,024 tokens, V=32,000
    tiny = memory_need_bytes(compose_config(["scale=tiny"]))
    assert 4 * GIB < paper < 24 * GIB  # it trained on the paper's 24 GiB RTX 3090
    assert tiny < 1.1 * GIB  # the CUDA overhead, nearly all of it


def test_packing_beyond_the_gpus_memory_is_one_clear_error():
    need = memory_need_bytes(compose_config(["model.d_model=1024"]))
    check_packing(2, need, 141 * GIB)  # two paper-scale runs on one H200
    check_packing(4, need, None)  # no nvidia-smi: nothing to check against
    with pytest.raises(ConfigError, match="lower launcher.runs_per_gpu"):
        check_packing(4, need, 24 * GIB)
