#!/usr/bin/env bash
# `make pins`: move deploy/constraints.txt to the newest releases pyproject.toml allows, but
# only if the whole suite passes on them. Upgrades are a decision, never an accident:
#   1. a scratch venv ($PINS_VENV, default .venv-pins) with torch ($TORCH) and the project's
#      newest allowed releases (no constraints);
#   2. the whole suite, run with that venv's Python;
#   3. if it passed: its `pip freeze --all` (less pip, torch and swarm-node) replaces the pins.
# Review `git diff deploy/constraints.txt` and commit it; then `make setup` installs the same.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
py="${PY:-python3}"
venv="${PINS_VENV:-.venv-pins}"
torch="${TORCH:-torch==2.13.0}"
out="deploy/constraints.txt"

"$py" deploy/python_check.py
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/pip" install "$torch"
"$venv/bin/pip" install --upgrade -e ".[test]"
echo "refresh_pins: running the suite on the newest releases ($venv)" >&2
if ! "$venv/bin/python" -m tests.lanes "$@"; then
    echo "refresh_pins: the suite failed on the newest releases; $out is unchanged" >&2
    exit 1
fi
tmp="$(mktemp "$out.XXXXXX")"
{
    sed -n '/^#/p' "$out"  # keep the header
    "$venv/bin/pip" freeze --all --exclude-editable | grep -v -i -E '^(pip|torch|swarm-node|swarm_node)=='
} > "$tmp"
mv "$tmp" "$out"
echo "refresh_pins: $out now pins $(grep -c -v '^#' "$out") packages; review and commit it" >&2
git --no-pager diff --stat -- "$out" || true
