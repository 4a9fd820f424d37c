"""The prepared device run (bench/device_suite.sh, issue 57): every KV layout of arbor-server beside llama-server's two
in one call; the agent step imports nothing of the workbench; the results come back as at most eight files and one
command puts them where docs/benchmarks.md reads them."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from bench.device_results import unpack
from bench.engine_throughput import llama_split_ratio, server_configs

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "bench" / "device_suite.sh"


def args(**kw) -> argparse.Namespace:
    base = {"parallel": 4, "ctx_size": 8192, "arbor_no_cache": False, "n_gpu_layers": 0, "threads": 1,
            "arbor_unpaged": False, "arbor_paged": False, "arbor_shared_pages": False, "arbor_decode_threads": None,
            "arbor_stream_interval_ms": None, "arbor_src": None, "arbor_lib": None, "no_llama_server": False,
            "arbor_layouts": None}
    return argparse.Namespace(**{**base, **kw})


def test_each_layout_named_is_one_arbor_server_beside_llama_servers_two():
    configs = {name: extra for name, _, extra, *_ in server_configs(args(arbor_layouts="unified,split"),
                                                                    "/bin/llama-server")}
    assert list(configs) == ["arbor-server --kv-layout unified", "arbor-server --kv-layout split",
                             "llama-server --kv-unified", "llama-server (split KV)"]
    unified, split = configs["arbor-server --kv-layout unified"], configs["arbor-server --kv-layout split"]
    assert unified[-2:] == ["--kv-layout", "unified"] and split[-2:] == ["--kv-layout", "split"]
    assert unified[:-2] == split[:-2]  # the same settings otherwise
    names = [name for name, *_ in server_configs(args(arbor_layouts="auto,split"), None)]
    assert names == ["arbor-server", "arbor-server --kv-layout split"]


def test_every_arbor_row_is_put_beside_llama_servers_split_kv():
    def run(name, kind, tok_s, ttft):
        return {"name": name, "kind": kind, "levels": [{"concurrency": 8, "decode_tok_s": tok_s, "ttft_mean_s": ttft}]}

    runs = [run("arbor-server --kv-layout split", "arbor", 300.0, 2.0), run("llama-server (split KV)", "llama",
                                                                            250.0, 4.0)]
    assert llama_split_ratio(runs) == {"arbor-server --kv-layout split": {8: {"decode": 1.2, "ttft": 0.5}}}
    assert llama_split_ratio(runs[:1]) == {}


def test_the_agent_step_imports_nothing_of_the_workbench():
    """A GPU host has no LangChain, LangGraph or SQLModel: the agent workload is the harness's, its replay shows no
    progress bar (tqdm), and bench.run_all imports the story writer's workload (app/) only when it is asked for."""
    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in ('langchain_core', 'langgraph', 'langchain', 'sqlmodel', 'sqlalchemy', 'tqdm', 'app'):
            raise ImportError('not on the host: ' + name)
sys.meta_path.insert(0, Block())
import bench.run_all, bench.engine_throughput, bench.report
from harness.serving.runner import _progress
_progress(3, False).update(1)
print(sorted(bench.run_all.workloads(True, True, {'agent_branches'})))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "agent_branches" in out.stdout and "story_writer" not in out.stdout


def test_the_suite_runs_every_layout_and_the_agent_workload_in_one_call():
    text = SUITE.read_text()
    assert "--arbor-layouts unified,split" in text  # the seed's shape and decode at 1/4/16 streams
    assert "--only agent_branches" in text and "'arbor A,S,H unified' 'arbor A,S,H split'" in text
    assert "'llama-server -np 4 (split KV)' 'llama-server -np 4 --kv-unified'" in text
    assert "DEADLINE_S=${DEADLINE_S:-480}" in text  # within a 10-minute call, with the install before it
    assert "langchain" not in text.split("missing=")[1].split("\n\n")[0]  # the import check asks none of the workbench
    subprocess.run(["bash", "-n", str(SUITE)], check=True)


def test_a_device_runs_results_go_where_the_report_reads_them(tmp_path: Path):
    tgz = tmp_path / "results.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for name, body in {"results/seed_shape_gpu.json": b"{}", "results/run_all/index.json": json.dumps({}).encode(),
                           "elsewhere.txt": b"x", "results/../escape.txt": b"x"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    dest = tmp_path / "bench" / "results" / "device"
    dest.mkdir(parents=True)
    (dest / "README.md").write_text("what ran where")
    (dest / "old.json").write_text("{}")
    names = unpack(tgz, dest)
    assert sorted(names) == ["run_all/index.json", "seed_shape_gpu.json"]
    assert sorted(p.name for p in dest.iterdir()) == ["README.md", "run_all", "seed_shape_gpu.json"]
    assert (dest / "README.md").read_text() == "what ran where" and not (tmp_path / "bench" / "escape.txt").exists()
