"""``shardc run``'s progress on stderr while the ranks start and run (docs/running.md, "One
machine"), fed by the launcher's ``on_progress`` with rank counts ``{up, joined, bench,
done, failed}``.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class RunProgress:
    """Stages: starting ranks -> joining the process group -> (timing runs ->) reports in."""

    def __init__(self, world: int, backend: str, bench: int, *, rich: bool, plain: bool,
                 command: str = "shardc run", runs: str = "runs", doing: str = "running the program") -> None:
        """``bench``: how many timed units rank 0 counts (``runs``, or ``probes`` for calibrate)."""
        self.world, self.backend, self.bench = world, backend, bench
        self.command, self.runs, self.doing = command, runs, doing
        self.t0 = time.monotonic()
        self.said: set[str] = set()
        self.last_up = 0
        self.last_line = self.t0
        self.bar: Any = None
        self.task: Any = None
        self.plain = plain and not rich
        if rich:
            from rich import progress
            from rich.console import Console

            self.bar = progress.Progress(progress.SpinnerColumn(), progress.TextColumn("{task.description}"),
                                         progress.BarColumn(), progress.MofNCompleteColumn(),
                                         progress.TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(f"starting {world} ranks ({backend})", total=world)
        self._say(f"starting {world} ranks ({backend})")

    def _say(self, text: str) -> None:
        if self.plain:
            self.last_line = time.monotonic()
            print(f"{self.command}: [{time.monotonic() - self.t0:5.1f}s] {text}", file=sys.stderr, flush=True)

    def __call__(self, state: dict[str, int]) -> None:
        w = self.world
        if state["failed"]:
            desc, done, total = "a rank failed; collecting the reports", state["done"], w
        elif state["up"] < w:
            desc, done, total = f"starting {w} ranks ({self.backend})", state["up"], w
        elif state["joined"] < w:
            desc, done, total = "joining the process group", state["joined"], w
        elif self.bench and state["bench"] < self.bench and state["done"] == 0:
            desc, done, total = f"timing {self.bench} {self.runs}", state["bench"], self.bench
        else:
            desc, done, total = "running; ranks reported", state["done"], w
        if self.bar is not None:
            self.bar.update(self.task, description=desc, completed=done, total=total)
        milestones = [
            (state["up"] >= w, f"{w} ranks started"),
            (state["joined"] >= w, f"process group ready ({self.backend}); {self.doing}"),
            (bool(self.bench) and state["bench"] >= self.bench, f"{self.bench} timed {self.runs} done"),
            (state["failed"] > 0, "a rank failed; collecting the reports"),
        ]
        if state["up"] < w and state["up"] != self.last_up and time.monotonic() - self.last_line > 2.0:
            self.last_up = state["up"]
            self._say(f"{state['up']}/{w} ranks started")
        for reached, text in milestones:
            if reached and text not in self.said:
                self.said.add(text)
                self._say(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
        else:
            self._say("all ranks reported")
