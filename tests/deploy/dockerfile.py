"""A small Dockerfile and compose reader for the deploy tests (no Docker engine needed).

It understands what deploy/Dockerfile uses: line continuations, comments, global ARGs in
FROM, multi-stage builds where ``FROM <stage>`` inherits the image config (ENV, USER,
ENTRYPOINT, CMD, HEALTHCHECK, EXPOSE, VOLUME, WORKDIR), ``$VAR``/``${VAR}`` in ENV, exec-form
(JSON) ENTRYPOINT/CMD/HEALTHCHECK. Anything else it meets is kept as a raw instruction.
Compose: the ``${VAR}``, ``${VAR:-d}``, ``${VAR-d}``, ``${VAR:?e}``, ``${VAR?e}``, ``$$`` forms.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Image", "Stage", "parse_dockerfile", "interpolate", "compose_vars"]

_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))")


@dataclass
class Image:
    """The config a stage gives the image it produces (what `docker inspect` would show)."""

    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    workdir: str | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    healthcheck: dict[str, Any] | None = None
    expose: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)


@dataclass
class Stage:
    name: str | None
    base: str
    image: Image
    args: dict[str, str | None] = field(default_factory=dict)
    instructions: list[tuple[str, str]] = field(default_factory=list)


def _logical_lines(text: str) -> list[str]:
    lines, buf = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and buf):
            continue  # comments (also inside a continued instruction) and blanks
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        line = (buf + raw).strip()
        buf = ""
        if line:
            lines.append(line)
    if buf.strip():
        lines.append(buf.strip())
    return lines


def _subst(value: str, scope: dict[str, str]) -> str:
    return _VAR.sub(lambda m: scope.get(m["braced"] or m["bare"], m[0]), value)


def _key_values(args: str) -> list[tuple[str, str]]:
    pairs = []
    for token in shlex.split(args):
        key, sep, value = token.partition("=")
        if not sep:
            raise ValueError(f"only ENV/ARG key=value form is supported, got {args!r}")
        pairs.append((key, value))
    return pairs


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a JSON list of strings, got {args!r}")
    return value


def _healthcheck(args: str) -> dict[str, Any]:
    opts: dict[str, str] = {}
    rest = args
    while rest.startswith("--"):
        opt, _, rest = rest.partition(" ")
        key, _, value = opt[2:].partition("=")
        opts[key] = value
        rest = rest.lstrip()
    kind, _, body = rest.partition(" ")
    if kind.upper() == "NONE":
        return {"options": opts, "cmd": None}
    if kind.upper() != "CMD":
        raise ValueError(f"HEALTHCHECK needs CMD or NONE, got {args!r}")
    return {"options": opts, "cmd": _exec_form(body.strip())}


def parse_dockerfile(path: Path) -> dict[str, Stage]:
    """Stages by name (unnamed stages by index as a string); the last one is also under ''."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in _logical_lines(Path(path).read_text()):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            parts = _subst(args, global_args).split()
            base = parts[0]
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            parent = stages.get(base)
            image = copy.deepcopy(parent.image) if parent else Image()
            current = Stage(name=name, base=base, image=image)
            stages[name or str(len(stages))] = current
            continue
        if current is None:
            if keyword != "ARG":
                raise ValueError(f"{keyword} before the first FROM")
            for key, value in _key_values(args):
                global_args[key] = value
            continue
        current.instructions.append((keyword, args))
        _apply(current, keyword, args, global_args)
    if current is not None:
        stages[""] = current
    return stages


def _apply(stage: Stage, keyword: str, args: str, global_args: dict[str, str]) -> None:
    img = stage.image
    scope = {**{k: v for k, v in stage.args.items() if v is not None}, **img.env}
    if keyword == "ARG":
        for key, value in _key_values(args) if "=" in args else [(args, None)]:
            stage.args[key] = value if value is not None else global_args.get(key)
    elif keyword == "ENV":  # one instruction substitutes with the values from before it
        for key, value in _key_values(args):
            img.env[key] = _subst(value, scope)
    elif keyword == "USER":
        img.user = _subst(args, scope)
    elif keyword == "WORKDIR":
        img.workdir = _subst(args, scope)
    elif keyword == "ENTRYPOINT":
        img.entrypoint = _exec_form(args)
        img.cmd = None  # Docker resets CMD when ENTRYPOINT is set
    elif keyword == "CMD":
        img.cmd = _exec_form(args)
    elif keyword == "HEALTHCHECK":
        img.healthcheck = _healthcheck(args)
    elif keyword == "EXPOSE":
        img.expose += args.split()
    elif keyword == "VOLUME":
        img.volumes += _exec_form(args) if args.startswith("[") else args.split()


_COMPOSE_VAR = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")


def compose_vars(value: Any) -> set[str]:
    """Names of the variables a compose value (or nested structure) interpolates."""
    if isinstance(value, dict):
        return set().union(*(compose_vars(v) for v in value.values()), set())
    if isinstance(value, list):
        return set().union(*(compose_vars(v) for v in value), set())
    if isinstance(value, str):
        return {m["name"] or m["bare"] for m in _COMPOSE_VAR.finditer(value) if m[0] != "$$"}
    return set()


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose interpolation of a parsed compose value against ``env``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        name, op, arg = m["name"] or m["bare"], m["op"], m["arg"] or ""
        current = env.get(name)
        unset = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-"):
            return arg if unset else current
        if op in (":?", "?") and unset:
            raise KeyError(f"required variable {name} is missing: {arg}")
        return current or ""

    return _COMPOSE_VAR.sub(one, value)
