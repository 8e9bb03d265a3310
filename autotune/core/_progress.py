"""Progress bars on stderr (tqdm, which comes with Optuna): server starts of a study, files of a
traffic import, starts of a grid. Off when stderr is not a terminal (cron, systemd, pipes, tests)
or when asked to be quiet, so logs and JSON outputs never carry one; lines said while a bar is
shown go through ``Progress.echo``, which keeps the bar whole."""

from __future__ import annotations

import sys


def stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class Progress:
    """A bar of ``total`` steps (None: a counter), or nothing at all when off."""

    def __init__(self, total: int | None = None, desc: str = "", unit: str = "it", quiet: bool = False):
        self._bar = None
        if not quiet and stderr_is_tty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=True)

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def total(self, total: int) -> None:
        """The number of steps, once known."""
        if self._bar is not None and self._bar.total != total:
            self._bar.total = total

    def set(self, n: int, postfix: str | None = None) -> None:
        """``n`` steps done (never backwards: another worker's starts may be counted late)."""
        if self._bar is None:
            return
        if n > self._bar.n:
            self._bar.update(n - self._bar.n)
        if postfix is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
        self._bar.refresh()

    def echo(self, msg: str, err: bool = False) -> None:
        """Say a line (stdout, or stderr with ``err``) without tearing the bar."""
        out = sys.stderr if err else sys.stdout
        if self._bar is None:
            import click

            click.echo(msg, err=err)
        else:
            self._bar.write(msg, file=out)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
