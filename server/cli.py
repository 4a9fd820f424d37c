"""`arbor-server` / `python -m server`: parse flags into ServerSettings and serve."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import uvicorn
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from server.settings import FLAG_GROUPS, ServerSettings


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def flag_of(name: str) -> str:
    """The long flag of a ServerSettings field: --field-name, or its json_schema_extra "flag"."""
    return _extra(ServerSettings.model_fields[name]).get("flag") or "--" + name.replace("_", "-")


def _extra(field: FieldInfo) -> dict[str, Any]:
    return field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}


def _default_text(field: FieldInfo) -> str:
    """' (default X)' from the field's default for its --help; nothing where there is no value to
    state (None, a factory, an empty list, a switch that is off): the description says what that means."""
    value = field.get_default(call_default_factory=False)
    if value is PydanticUndefined or value is None or value is False or value == ():
        return ""
    if value == "":
        return " (default: empty)"
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) \
        else str(value)
    return f" (default {shown})"


def _value_type(annotation: Any) -> Any:
    """The annotation less its None alternative (X | None)."""
    if get_origin(annotation) in (Union, UnionType):
        rest = [a for a in get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _argument(name: str, field: FieldInfo) -> tuple[list[str], dict[str, Any]]:
    """A field's flag strings and add_argument keywords: the type from its annotation, the help
    from its description and default. Every flag defaults to None (not given: the environment or
    the field's default applies)."""
    extra = _extra(field)
    flags = [flag_of(name)] + ([extra["short"]] if "short" in extra else [])
    kind = _value_type(field.annotation)
    kw: dict[str, Any] = {"dest": name, "default": None}
    if kind is bool:
        kw["action"] = "store_true"
    elif get_origin(kind) is Literal:
        kw["choices"] = get_args(kind)
        if "bare" in extra:
            kw |= {"nargs": "?", "const": extra["bare"]}
    elif get_origin(kind) in (tuple, list):
        kw["type"] = _comma_list
    elif kind is dict or get_origin(kind) is dict:
        kw |= {"type": _json_object, "metavar": "JSON"}
    elif kind in (int, float, Path):
        kw["type"] = kind
    elif kind not in (str, SecretStr):
        raise TypeError(f"ServerSettings.{name}: no command-line form for {field.annotation}")
    kw["help"] = ((field.description or "") + _default_text(field)).strip().replace("%", "%%") or None
    return flags, kw


def build_parser() -> argparse.ArgumentParser:
    """arbor-server's flags, one per ServerSettings field (server/settings.py holds their help,
    types and defaults), in the field order, sectioned by their "group"."""
    p = argparse.ArgumentParser(prog="arbor-server", description="Arbor's cache-optimized OpenAI-compatible server")
    p.add_argument("--version", action="store_true", default=None, help="print the build (llama-cpp-python "
                   "release, whether paged attention is compiled in, the backends and devices llama.cpp sees) "
                   "and exit")
    groups = {title: p.add_argument_group(title, text) for title, text in FLAG_GROUPS.items()}
    for name, field in ServerSettings.model_fields.items():
        flags, kw = _argument(name, field)
        group = _extra(field).get("group")  # a title of FLAG_GROUPS (an unknown one: KeyError)
        (groups[group] if isinstance(group, str) else p).add_argument(*flags, **kw)
    return p


def settings_from_args(argv: list[str] | None = None) -> ServerSettings:
    args = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None and k != "version"}
    return ServerSettings(**given)


def main(argv: list[str] | None = None) -> None:
    if build_parser().parse_args(argv).version:
        from server.build_info import version_text

        print(version_text())
        return
    try:
        settings = settings_from_args(argv)
    except ValidationError as exc:
        for err in exc.errors():
            where = _where(err["loc"])
            print(f"arbor-server: {where}: {err['msg']}", file=sys.stderr)
        sys.exit(2)
    if settings.paged_attn == "on":
        from server.engine import paged_attention

        if not paged_attention.compiled_in():
            print("arbor-server: --paged-attn on: this llama-cpp-python build has no paged attention (it was not "
                  "built from Arbor's patched source: run scripts/setup.sh)", file=sys.stderr)
            sys.exit(2)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _refuse_without_device(settings)
    from server.api.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=5)


def _where(loc: tuple) -> str:
    """The flag a validation error is about (a field's flag; --a-b for a nested location)."""
    if not loc:
        return "settings"
    if len(loc) == 1 and loc[0] in ServerSettings.model_fields:
        return flag_of(str(loc[0]))
    return "--" + "-".join(str(x) for x in loc).replace("_", "-")


def _refuse_without_device(settings: ServerSettings) -> None:
    """Exit 2 before listening when layers are asked of an accelerator that is not there
    (llama.cpp would load everything on the CPU and say so only in a filtered INFO line)."""
    if settings.n_gpu_layers == 0:
        return
    from server.engine import backend_devices, offload

    try:
        warning = offload.check_devices(settings.n_gpu_layers, backend_devices.inventory(),
                                        settings.allow_cpu_fallback)
    except offload.NoAcceleratorError as exc:
        print(f"arbor-server: {exc}", file=sys.stderr)
        sys.exit(2)
    if warning:
        logging.getLogger("server.cli").warning("%s", warning)


if __name__ == "__main__":
    main()
