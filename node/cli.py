"""The `swarm-node` command line: a thin layer over the typed configs. Owns the terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from protocol import IdentityError, load_or_create_identity

DEFAULT_DATA_DIR = Path.home() / ".swarm-node"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="swarm-node")
def cli() -> None:
    """Join a decentralized swarm that post-trains language models with RL."""


@cli.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_DATA_DIR, show_default=True, help="Node data directory.")
def identity(data_dir: Path) -> None:
    """Print this node's peer ID (creates the key in DATA_DIR if absent)."""
    try:
        ident = load_or_create_identity(data_dir)
    except IdentityError as e:
        raise click.ClickException(str(e)) from None
    click.echo(ident.peer_id)


def _not_built(name: str) -> None:
    click.echo(f"swarm-node {name}: not built yet", err=True)
    sys.exit(2)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def join() -> None:
    """Run a training node that joins the swarm through a bootstrap peer."""
    _not_built("join")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def bootstrap() -> None:
    """Run a non-training peer that others bootstrap from."""
    _not_built("bootstrap")


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def local() -> None:
    """Start a bootstrap peer and N training nodes on loopback."""
    _not_built("local")


def main() -> None:
    cli()
