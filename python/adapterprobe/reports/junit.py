"""A scan as JUnit XML, the test-report format GitLab, Jenkins, Buildkite,
Azure Pipelines and GitHub's test reporters read.

One ``<testsuite>`` per store, one ``<testcase>`` per record (``classname``
the store, ``name`` the probe and the adapter). A record whose verdict
reaches ``--fail-on`` is a ``<failure>``; an ``error`` record an ``<error>``
(with ``--fail-on never``, neither: the gate is off); a skip ``<skipped>``;
every other record passes with its verdict and message in ``<system-out>``.
The file follows the schema in ``tests/data/junit.xsd`` (the common subset
of what those tools accept) and is written atomically. Testcases are
spooled to a temporary file as records stream past, since the totals go
first in the document.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import IO

from adapterprobe._fs import atomic_output
from adapterprobe.escape import xml_text as x
from adapterprobe.probes.result import Verdict
from adapterprobe.tally import ReportedRecord, regression_of


class JUnitWriter:
    """``add`` records as they come, ``write`` the file at the end."""

    def __init__(
        self, path: str | os.PathLike[str], fail_on: str = "fail", *, regression_gate: bool = False
    ) -> None:
        self.path = path
        #: ``--fail-on-regression``: a record that regressed is a failure.
        self.regression_gate = regression_gate
        self.fail_on = fail_on
        self.floor = None if fail_on == "never" else Verdict(fail_on).severity
        self.totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        # Closed by write().
        self._body: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
        self._store: str | None = None
        self._cases: list[str] = []
        self._suite = dict.fromkeys(self.totals, 0)
        self._stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")

    def add(self, records: Iterable[ReportedRecord]) -> None:
        for r in records:
            if r.store != self._store:
                self._close_suite()
                self._store = r.store
            self._cases.append(self._case(r))

    def _case(self, r: ReportedRecord) -> str:
        name = r.probe if r.adapter is None else f"{r.probe} [{_below(r.adapter, r.store)}]"
        head = f'<testcase classname="{x(r.store)}" name="{x(name)}" time="0"'
        self._suite["tests"] += 1
        message = f"{r.verdict.value.upper()}: {r.message}"
        regressed = regression_of(r) if self.regression_gate else None
        failing = self.floor is not None and r.verdict.severity >= self.floor
        if regressed is not None and not failing:
            self._suite["failures"] += 1
            why = f"REGRESSED against the baseline: {'; '.join(regressed)} ({message})"
            inner = f'<failure message="{x(_first_line(why))}" type="regressed">{x(why)}</failure>'
        elif r.verdict is Verdict.ERROR and self.floor is not None:
            self._suite["errors"] += 1
            inner = f'<error message="{x(_first_line(message))}" type="error">{x(message)}</error>'
        elif self.floor is not None and r.verdict.severity >= self.floor:
            self._suite["failures"] += 1
            inner = (
                f'<failure message="{x(_first_line(message))}" type="{r.verdict.value}">'
                f"{x(message)}</failure>"
            )
        elif r.verdict is Verdict.SKIP:
            self._suite["skipped"] += 1
            inner = f'<skipped message="{x(_first_line(r.message))}"/>'
        else:
            inner = f"<system-out>{x(message)}</system-out>"
        return f"{head}>{inner}</testcase>\n"

    def _close_suite(self) -> None:
        if self._store is None:
            return
        counts = self._suite
        attrs = " ".join(f'{k}="{v}"' for k, v in counts.items())
        self._body.write(
            f'<testsuite name="{x(self._store)}" {attrs} time="0" timestamp="{self._stamp}">\n'
        )
        self._body.writelines(self._cases)
        self._body.write("</testsuite>\n")
        for k, v in counts.items():
            self.totals[k] += v
        self._cases = []
        self._suite = dict.fromkeys(self.totals, 0)

    def write(self) -> None:
        """Write the document atomically to the path given."""
        self._close_suite()
        attrs = " ".join(f'{k}="{v}"' for k, v in self.totals.items())
        with atomic_output(self.path) as out:
            out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
            out.write(f'<testsuites name="adapterprobe" {attrs} time="0">\n')
            self._body.seek(0)
            shutil.copyfileobj(self._body, out)
            out.write("</testsuites>\n")
        self._body.close()


def _below(path: str, base: str) -> str:
    prefix = base.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _first_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"
