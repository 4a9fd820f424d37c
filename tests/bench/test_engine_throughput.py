"""bench/engine_throughput.py's server list: every server gets the same settings, the variants only theirs."""

from __future__ import annotations

import argparse

import pytest

from bench.engine_throughput import server_configs


def args(**kw) -> argparse.Namespace:
    base = {"parallel": 4, "ctx_size": 8192, "arbor_no_cache": False, "n_gpu_layers": 0, "threads": 1,
            "arbor_unpaged": False, "arbor_paged": False, "arbor_shared_pages": False, "arbor_decode_threads": None,
            "arbor_stream_interval_ms": None, "arbor_src": None, "arbor_lib": None,
            "no_llama_server": False}
    return argparse.Namespace(**{**base, **kw})


def test_the_decode_threads_variant_differs_from_arbor_by_its_thread_flags_alone():
    configs = {name: extra for name, _, extra, *_ in server_configs(args(threads=2, arbor_decode_threads=1),
                                                                    "/bin/llama-server")}
    assert set(configs) == {"arbor-server", "arbor-server -t 1 -tb 2", "llama-server --kv-unified",
                            "llama-server (split KV)"}
    arbor, variant = configs["arbor-server"], configs["arbor-server -t 1 -tb 2"]
    i = arbor.index("--threads")
    assert arbor[i:i + 2] == ["--threads", "2"] and variant[i:i + 4] == ["--threads", "1", "--threads-batch", "2"]
    assert variant[:i] + variant[i + 4:] == arbor[:i] + arbor[i + 2:]
    assert configs["llama-server (split KV)"][-3:] == ["-t", "2", "--no-kv-unified"]  # llama-server: --threads


def test_decode_threads_need_the_threads_of_the_other_steps():
    with pytest.raises(SystemExit, match="needs --threads"):
        server_configs(args(threads=None, arbor_decode_threads=1), None)


def test_without_variants_arbor_runs_once():
    names = [name for name, *_ in server_configs(args(), None)]
    assert names == ["arbor-server"]


def test_the_shared_pages_variant_adds_the_placement_alone():
    configs = {name: extra for name, _, extra, *_ in server_configs(args(arbor_shared_pages=True), None)}
    assert set(configs) == {"arbor-server", "arbor-server --page-placement shared"}
    assert configs["arbor-server --page-placement shared"] == configs["arbor-server"] + ["--page-placement", "shared"]


def test_the_stream_interval_variant_adds_its_flag_alone():
    configs = {name: extra for name, _, extra, *_ in server_configs(args(arbor_stream_interval_ms=0.0), None)}
    assert set(configs) == {"arbor-server", "arbor-server --stream-interval-ms 0"}
    assert configs["arbor-server --stream-interval-ms 0"] == configs["arbor-server"] + ["--stream-interval-ms", "0"]


def test_the_library_variant_differs_from_arbor_by_its_environment_alone(tmp_path):
    configs = {name: (extra, env) for name, _, extra, _, env in server_configs(args(arbor_lib=tmp_path), None)}
    assert set(configs) == {"arbor-server", f"arbor-server (lib {tmp_path})"}
    variant = configs[f"arbor-server (lib {tmp_path})"]
    assert variant == (configs["arbor-server"][0], {"LLAMA_CPP_LIB_PATH": str(tmp_path.resolve())})
    assert configs["arbor-server"][1] == {}


def test_the_paged_and_unpaged_variants_differ_from_arbor_by_their_paged_attn_flag_alone():
    configs = {name: extra for name, _, extra, *_ in server_configs(args(arbor_paged=True, arbor_unpaged=True), None)}
    arbor = configs["arbor-server"]
    assert "--paged-attn" not in arbor  # the default: auto
    assert configs["arbor-server --paged-attn on"] == arbor + ["--paged-attn", "on"]
    assert configs["arbor-server --paged-attn off"] == arbor + ["--paged-attn", "off"]
