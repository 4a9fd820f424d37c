"""bench/fa_kernel.py at a size that runs in seconds: in one process (paged against unpaged) and across
two library folders (here the same one twice, each in a subprocess): the file holds what it measured."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (run scripts/setup.sh)")


def paged_op_or_skip() -> None:
    from bench.ggml_fa import has_paged_op

    if not has_paged_op():
        pytest.skip("llama-cpp-python was built without Arbor's paged attention patch")


def test_one_library_paged_against_unpaged(tmp_path):
    paged_op_or_skip()
    from bench import fa_kernel

    out = tmp_path / "fa.json"
    fa_kernel.main(["--shapes", "1", "--iters", "2", "--rounds", "2", "--out", str(out), "--quiet"])
    got = json.loads(out.read_text())
    name = fa_kernel.SHAPES[1].name
    assert [s["name"] for s in got["shapes"]] == [name]
    assert len(got["rounds"]) == 2 and all(r[name]["paged_ms"] > 0 and r[name]["unpaged_ms"] > 0
                                           for r in got["rounds"])
    ratios = sorted(r[name]["paged_ms"] / r[name]["unpaged_ms"] for r in got["rounds"])
    assert got["paged_over_unpaged"][name] == pytest.approx(sum(ratios) / 2)


def test_two_library_folders_in_turns(tmp_path):
    paged_op_or_skip()
    from bench import fa_kernel
    from bench.ggml_fa import _lib_dir

    lib = _lib_dir()
    other = tmp_path / "other-build"  # a second folder: links to the same libraries
    other.mkdir()
    for f in lib.iterdir():
        (other / f.name).symlink_to(f.resolve())
    out = tmp_path / "fa.json"
    fa_kernel.main(["--libs", f"{lib},{other}", "--shapes", "1", "--iters", "2", "--rounds", "2", "--out", str(out),
                    "--quiet"])
    got = json.loads(out.read_text())
    name = fa_kernel.SHAPES[1].name
    assert got["libs"] == [str(lib), str(other)]
    assert all(len(got["rounds"][d]) == 2 and got["rounds"][d][1][name]["paged_ms"] > 0 for d in got["libs"])
    ratios = sorted(got["rounds"][str(other)][i][name]["paged_ms"] / got["rounds"][str(lib)][i][name]["paged_ms"]
                    for i in range(2))
    assert got["paged_over_base_lib"][str(other)][name] == pytest.approx(sum(ratios) / 2)


def test_a_folder_named_twice_is_refused(tmp_path):
    from bench import fa_kernel

    with pytest.raises(SystemExit, match="twice"):
        fa_kernel.main(["--libs", "/x,/x", "--out", str(tmp_path / "fa.json")])
