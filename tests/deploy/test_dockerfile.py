"""Structure of the Dockerfiles under docker/: one per image, their stages, base images, the
llama.cpp library check, users, build arguments and secrets. Parsed, no Docker engine needed."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import pytest

from tests.deploy.deploy_files import (
    DOCKERFILES,
    REPO,
    SERVER_BACKENDS,
    VARIANTS,
    arg_declarations,
    load_compose,
    parse_dockerfile,
    references,
    resolve_base,
)

PARSED = {name: parse_dockerfile(path) for name, path in DOCKERFILES.items()}
SERVERS = sorted(SERVER_BACKENDS)
CHECK = "/opt/arbor/check-llama-cpp.sh"
# Which backend a base image belongs to; images of no backend (python:...) suit every file.
FAMILIES = {"cuda": re.compile(r"(^|/)nvidia/cuda:"), "cann": re.compile(r"(^|/)ascend/|cann", re.I)}


def family(image: str) -> str | None:
    return next((name for name, pattern in FAMILIES.items() if pattern.search(image)), None)


def runtime(name: str):
    """The last stage: what a build of the file without --target produces."""
    return list(PARSED[name][1].values())[-1]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_one_backend_never_needs_another_backends_base_image(name):
    """The classic builder builds every stage of a file, --target or not: a file names only
    the base images of its own backend, so an offline Ascend host never pulls nvidia/cuda."""
    head, stages = PARSED[name]
    own = name.removeprefix("server-")
    for stage in stages.values():
        if stage.base in stages:
            continue
        got = family(resolve_base(stage.base, head))
        assert got in (None, own), f"{name}: stage {stage.name} is built FROM {stage.base}, a {got} image"
    if own in FAMILIES:
        assert any(family(resolve_base(s.base, head)) == own for s in stages.values())


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_every_stage_is_needed_by_the_last(name):
    """No stage the image does not use: the classic builder would build it anyway."""
    _, stages = PARSED[name]
    needed, todo = set(), [runtime(name).name]
    while todo:
        stage = stages[todo.pop()]
        needed.add(stage.name)
        parents = stage.copied_from | ({stage.base} & set(stages))
        todo += [p for p in parents if p not in needed]
    assert needed == set(stages), f"{name}: stages {set(stages) - needed} are built for nothing"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_builds_whole_files_without_targets(variant):
    for file in VARIANTS[variant]:
        for service in load_compose(file)["services"].values():
            build = service.get("build") or {}
            assert "target" not in build, f"{file}: a build target makes the classic builder build every stage"
            if "dockerfile" in build:
                assert (REPO / build["dockerfile"]).is_file(), build["dockerfile"]


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_runtime_stage_is_separate_and_runs_as_non_root(name):
    _, stages = PARSED[name]
    stage = runtime(name)
    assert "build" in stage.copied_from, f"{name}: the runtime stage does not copy its results from build"
    runs = stage.text("RUN")
    for tool in ("build-essential", "cmake", "pip install"):
        assert tool not in runs, f"runtime stage of {name} installs {tool!r}: do it in the build stage"
    user = stage.of("USER")[-1].value[0]
    assert user.split(":", 1)[0] not in ("0", "root"), f"{name} runs as {user}"
    assert stage.of("ENTRYPOINT") and stage.of("CMD")


@pytest.mark.parametrize("name", SERVERS)
def test_every_server_stage_checks_the_llama_libraries(name):
    """Build and runtime stage both run check-llama-cpp.sh (ldd of llama_cpp/lib/*.so and the
    import) expecting the backend's library; the build stage after building, the runtime stage
    also importing the server, with the driver stubs where the backend has a host driver."""
    _, stages = PARSED[name]
    backend = SERVER_BACKENDS[name]
    for stage in stages.values():
        runs = [" ".join(i.value) for i in stage.of("RUN")]
        checks = [i for i, run in enumerate(runs) if CHECK in run]
        assert checks, f"{name}: stage {stage.name} never runs {CHECK}"
        check = runs[checks[-1]]
        assert f"--expect {backend}" in check, f"{name}/{stage.name}: the check does not expect lib{backend}.so"
        if backend != "ggml-cpu":
            assert "--stubs /opt/arbor/build-stubs" in check
        builds = [i for i, run in enumerate(runs) if "build-llama-cpp.sh" in run]
        if builds:
            assert builds[0] <= checks[-1], f"{name}: the check runs before the libraries are built"
    assert "server.api.app" in " ".join(i for i in runtime(name).text("RUN").split("\n") if CHECK in i)


@pytest.mark.parametrize("name", SERVERS)
def test_llama_cpp_is_built_with_cmake_not_pips_library_list(name):
    """pip's own install list misses libggml-cann.so (the `ggml-can` typo in 0.3.36): every
    server builds the libraries with docker/build-llama-cpp.sh and never pip-installs the range."""
    build = PARSED[name][1]["build"]
    runs = build.text("RUN")
    assert 'build-llama-cpp.sh "$LLAMA_CPP_PYTHON_SPEC"' in runs
    assert not re.search(r"pip install[^\n]*LLAMA_CPP_PYTHON_SPEC", runs)
    assert all(references(runs, arg) for arg in ("TARGETARCH", "CPU_CMAKE_ARGS", "PIP_INDEX_URL"))


def test_accelerator_builds_enable_their_backend():
    cuda = PARSED["server-cuda"][1]["build"]
    assert "-DGGML_CUDA=ON" in cuda.text("RUN")
    assert "-DGGML_CUDA_NCCL=OFF" in cuda.text("RUN"), "NCCL found at build time would be missing at run time"
    cann = PARSED["server-cann"][1]["build"].text("RUN")
    assert "-DGGML_CANN=ON" in cann and '"-DSOC_TYPE=$SOC_TYPE"' in cann
    assert '. "$CANN_ENV"' in cann, "the CANN build must load the toolkit's set_env.sh"
    for name in ("server-cpu", "server-cuda"):
        assert "GGML_CANN" not in PARSED[name][1]["build"].text("RUN")


def test_cuda_build_hands_the_architecture_choice_and_the_toolkit_version_to_the_build_script():
    """'default' is real code per GPU generation, chosen by build-llama-cpp.sh from CUDA_VERSION
    (tests/deploy/test_build_script.py runs that choice); the Dockerfile passes both through."""
    head, stages = PARSED["server-cuda"]
    build = stages["build"]
    assert arg_declarations(build.instructions)["CUDA_ARCHITECTURES"] == "default"
    assert {"CUDA_VERSION", "CUDA_UBUNTU"} <= set(arg_declarations(head))
    run = next(r for r in build.text("RUN").split("\n") if "build-llama-cpp.sh" in r)
    assert 'CUDA_ARCHITECTURES="$CUDA_ARCHITECTURES"' in run and 'CUDA_VERSION="$CUDA_VERSION"' in run
    assert "CMAKE_CUDA_ARCHITECTURES" not in run
    for stage in stages.values():
        assert stage.base.endswith("-${CUDA_UBUNTU}"), "build and runtime images follow CUDA_UBUNTU"


@pytest.mark.parametrize("name", sorted(SERVER_BACKENDS))
def test_every_llama_cpp_build_takes_build_jobs(name):
    build = PARSED[name][1]["build"]
    assert "BUILD_JOBS" in arg_declarations(build.instructions)
    run = next(r for r in build.text("RUN").split("\n") if "build-llama-cpp.sh" in r)
    assert 'BUILD_JOBS="$BUILD_JOBS"' in run


def test_cuda_runtime_owns_the_jit_cache_directory_of_the_overlay():
    """A named volume copies the ownership of its mount point from the image: uid 10001 must own it."""
    cache = load_compose("compose.cuda.yaml")["services"]["server"]["environment"]["CUDA_CACHE_PATH"]
    runs = PARSED["server-cuda"][1]["server"].text("RUN")
    assert re.search(rf"mkdir -p [^\n]*{re.escape(cache)}", runs)
    assert re.search(rf"chown arbor:arbor [^\n]*{re.escape(cache)}", runs)


def test_cann_runtime_records_the_soc_it_was_built_for():
    """arbor-server checks the model's weight types against the SoC the backend was compiled for."""
    server = PARSED["server-cann"][1]["server"]
    assert "ARBOR_CANN_SOC_TYPE ${SOC_TYPE}" in server.text("ENV")
    assert arg_declarations(server.instructions)["SOC_TYPE"] == arg_declarations(
        PARSED["server-cann"][1]["build"].instructions)["SOC_TYPE"]


@pytest.mark.parametrize("version", ["ubuntu24.04", "ubuntu22.04"])
def test_install_python_picks_an_interpreter_of_at_least_3_11(tmp_path, version):
    """docker/install-python.sh against a fake apt-get and python3 of each Ubuntu release."""
    script = REPO / "docker" / "install-python.sh"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    distro_minor = {"ubuntu24.04": 12, "ubuntu22.04": 10}[version]
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> {tmp_path / "apt.log"}\n')
    (bin_dir / "python3").write_text(f"#!/bin/sh\nexit $(( {distro_minor} < 11 ))\n")
    (bin_dir / "python3.11").write_text("#!/bin/sh\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    done = subprocess.run([shutil.which("bash"), str(script), "--dev"], env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = "python3" if distro_minor >= 11 else "python3.11"
    assert done.stdout == f"{bin_dir / expected}\n", "stdout holds only the interpreter's path"
    assert f"install -y --no-install-recommends {expected}-venv {expected}-dev" in (tmp_path / "apt.log").read_text()


@pytest.mark.parametrize(("soc", "graph"), [("Ascend910B3", "ON"), ("Ascend910B4", "ON"), ("Ascend310P3", "OFF")])
def test_cann_acl_graph_follows_the_soc(soc, graph):
    """Upstream builds 910B with -DUSE_ACL_GRAPH=ON; ggml refuses it for 310P."""
    run = next(r for r in PARSED["server-cann"][1]["build"].text("RUN").split("\n") if "USE_ACL_GRAPH" in r)
    case = re.search(r"case .*? esac", run).group(0)
    done = subprocess.run([shutil.which("bash"), "-c", f'{case}; printf %s "$acl_graph"'],
                          env={"SOC_TYPE": soc}, capture_output=True, text=True, check=True)
    assert done.stdout == graph
    assert '"-DUSE_ACL_GRAPH=$acl_graph"' in run


def test_no_amx_or_native_anywhere():
    for path in [*DOCKERFILES.values(), REPO / "docker" / "build-llama-cpp.sh"]:
        text = path.read_text()
        assert not re.search(r"GGML_AMX\w*=ON", text, re.I), path.name
        assert not re.search(r"GGML_NATIVE=ON", text, re.I), path.name


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_every_declared_arg_is_used(name):
    head, stages = PARSED[name]
    for arg in arg_declarations(head):
        assert any(references(stage.base, arg) for stage in stages.values()), f"{name}: global ARG {arg} unused"
    for stage in stages.values():
        rest = "\n".join(" ".join(i.value) for i in stage.instructions if i.cmd != "ARG")
        for arg in arg_declarations(stage.instructions):
            assert references(rest, arg), f"{name}: ARG {arg} of stage {stage.name} is never used"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_compose_build_args_are_declared_by_the_dockerfile_they_reach(variant):
    services: dict[str, dict] = {}
    for file in VARIANTS[variant]:
        for name, service in load_compose(file)["services"].items():
            build = services.setdefault(name, {})
            build.setdefault("args", {}).update((service.get("build") or {}).get("args", {}))
            build.update({k: v for k, v in (service.get("build") or {}).items() if k != "args"})
    for name, build in services.items():
        head, stages = PARSED[build["dockerfile"].removeprefix("docker/").removesuffix(".Dockerfile")]
        declared = set(arg_declarations(head)).union(*(arg_declarations(s.instructions) for s in stages.values()))
        for arg in build["args"]:
            assert arg in declared, \
                f"{variant}/{name} passes build arg {arg}, which {build['dockerfile']} never declares"


def test_llama_cpp_python_range_matches_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = next(d for d in deps if d.startswith("llama-cpp-python"))
    for name in SERVERS:
        assert arg_declarations(PARSED[name][1]["build"].instructions)["LLAMA_CPP_PYTHON_SPEC"] == wanted


def test_no_secrets_in_image_instructions():
    secret = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.I)
    for name, (_, stages) in PARSED.items():
        for stage in stages.values():
            for arg in arg_declarations(stage.instructions):
                assert not secret.search(arg), f"{name}: build arg {arg} would be recorded in the image history"
            for inst in stage.of("ENV") + stage.of("LABEL"):
                for item in inst.value:
                    assert not secret.search(item), f"{name}/{stage.name}: {inst.cmd} {item}"
    ignore = (REPO / ".dockerignore").read_text().split()
    assert "**/.env" in ignore, ".env (which may hold ARBOR_API_KEY) must stay out of the build context"
    assert "**/*.gguf" in ignore, "weights must stay out of the build context"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_files_copied_from_the_context_are_not_ignored(name):
    """A COPY of a path .dockerignore excludes fails the build ("no such file")."""
    patterns = [p for p in (REPO / ".dockerignore").read_text().split("\n") if p and not p.startswith("#")]
    for stage in PARSED[name][1].values():
        for inst in stage.of("COPY"):
            if any(f.startswith("--from=") for f in inst.flags):
                continue
            for source in inst.value[:-1]:
                if source == ".":
                    continue
                assert (REPO / source).exists(), f"{name}: COPY {source}: no such file"
                parts = source.split("/")
                # Docker's rule: the last pattern that matches decides; '!' re-includes
                excluded_by = None
                for pattern in patterns:
                    keep = pattern.startswith("!")
                    bare = pattern.removeprefix("!").removeprefix("**/")
                    hit = any(re.fullmatch(bare.replace(".", r"\.").replace("*", "[^/]*"), "/".join(parts[:i]))
                              for i in range(1, len(parts) + 1))
                    if hit:
                        excluded_by = None if keep else pattern
                assert excluded_by is None, f"{name}: COPY {source}, but .dockerignore excludes it ({excluded_by})"
