"""The `losslab` command line: one thin typer function per command.

Every command calls a function that a Python user can call too; the CLI holds no logic of its own.
Sub-command groups (`plan`, `golden`) are typer sub-apps registered below.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="losslab",
    help="Trustworthy post-training RL loss experiments from one plan file.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """losslab: is my loss the paper's loss, are the arms comparable, does the loss act, who wins."""


@app.command()
def version() -> None:
    """Print the losslab version."""
    from losslab import __version__

    typer.echo(__version__)


# --- command registrations (each part of the product adds its commands in its own section) ---

if __name__ == "__main__":  # pragma: no cover
    app()
