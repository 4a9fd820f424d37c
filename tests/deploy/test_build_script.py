"""docker/build-llama-cpp.sh: the CMake arguments it chooses (its --dry-run), run here for real."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.deploy.deploy_files import BUILD_SCRIPT

SPEC = "llama-cpp-python==0.3.36"


def configure(*args: str, **env: str) -> list[str]:
    done = subprocess.run([shutil.which("bash"), str(BUILD_SCRIPT), "--dry-run", SPEC, *args],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("arch", ["amd64", "x86_64"])
def test_x86_64_gets_explicit_instruction_sets_never_amx_or_native(arch):
    flags = configure(TARGETARCH=arch)
    assert "-DGGML_NATIVE=OFF" in flags
    for isa in ("AVX", "AVX2", "FMA", "F16C", "BMI2"):
        assert f"-DGGML_{isa}=ON" in flags
    for off in ("AVX512", "AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{off}=OFF" in flags


@pytest.mark.parametrize("arch", ["arm64", "aarch64"])
def test_arm64_gets_the_generic_baseline(arch):
    flags = configure(TARGETARCH=arch)
    assert "-DGGML_NATIVE=OFF" in flags
    assert not [f for f in flags if f.startswith("-DGGML_AVX")]


def test_cpu_flags_can_be_replaced_and_backend_flags_come_last():
    flags = configure("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=75;86",
                      TARGETARCH="arm64", CPU_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod")
    assert flags[-4:] == ["-DGGML_NATIVE=OFF", "-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod",
                          "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=75;86"]


def test_shared_libraries_that_find_each_other_and_nothing_else():
    flags = configure(TARGETARCH="amd64")
    assert "-DBUILD_SHARED_LIBS=ON" in flags
    assert "-DCMAKE_INSTALL_RPATH=$ORIGIN" in flags and "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON" in flags
    for off in ("LLAMA_CURL", "LLAMA_OPENSSL", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_TOOLS", "LLAMA_BUILD_SERVER"):
        assert f"-D{off}=OFF" in flags, "nothing the server does not load, and no network at configure time"


def test_unknown_architecture_is_refused():
    done = subprocess.run([shutil.which("bash"), str(BUILD_SCRIPT), "--dry-run", SPEC],
                          env={"PATH": "/usr/bin:/bin", "TARGETARCH": "s390x"}, capture_output=True, text=True)
    assert done.returncode == 1
    assert "unsupported architecture s390x" in done.stderr


def test_a_spec_other_than_the_patched_pin_is_refused():
    """The image must build the release the patches are for, never a range."""
    done = subprocess.run([shutil.which("bash"), str(BUILD_SCRIPT), "llama-cpp-python>=0.3.36,<0.4"],
                          env={"PATH": "/usr/bin:/bin", "TARGETARCH": "amd64"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "the patches are for 'llama-cpp-python==0.3.36'" in done.stderr


def cuda_architectures(**env: str) -> str:
    flags = configure("-DGGML_CUDA=ON", TARGETARCH="amd64", **env)
    arch = [f for f in flags if f.startswith("-DCMAKE_CUDA_ARCHITECTURES=")]
    return arch[0].split("=", 1)[1] if arch else ""


@pytest.mark.parametrize(("version", "expected"), [
    ("12.6.3", "70-real;75-real;80-real;86-real;89-real;90-real;90-virtual"),
    ("12.2.2", "70-real;75-real;80-real;86-real;89-real;90-real;90-virtual"),
    ("12.8.1", "70-real;75-real;80-real;86-real;89-real;90-real;100-real;120a-real;120-virtual"),
    ("13.0.1", "75-real;80-real;86-real;89-real;90-real;100-real;120a-real;120-virtual"),
])
def test_cuda_default_is_real_code_for_every_datacentre_gpu_the_toolkit_has(version, expected):
    """SASS for V100..H200 (B200/RTX 50 from 12.8, no Volta in CUDA 13): no JIT of PTX on those GPUs."""
    assert cuda_architectures(CUDA_VERSION=version) == expected


def test_cuda_architectures_can_be_one_gpu_or_ggmls_own_list():
    assert cuda_architectures(CUDA_VERSION="12.6.3", CUDA_ARCHITECTURES="89") == "89"
    assert cuda_architectures(CUDA_VERSION="12.6.3", CUDA_ARCHITECTURES="ggml") == ""
    assert configure("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=75", TARGETARCH="amd64",
                     CUDA_VERSION="12.6.3").count("-DCMAKE_CUDA_ARCHITECTURES=75") == 1
    assert "CUDA" not in " ".join(configure(TARGETARCH="amd64", CUDA_VERSION="12.6.3")), "CPU builds get no CUDA flag"


@pytest.mark.parametrize("version", ["", "twelve", "12"])
def test_cuda_default_without_a_readable_version_is_refused(version):
    done = subprocess.run([shutil.which("bash"), str(BUILD_SCRIPT), "--dry-run", SPEC, "-DGGML_CUDA=ON"],
                          env={"PATH": "/usr/bin:/bin", "TARGETARCH": "amd64", "CUDA_VERSION": version},
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "CUDA_ARCHITECTURES=default needs CUDA_VERSION" in done.stderr


@pytest.mark.parametrize("jobs", ["0", "four", "-2"])
def test_build_jobs_must_be_a_positive_number(jobs):
    done = subprocess.run([shutil.which("bash"), str(BUILD_SCRIPT), "--dry-run", SPEC],
                          env={"PATH": "/usr/bin:/bin", "TARGETARCH": "amd64", "BUILD_JOBS": jobs},
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert f"BUILD_JOBS must be a positive number of jobs, got '{jobs}'" in done.stderr
    assert configure(TARGETARCH="amd64", BUILD_JOBS="4")  # a number is accepted
