"""docker/check-llama-cpp.sh, run here: on the installed llama_cpp, and on small llama_cpp packages
whose libraries are built with the C compiler to miss a library the way real images did."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.deploy_files import CHECK_SCRIPT

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc is not installed")


def check(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHON": sys.executable}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([shutil.which("bash"), str(CHECK_SCRIPT), *args], env=env,
                          capture_output=True, text=True, timeout=120)


def shared_library(path: Path, soname: str, *, needs: list[str] = (), search: list[Path] = ()) -> None:
    """A one-function shared library that depends on `needs` (found in `search` when linking)."""
    source = path.with_suffix(".c")
    source.write_text(f"int {path.stem.replace('-', '_').replace('.', '_')}_fn(void) {{ return 0; }}\n")
    link = [f"-L{d}" for d in search] + [f"-l:{n}" for n in needs]
    subprocess.run([GCC, "-shared", "-fPIC", "-o", str(path), str(source), f"-Wl,-soname,{soname}",
                    "-Wl,-rpath,$ORIGIN", "-Wl,--no-as-needed", *link], check=True, capture_output=True)
    source.unlink()


def fake_llama_cpp(root: Path, *, ggml_needs: list[str] = (), search: list[Path] = ()) -> Path:
    """root/llama_cpp: an __init__ that loads lib/libllama.so, as the real bindings do, and a lib/
    of libllama -> libggml -> libggml-base (+ ggml_needs) -> libggml-cpu, and libarbor-chat and libarbor-spec ->
    libllama-common -> libllama."""
    lib = root / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    shared_library(lib / "libggml-base.so", "libggml-base.so")
    shared_library(lib / "libggml-cpu.so", "libggml-cpu.so", needs=["libggml-base.so"], search=[lib])
    shared_library(lib / "libggml.so", "libggml.so", needs=["libggml-base.so", "libggml-cpu.so", *ggml_needs],
                   search=[lib, *search])
    shared_library(lib / "libllama.so", "libllama.so", needs=["libggml.so"], search=[lib])
    shared_library(lib / "libllama-common.so", "libllama-common.so", needs=["libllama.so"], search=[lib])
    for name in ("libarbor-chat.so", "libarbor-spec.so"):
        shared_library(lib / name, name, needs=["libllama-common.so", "libllama.so"], search=[lib])
    (root / "llama_cpp" / "__init__.py").write_text(
        "import ctypes, pathlib\n__version__ = '0.0-test'\n"
        "ctypes.CDLL(str(pathlib.Path(__file__).parent / 'lib' / 'libllama.so'))\n")
    return lib


def package_needing(tmp_path: Path, soname: str, *, kept_in: str) -> tuple[Path, Path]:
    """(site dir of a fake llama_cpp whose libggml.so needs `soname`, the directory holding that
    library outside llama_cpp/lib)."""
    outside = tmp_path / kept_in
    outside.mkdir()
    shared_library(outside / soname, soname)
    fake_llama_cpp(tmp_path / "site", ggml_needs=[soname], search=[outside])
    return tmp_path / "site", outside


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed here")
def test_passes_on_the_installed_llama_cpp_and_imports_the_server():
    done = check("--expect", "ggml-cpu", "server.api.app")
    assert done.returncode == 0, done.stderr
    assert "ok: llama_cpp" in done.stdout and "server.api.app" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp is not installed here")
def test_a_backend_library_that_was_not_copied_is_named():
    """pip's `ggml-can` typo: libggml-cann.so never reached llama_cpp/lib."""
    done = check("--expect", "ggml-cann")
    assert done.returncode == 1
    assert "has no libggml-cann.so" in done.stderr


@needs_gcc
def test_passes_on_a_complete_package(tmp_path):
    fake_llama_cpp(tmp_path)
    done = check("--expect", "ggml-cpu", pythonpath=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "ok: llama_cpp 0.0-test imports" in done.stdout


@needs_gcc
def test_a_library_that_is_not_found_fails_with_its_name(tmp_path):
    """libggml.so needs libggml-cann.so, which the build made but nobody copied."""
    site, _ = package_needing(tmp_path, "libggml-cann.so", kept_in="build")
    done = check(pythonpath=site)
    assert done.returncode == 1
    assert "not found: libggml.so needs libggml-cann.so" in done.stderr
    assert "ok:" not in done.stdout, "the import must not be attempted after ldd failed"


@needs_gcc
def test_a_driver_library_resolves_through_the_stubs_and_is_reported(tmp_path):
    site, stubs = package_needing(tmp_path, "libcuda.so.1", kept_in="stubs")
    without = check(pythonpath=site)
    assert without.returncode == 1 and "libggml.so needs libcuda.so.1" in without.stderr
    done = check("--stubs", str(stubs), pythonpath=site)
    assert done.returncode == 0, done.stderr
    assert "resolved through build-time stubs (the host driver provides them at run time): libcuda.so.1" in done.stdout


@needs_gcc
def test_an_import_that_fails_fails_the_check(tmp_path):
    fake_llama_cpp(tmp_path)
    done = check("no_such_module_for_arbor", pythonpath=tmp_path)
    assert done.returncode == 1
    assert "No module named 'no_such_module_for_arbor'" in done.stderr
    assert "import failed" in done.stderr


def test_missing_package_is_clear(tmp_path):
    """Python without site-packages (-S): no llama_cpp anywhere."""
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    bare.chmod(0o755)
    done = subprocess.run([shutil.which("bash"), str(CHECK_SCRIPT)],
                          env={"PATH": os.environ["PATH"], "PYTHON": str(bare)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"llama_cpp is not installed for {bare}" in done.stderr


@needs_gcc
def test_missing_stub_directory_is_clear(tmp_path):
    fake_llama_cpp(tmp_path)
    done = check("--stubs", str(tmp_path / "none"), pythonpath=tmp_path)
    assert done.returncode == 1
    assert f"stub directory {tmp_path / 'none'} does not exist" in done.stderr
