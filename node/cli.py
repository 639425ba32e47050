"""The `swarm-node` command line: a thin layer over NodeConfig. Owns the terminal.

Precedence of settings: config file (--config) < environment (SWARM_NODE_*) < flags. A bad
setting, in any table of the config file or in a flag, ends the command with one line
(``config error: [outer] evry_rounds: unknown key (did you mean every_rounds?)``) and exit
status 2 before any process starts: building the NodeConfig checks every child's table.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from node.config import (DEFAULT_DATA_DIR, DEFAULT_LISTEN, DEFAULT_SWARM_ID, FILE_ONLY_KEYS,
                         ConfigError, NodeConfig)
from protocol import IdentityError, load_or_create_identity

ENV = "SWARM_NODE_"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class BadConfig(click.ClickException):
    """A ConfigError shown as one line, ``config error: ...``, with exit status 2 (click's
    status for a usage error): no usage text, no traceback."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"config error: {self.format_message()}", err=True, file=file)


def _load_config_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        from node.config import load_config_file

        try:
            ctx.default_map = {**(ctx.default_map or {}), **load_config_file(value)}
        except ConfigError as e:
            raise BadConfig(str(e)) from None
        ctx.meta["config_file"] = value


def _opt(name: str, *decls: str, **kw: Any) -> Any:
    env = ENV + name.lstrip("-").replace("-", "_").upper()
    return click.option(name, *decls, envvar=env, show_envvar=True, **kw)


def _data_dir_opt() -> Any:
    return _opt("--data-dir", type=click.Path(file_okay=False, path_type=Path),
                default=DEFAULT_DATA_DIR, show_default=True,
                help="Identity, checkpoints, status and reports.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="swarm-node")
def cli() -> None:
    """Join a decentralized swarm that post-trains language models with RL."""


@cli.command()
@_data_dir_opt()
def identity(data_dir: Path) -> None:
    """Print this node's peer ID (creates the key in DATA_DIR if absent)."""
    try:
        ident = load_or_create_identity(data_dir)
    except IdentityError as e:
        raise click.ClickException(str(e)) from None
    click.echo(ident.peer_id)


_JOIN_OPTIONS = [
    click.option("--config", "config_file", envvar=ENV + "CONFIG", show_envvar=True,
                 type=click.Path(dir_okay=False, exists=True), callback=_load_config_file,
                 is_eager=True, expose_value=False, help="TOML config file (lowest precedence)."),
    _opt("--bootstrap", multiple=True,
         help="Bootstrap multiaddr (repeatable; env: space-separated)."),
    _data_dir_opt(),
    _opt("--listen", multiple=True, default=[DEFAULT_LISTEN], show_default=True,
         help="Listen multiaddr (repeatable)."),
    _opt("--announce", multiple=True,
         help="Multiaddr to advertise, e.g. your public IP behind NAT."),
    _opt("--swarm-id", default=DEFAULT_SWARM_ID, show_default=True),
    _opt("--trust-peer", "trusted_peers", multiple=True,
         help="Peer id whose outer-step versions this node adopts when it joins late "
              "(repeatable; env: space-separated): the other nodes you run yourself."),
    _opt("--model", default="embedded", show_default=True,
         help="Hugging Face id or local path; 'embedded' = tiny built-in model; 'auto' = "
              "the model for this device's memory (README: model table)."),
    _opt("--device", default="auto", show_default=True, help="auto | cpu | cuda | cuda:N"),
    _opt("--rounds", type=click.IntRange(min=0), default=None, help="Stop after R rounds."),
    _opt("--report", type=click.Path(dir_okay=False, path_type=Path), default=None,
         help="Write the node report (JSON) here on exit."),
    _opt("--metrics-port", type=click.IntRange(0, 65535), default=None,
         help="Serve Prometheus metrics on this port."),
    _opt("--dashboard-port", type=click.IntRange(0, 65535), default=None,
         help="Serve the local dashboard at http://127.0.0.1:P/ (off by default)."),
    _opt("--plain", is_flag=True, help="Plain log lines even on a terminal."),
]
"""The options of `join`, top to bottom; `doctor` takes the same ones, so a volunteer checks
the very command line (or environment, or config file) they will join with."""


def _join_options(command: Any) -> Any:
    for option in reversed(_JOIN_OPTIONS):
        command = option(command)
    return command


@cli.command()
@_join_options
@click.option("-v", "--verbose", is_flag=True)
@click.pass_context
def join(ctx: click.Context, verbose: bool, plain: bool, **opts: Any) -> None:
    """Run a training node that joins the swarm through a bootstrap peer."""
    _setup_logging(verbose)
    config = join_config(ctx, opts)
    from node.doctor import preflight

    failed = preflight(config)  # ports in use, no room for a checkpoint
    if failed:
        click.echo(f"cannot start: {failed[0].detail}; fix: {failed[0].fix}", err=True)
        sys.exit(2)
    from node.launch import run_node

    sys.exit(run_node(config, live=sys.stderr.isatty() and not plain))


@cli.command()
@_join_options
@click.option("-v", "--verbose", is_flag=True)
@click.pass_context
def doctor(ctx: click.Context, verbose: bool, plain: bool, **opts: Any) -> None:
    """Check this machine and the bootstrap peer before you join: one line per check.

    Takes the options of `join` (and its config file and environment). Each line says ok,
    warn or FAIL and, when not ok, the fix. Exit status 1 if any check FAILs, else 0.
    """
    del plain  # a join option: accepted so that one command line serves both
    logging.basicConfig(level=logging.DEBUG if verbose else logging.ERROR, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from node.check import Check, Verdict
    from node.doctor import run_checks

    default_map = ctx.default_map or {}
    extra = {k: default_map[k] for k in FILE_ONLY_KEYS if k in default_map}
    try:
        config = _node_config(opts, extra)
    except BadConfig as e:
        click.echo(Check(name="config", verdict=Verdict.FAIL, detail=e.format_message(),
                         fix="the option or config key it names").line())
        sys.exit(1)
    failed = False
    for check in run_checks(config):
        click.echo(check.line())
        failed = failed or check.verdict is Verdict.FAIL
    sys.exit(1 if failed else 0)


@cli.command()
@_data_dir_opt()
@_opt("--listen", multiple=True, default=[DEFAULT_LISTEN], show_default=True)
@_opt("--announce", multiple=True)
@_opt("--bootstrap", multiple=True, help="Other bootstrap peers to link up with.")
@_opt("--swarm-id", default=DEFAULT_SWARM_ID, show_default=True)
@click.option("-v", "--verbose", is_flag=True)
def bootstrap(verbose: bool, **opts: Any) -> None:
    """Run a non-training peer that others bootstrap from; prints its multiaddr."""
    _setup_logging(verbose)
    config = _node_config(opts, {})
    from node.launch import run_bootstrap

    def print_addrs(addrs: list[str]) -> None:
        for a in addrs:
            click.echo(a)

    sys.exit(run_bootstrap(config, on_ready=print_addrs))


@cli.command()
@_data_dir_opt()
@click.option("--max-age", type=float, default=30.0, show_default=True,
              help="Seconds after which a silent node counts as down.")
def status(data_dir: Path, max_age: float) -> None:
    """Is the node with this data dir alive? Exit 0 if so (the Docker HEALTHCHECK)."""
    from node.status import check_status

    healthy, summary = check_status(data_dir, max_age_s=max_age)
    click.echo(("healthy: " if healthy else "unhealthy: ") + summary)
    sys.exit(0 if healthy else 1)


@cli.command()
@click.option("--nodes", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=150, show_default=True)
@click.option("--report", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("swarm-report.json"), show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Base dir for the nodes' data dirs (default: a fresh temp dir).")
@click.option("--model", default="embedded", show_default=True)
@click.option("--config", "config_file", type=click.Path(dir_okay=False, exists=True),
              default=None, help="TOML config passed to every node.")
@click.option("-v", "--verbose", is_flag=True)
def local(nodes: int, rounds: int, report: Path, data_dir: Path | None, model: str,
          config_file: str | None, verbose: bool) -> None:
    """Start a bootstrap peer and N training nodes on 127.0.0.1 and run R rounds."""
    _setup_logging(verbose)
    from node.local import LocalSwarm

    swarm = LocalSwarm(nodes=nodes, rounds=rounds, report=report, base_dir=data_dir,
                       model=model, config_file=config_file)
    # every node is a `join` with these arguments: check them once, before anything starts
    check_join(swarm.join_args(data_dir or Path("node-0"), CHECK_BOOTSTRAP))
    sys.exit(swarm.run())


@cli.command()
@_data_dir_opt()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--version", "version", type=click.Choice(["local", "outer"]), default="local",
              show_default=True,
              help="local: the weights of the node's newest checkpoint (what it trains and "
                   "samples with). outer: θ_global of its last applied outer step.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
@click.option("-v", "--verbose", is_flag=True)
def export(data_dir: Path, out: Path, version: str, force: bool, verbose: bool) -> None:
    """Write the node's policy to OUT as a Hugging Face model directory.

    Safetensors weights, tokenizer (and chat template), generation config, a model card
    (README.md) and provenance.json; transformers' AutoModelForCausalLM/AutoTokenizer and
    vLLM load OUT as is. Safe while the node runs: it reads the newest complete checkpoint.
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.ERROR, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    from node.export import ExportError, export_model

    try:
        done = export_model(data_dir, out, version=version, force=force)
    except ExportError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    prov = done.provenance
    if done.running_pid is not None:
        click.echo(f"note: a node (pid {done.running_pid}) is running on {data_dir}; exported "
                   f"its newest checkpoint, {prov['checkpoint']}", err=True)
    outer = (f", outer version {prov['outer_version']} ({prov['outer_state_hash'][:12]})"
             if prov["outer_state_hash"] else "")
    click.echo(f"exported the {version} policy after {prov['rounds']} rounds{outer} to {out}")


@cli.command("eval")
@_data_dir_opt()
@click.option("--model", "model", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="An exported model dir (`swarm-node export`) instead of DATA_DIR's newest "
                   "checkpoint.")
@click.option("--families", default="", help="Comma-separated task families (default: those "
                                             "the checkpoint or export recorded).")
@click.option("--questions", type=click.IntRange(1, 10_000), default=32, show_default=True,
              help="Size of the held-out set.")
@click.option("--samples", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Sampled completions per question (besides the greedy one).")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:N | auto")
@click.option("--json", "as_json", is_flag=True, help="Print the score as one JSON object.")
@click.option("-v", "--verbose", is_flag=True)
def eval_(data_dir: Path, model: Path | None, families: str, questions: int, samples: int,
          device: str, as_json: bool, verbose: bool) -> None:
    """Score a policy on the held-out set: questions no training round uses.

    Greedy and sampled accuracy of the newest checkpoint in DATA_DIR, or of an exported model
    (--model), on the fixed evaluation set of its task families (the one the node scores
    every `eval_every` rounds). Safe while the node runs.
    """
    logging.basicConfig(level=logging.DEBUG if verbose else logging.ERROR, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    import json

    from node.evaluate import EvalError, evaluate

    try:
        score = evaluate(data_dir=data_dir, model=model, questions=questions, samples=samples,
                         families=tuple(f for f in families.split(",") if f), device=device)
    except EvalError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(score, sort_keys=True))
        return
    after = f" after {score['rounds']} rounds" if score.get("rounds") is not None else ""
    click.echo(f"held-out{after}: greedy accuracy {score['greedy_accuracy']:.3f}, sampled "
               f"{score['sampled_accuracy']:.3f} ({score['questions']} questions x "
               f"{score['samples']} samples, {score['seconds']:.1f} s) -- {score['source']}")
    for name, fam in score["by_family"].items():
        click.echo(f"  {name}: greedy {fam['greedy_accuracy']:.3f}, sampled "
                   f"{fam['sampled_accuracy']:.3f} ({fam['questions']} questions)")


CHECK_BOOTSTRAP = "/ip4/127.0.0.1/tcp/0/p2p/not-started-yet"
"""Stands for the bootstrap peer's address (known once it runs) in ``check_join``."""


def check_join(args: list[str]) -> NodeConfig:
    """The NodeConfig that `swarm-node ARGS` (a `join`) would build, or its error raised."""
    ctx = join.make_context("join", args[1:])
    return join_config(ctx, {k: v for k, v in ctx.params.items() if k not in ("verbose", "plain")})


def join_config(ctx: click.Context, opts: dict[str, Any]) -> NodeConfig:
    """The NodeConfig of a `join`: flags > env > config file (click's default_map)."""
    default_map = ctx.default_map or {}
    extra = {k: default_map[k] for k in FILE_ONLY_KEYS if k in default_map}
    if not opts["bootstrap"]:
        raise click.UsageError("--bootstrap is required (or SWARM_NODE_BOOTSTRAP / config file); "
                               "start one with `swarm-node bootstrap`, or try `swarm-node local`")
    return _node_config(opts, extra)


def _node_config(opts: dict[str, Any], extra: dict[str, Any]) -> NodeConfig:
    def addrs(value: Any) -> tuple[str, ...]:  # env vars give one space-separated string
        return tuple(a for v in (value or ()) for a in str(v).split())

    values = dict(opts)
    for key in ("bootstrap", "listen", "announce", "trusted_peers"):
        if key in values:
            values[key] = addrs(values[key])
    try:
        return NodeConfig(**values, **extra)
    except ConfigError as e:
        raise BadConfig(str(e)) from None


def main() -> None:
    cli()
