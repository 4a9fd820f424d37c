"""Structure of the Dockerfile: targets, stages, flags, users, build arguments, secrets."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.deploy.deploy_files import REPO, VARIANTS, arg_declarations, load_compose, parse_dockerfile, references

HEAD, STAGES = parse_dockerfile()
RUNTIME_TARGETS = ["server-cpu", "server-cuda", "server-cann", "workbench"]
BUILD_STAGE_OF = {
    "server-cpu": "build-cpu",
    "server-cuda": "build-cuda",
    "server-cann": "build-cann",
    "workbench": "build-workbench",
}
SERVER_BUILD_STAGES = ["build-cpu", "build-cuda", "build-cann"]


@pytest.mark.parametrize("target", RUNTIME_TARGETS)
def test_target_exists_and_is_a_separate_runtime_stage(target):
    stage = STAGES[target]
    build = BUILD_STAGE_OF[target]
    assert build in STAGES, f"{target} has no build stage {build}"
    assert build in stage.copied_from, f"{target} does not copy its results from {build}"
    runs = stage.text("RUN")
    for tool in ("build-essential", "cmake", "pip install"):
        assert tool not in runs, f"runtime stage {target} installs {tool!r}: build it in {build} instead"


@pytest.mark.parametrize("target", RUNTIME_TARGETS)
def test_runtime_stage_runs_as_non_root(target):
    users = STAGES[target].of("USER")
    assert users, f"{target} sets no USER, so it runs as root"
    user = users[-1].value[0]
    name = user.split(":", 1)[0]
    assert name not in ("0", "root"), f"{target} runs as {user}"
    assert STAGES[target].of("ENTRYPOINT") or STAGES[target].of("CMD")


@pytest.mark.parametrize("stage", SERVER_BUILD_STAGES)
def test_server_build_never_enables_amx_or_native(stage):
    args = arg_declarations(STAGES[stage].instructions)
    amd64 = args["CPU_CMAKE_ARGS_AMD64"]
    assert "-DGGML_NATIVE=OFF" in amd64
    for flag in ("AVX", "AVX2", "FMA", "F16C", "BMI2"):
        assert f"-DGGML_{flag}=ON" in amd64
    for amx in ("AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{amx}=OFF" in amd64
    assert "-DGGML_NATIVE=OFF" in args["CPU_CMAKE_ARGS_ARM64"]
    runs = STAGES[stage].text("RUN")
    assert 'CPU_CMAKE_ARGS_AMD64' in runs and "CMAKE_ARGS=" in runs


def test_no_amx_or_native_anywhere():
    text = (REPO / "Dockerfile").read_text()
    assert not re.search(r"GGML_AMX\w*=ON", text, re.I)
    assert not re.search(r"GGML_NATIVE=ON", text, re.I)


def test_accelerator_builds_enable_their_backend():
    assert "-DGGML_CUDA=on" in STAGES["build-cuda"].text("RUN")
    cann = STAGES["build-cann"]
    runs = cann.text("RUN")
    assert "-DGGML_CANN=on" in runs
    assert '. "$CANN_ENV"' in runs, "the CANN build must load the toolkit's set_env.sh"
    assert "-DSOC_TYPE=$SOC_TYPE" in runs
    assert cann.base == "${CANN_BASE_IMAGE}" and STAGES["server-cann"].base == "${CANN_BASE_IMAGE}"
    assert "GGML_CANN" not in STAGES["build-cpu"].text("RUN") + STAGES["build-cuda"].text("RUN")


def test_every_declared_arg_is_used():
    for name in arg_declarations(HEAD):
        assert any(references(stage.base, name) for stage in STAGES.values()), f"global ARG {name} unused"
    for stage in STAGES.values():
        declared = arg_declarations(stage.instructions)
        rest = "\n".join(" ".join(i.value) for i in stage.instructions if i.cmd != "ARG")
        for name in declared:
            assert references(rest, name), f"ARG {name} of stage {stage.name} is never used"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_build_args_are_declared(variant):
    declared = set(arg_declarations(HEAD))
    for stage in STAGES.values():
        declared |= set(arg_declarations(stage.instructions))
    for name in VARIANTS[variant]:
        for service in load_compose(name)["services"].values():
            for arg in (service.get("build") or {}).get("args", {}):
                assert arg in declared, f"{name} passes build arg {arg}, which the Dockerfile never declares"


def test_llama_cpp_python_range_matches_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = next(d for d in deps if d.startswith("llama-cpp-python"))
    for stage in SERVER_BUILD_STAGES:
        assert arg_declarations(STAGES[stage].instructions)["LLAMA_CPP_PYTHON_SPEC"] == wanted


def test_no_secrets_in_image_instructions():
    secret = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
    for stage in STAGES.values():
        for name in arg_declarations(stage.instructions):
            assert not secret.search(name), f"build arg {name} would be recorded in the image history"
        for inst in stage.of("ENV") + stage.of("LABEL"):
            for item in inst.value:
                assert not secret.search(item), f"{stage.name}: {inst.cmd} {item}"
    ignore = (REPO / ".dockerignore").read_text().split()
    assert "**/.env" in ignore, ".env (which may hold ARBOR_API_KEY) must stay out of the build context"
    assert "**/*.gguf" in ignore, "weights must stay out of the build context"


def test_requirements_step_drops_llama_cpp_python_only(tmp_path):
    """Runs the `files` stage's requirements command on the real pyproject.toml."""
    run = next(" ".join(i.value) for i in STAGES["files"].of("RUN") if "requirements.txt" in " ".join(i.value))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    bash = shutil.which("bash")
    subprocess.run([bash, "-c", run.replace("python -c", f"{shutil.which('python')} -c", 1)], cwd=tmp_path, check=True)
    got = (tmp_path / "requirements.txt").read_text().split("\n")
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in got if d] == [d for d in deps if not d.startswith("llama-cpp-python")]
