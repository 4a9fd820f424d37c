"""Readers for the deployment files, shared by the tests in tests/deploy.

The Dockerfiles are parsed with the `dockerfile` package (BuildKit's own Go parser), the compose
files with PyYAML; nothing here needs a Docker engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER_DIR = REPO / "docker"
ENV_EXAMPLE = REPO / ".env.example"
VERIFY_SCRIPT = REPO / "scripts" / "verify_deploy.sh"
BUILD_SCRIPT = DOCKER_DIR / "build-llama-cpp.sh"
CHECK_SCRIPT = DOCKER_DIR / "check-llama-cpp.sh"
ENTRYPOINT_SCRIPT = DOCKER_DIR / "entrypoint.sh"

# One Dockerfile per image (docs/deploy.md: the classic builder builds every stage of a file).
DOCKERFILES: dict[str, Path] = {
    name: DOCKER_DIR / f"{name}.Dockerfile" for name in ("server-cpu", "server-cuda", "server-cann", "workbench")
}
# Server Dockerfile -> the ggml backend library its llama_cpp/lib must hold.
SERVER_BACKENDS = {"server-cpu": "ggml-cpu", "server-cuda": "ggml-cuda", "server-cann": "ggml-cann"}

# Backend variant -> the compose files that make it (COMPOSE_FILE in .env, ':'-separated).
VARIANTS: dict[str, list[str]] = {
    "cpu": ["compose.yaml"],
    "cuda": ["compose.yaml", "compose.cuda.yaml"],
    "cann": ["compose.yaml", "compose.cann.yaml"],
    "cann-2npu": ["compose.yaml", "compose.cann.yaml", "compose.cann-2npu.yaml"],
}
# Variant -> the Dockerfile its server is built from, and the image tag.
SERVER_DOCKERFILES = {
    "cpu": "docker/server-cpu.Dockerfile",
    "cuda": "docker/server-cuda.Dockerfile",
    "cann": "docker/server-cann.Dockerfile",
    "cann-2npu": "docker/server-cann.Dockerfile",
}
SERVER_IMAGES = {"cpu": "arbor-server:cpu", "cuda": "arbor-server:cuda", "cann": "arbor-server:cann",
                 "cann-2npu": "arbor-server:cann"}
# What a user fills in for the settings .env.example leaves empty on purpose (they are required).
REQUIRED_SAMPLES = {
    "MODEL_DIR": "/srv/models",
    "MODEL_FILE": "Qwen3-8B-Q8_0.gguf",
    "ASCEND_DEVICE_GID": "1000",
    "NPU_DEVICE_2": "/dev/davinci1",
}

# `${NAME}`, `${NAME:-default}`, `${NAME:?message}` ... as compose interpolates them.
_COMPOSE_VAR = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
# `$NAME` or `${NAME...}` as the Dockerfile and the shell reference variables.
_SHELL_VAR = r"\$(?:\{{{name}\b|{name}\b)"


def load_compose(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())


def compose_text(name: str) -> str:
    return (REPO / name).read_text()


def compose_variables(text: str) -> list[tuple[str, str | None, str | None]]:
    """(name, operator, operand) of every interpolation in a compose file (comments excluded)."""
    body = "\n".join(line.split(" #", 1)[0] for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [(m.group(1), m.group(2), m.group(3)) for m in _COMPOSE_VAR.finditer(body)]


def env_example_filled() -> dict[str, str]:
    """.env.example with the required settings filled in, as a user's .env would be."""
    return env_example() | REQUIRED_SAMPLES


def env_example() -> dict[str, str]:
    """KEY -> value of the uncommented lines of .env.example."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: not a KEY=value line: {line!r}"
            values[key.strip()] = value
    return values


def references(text: str, name: str) -> bool:
    """Whether `text` references variable `name` as $name or ${name...}."""
    return re.search(_SHELL_VAR.format(name=re.escape(name)), text) is not None


@dataclass
class Stage:
    """One FROM ... AS name section of the Dockerfile."""

    name: str
    base: str
    instructions: list[dockerfile.Command] = field(default_factory=list)

    def of(self, cmd: str) -> list[dockerfile.Command]:
        return [i for i in self.instructions if i.cmd == cmd.upper()]

    def text(self, cmd: str) -> str:
        """All values of one instruction kind, joined (e.g. every RUN's shell command)."""
        return "\n".join(" ".join(i.value) for i in self.of(cmd))

    @property
    def copied_from(self) -> set[str]:
        return {f.split("=", 1)[1] for i in self.of("COPY") for f in i.flags if f.startswith("--from=")}


def parse_dockerfile(path: Path) -> tuple[list[dockerfile.Command], dict[str, Stage]]:
    """(global instructions before the first FROM, stages by name in file order)."""
    head: list[dockerfile.Command] = []
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for inst in dockerfile.parse_file(str(path)):
        if inst.cmd == "FROM":
            value = list(inst.value)
            assert len(value) == 3 and value[1].upper() == "AS", f"{path.name}: unnamed stage at line {inst.start_line}"
            current = Stage(name=value[2], base=value[0])
            stages[current.name] = current
        elif current is None:
            head.append(inst)
        else:
            current.instructions.append(inst)
    return head, stages


def arg_declarations(instructions: list[dockerfile.Command]) -> dict[str, str | None]:
    """ARG name -> default (None when declared without one)."""
    out: dict[str, str | None] = {}
    for inst in instructions:
        if inst.cmd == "ARG":
            for item in inst.value:
                name, sep, default = item.partition("=")
                out[name] = default.strip('"') if sep else None
    return out


def resolve_base(base: str, head: list[dockerfile.Command]) -> str:
    """A FROM image with the global ARG defaults substituted (what a build without --build-arg pulls)."""
    defaults = arg_declarations(head)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: defaults.get(m.group(1)) or m.group(0), base)


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation of the forms used here: ${X}, ${X:-default}, ${X:?message}."""

    def one(m: re.Match) -> str:
        name, op, operand = m.group(1), m.group(2), m.group(3)
        got = env.get(name, "")
        if op == ":-":
            return got or operand
        if op == ":?" and not got:
            raise ValueError(f"{name}: {operand}")
        return got

    return _COMPOSE_VAR.sub(one, value)
