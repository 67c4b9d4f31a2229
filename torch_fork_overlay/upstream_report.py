"""Compare and report one suite's stock and patched runs (for ``upstream-tests``).

Every test seen on either side lands in exactly one place:

* regression           -- passed on stock, anything else on patched (failed,
                          errored, crashed, skipped, not collected); skipped or
                          not collected on stock, failing (or not collected) on
                          patched;
* suspected regression -- failing on both sides, but differently: the status
                          (failed / errored / crashed) or the normalized first
                          error line changed; or failing on stock and skipped or
                          not collected on patched;
* fix                  -- failing on stock, passed patched;
* failing on both      -- the same failure on both sides (not caused by the patch);
* passing on both / skipped (on both, or skipped on stock and passing patched);
* only on patched      -- not collected on a stock run that completed, not failing patched;
* not run              -- missing on a side whose run stopped early (timeout, crash).

Per test file and side, a file "did not really run" when it has no passing test,
or when one and the same failure (normalized first line) is shared by at least
two tests and by more than half of the file's tests that ran (not skipped): the
comparison then says nothing about the patch (e.g. test/export/test_torchbind.py
without ``libtorchbind_test.so``).  That fails the run unless the suite lists the
file under ``expect_not_running`` with a reason.  Its line also counts the tests that
ran on both sides without that failure: they are compared one by one as any other.
The same words on both sides but for paths and numbers (each interpreter's own path)
are one line, ``[stock and patched]``.

Counts follow pytest's summary, per phase: a test whose call fails and whose
teardown then errors is 1 failed and 1 errored.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .upstream_tests import Suite

SIDES = ("stock", "patched")
STATUSES = ("passed", "failed", "errored", "skipped", "crashed")
FAILING = frozenset({"failed", "errored", "crashed"})


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str        # one of STATUSES
    message: str = ""  # first line of the error ("ExcType: text"), or the skip reason
    teardown: str = ""  # first line of an error in teardown after the test had failed (or errored in setup)
    counts_as: tuple[str, ...] = ()  # what pytest's summary counts for it, one per phase; () is (status,)

    def __str__(self) -> str:
        text = f"{self.status}: {self.message}" if self.message else self.status
        return text + (f"; then errored in teardown: {self.teardown}" if self.teardown else "")

    def to_json(self) -> dict:
        return {"status": self.status, "message": self.message,
                **({"teardown": self.teardown} if self.teardown else {})}


@dataclasses.dataclass
class Run:
    side: str
    python: str
    returncode: int
    timed_out: bool
    seconds: float
    log: Path
    outcomes: dict[str, Outcome]  # pytest node id -> outcome
    finished: bool = True         # pytest reached the end of its session
    prefixes: tuple[str, ...] = ()  # this interpreter's sys.prefix (its realpath too): "<env>" in messages
    tmpdirs: tuple[str, ...] = ()   # its tempfile.gettempdir(): paths under it are "<tmp>" in messages
    junit: Path | None = None

    @property
    def complete(self) -> bool:
        # pytest: 0 all passed, 1 some failed, 5 none collected
        return self.finished and not self.timed_out and self.returncode in (0, 1, 5)

    def counts(self, ids=None) -> dict[str, int]:
        c = dict.fromkeys(STATUSES, 0)
        for key in self.outcomes if ids is None else ids:
            o = self.outcomes[key]
            for status in o.counts_as or (o.status,):  # per phase, as pytest's summary counts
                c[status] += 1
        return c


def exit_reason(returncode: int, timed_out: bool, timeout: int | None = None) -> str:
    """Why a pytest process ended, in words: ``timed out after 60s``, ``killed by SIGSEGV``."""
    if timed_out:
        return f"timed out after {timeout}s" if timeout else "timed out"
    # a negative status is a signal; coreutils timeout passes a child's signal on as 128+N
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        return f"killed by {signal.Signals(sig).name}"
    except ValueError:
        return f"pytest exit {returncode}"


# --- comparing failures ------------------------------------------------------

_TMP_DIRS = ("/tmp", "/var/tmp", "/var/folders", "/private/var/folders")
_STOP = r"""\s'":,;)\]}>"""  # characters that end a path in a message
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUM = re.compile(r"\d+")


def normalize(message: str, prefixes: tuple[str, ...] = (), tmpdirs: tuple[str, ...] = ()) -> str:
    """The part of a first error line that must match for "the same failure".

    Paths under a temporary directory (``tmpdirs``, /tmp, /var/tmp, macOS's
    /var/folders) become ``<tmp>``, the interpreter's own prefix (``prefixes``)
    ``<env>``, hex addresses ``<hex>`` and every other number (ids, sizes, line
    numbers, timings) ``N``.
    """
    dirs = sorted({d.rstrip("/") for d in (*tmpdirs, *_TMP_DIRS) if d.rstrip("/")}, key=len, reverse=True)
    tmp = "|".join(map(re.escape, dirs))
    # a whole path starting with one of dirs: "/tmp/x/y.so", not "/tmpfoo" or "/home/u/tmp/x"
    message = re.sub(rf"(?<![\w.~-])(?:{tmp})(?![^/{_STOP}])[^{_STOP}]*", "<tmp>", message)
    for p in sorted(filter(None, prefixes), key=len, reverse=True):
        message = message.replace(p, "<env>")
    message = _HEX.sub("<hex>", message)
    message = _NUM.sub("N", message)
    return " ".join(message.split())


@dataclasses.dataclass(frozen=True)
class Change:
    id: str
    stock: Outcome | None
    patched: Outcome | None

    def to_json(self) -> dict:
        return {"id": self.id, **{s: o.to_json() if (o := getattr(self, s)) else None for s in SIDES}}


@dataclasses.dataclass(frozen=True)
class NotRunning:
    file: str
    sides: tuple[str, ...]
    message: str          # "no test passed; 49 of 49 failed with: RuntimeError: ..."
    expected: str | None  # the suite's reason, when it says so
    compared: tuple[str, ...] = ()  # its tests that ran on both sides (not skipped) without the failure named
    passing_on_both: int = 0  # of those, how many passed on both


@dataclasses.dataclass
class SuiteReport:
    suite: Suite
    stock: Run
    patched: Run
    regressions: list[Change]
    suspected: list[Change]
    fixes: list[Change]
    both_fail: list[Change]
    both_pass: int
    skipped: int
    only_patched: list[Change]
    not_run: dict[str, list[str]]          # side -> ids missing because that run stopped early
    files: dict[str, dict[str, dict[str, int]]]  # file -> side -> status counts
    not_running: list[NotRunning]
    expected_but_ran: list[tuple[str, str]]  # (file, reason): listed as not running, ran on both

    @property
    def complete(self) -> bool:
        return self.stock.complete and self.patched.complete

    @property
    def ok(self) -> bool:
        return (self.complete and not self.regressions and not self.suspected
                and not any(n.expected is None for n in self.not_running))


def _key(run: Run, o: Outcome) -> str:
    """What must match for two failures to be the same: status and normalized first line (and teardown error)."""
    return normalize(str(o), run.prefixes, run.tmpdirs)


def _file(node_id: str) -> str:
    return node_id.split("::", 1)[0]


def compare(suite: Suite, stock: Run, patched: Run) -> SuiteReport:
    """Classify every test id seen on either side; no status change goes unreported."""
    s, p = stock.outcomes, patched.outcomes
    regressions, suspected, fixes, both_fail, only_patched = [], [], [], [], []
    not_run = {side: [] for side in SIDES}
    both_pass = skipped = 0
    for key in sorted(set(s) | set(p)):
        a, b = s.get(key), p.get(key)
        change = Change(key, a, b)
        if a is None or b is None:
            side, run = ("stock", stock) if a is None else ("patched", patched)
            if not run.complete:
                not_run[side].append(key)
            elif a is None:
                # e.g. a collection error only on patched: a new failure
                (regressions if b.status in FAILING else only_patched).append(change)
            elif a.status in FAILING:
                suspected.append(change)  # failing on stock, not collected on patched
            else:
                regressions.append(change)
        elif a.status == b.status == "passed":
            both_pass += 1
        elif a.status == "skipped" and b.status in ("skipped", "passed"):
            skipped += 1
        elif a.status in FAILING and b.status == "passed":
            fixes.append(change)
        elif a.status in FAILING:
            same = _key(stock, a) == _key(patched, b)
            (both_fail if same else suspected).append(change)
        else:
            regressions.append(change)  # passed or skipped on stock; failing or skipped on patched

    files = sorted(set(suite.files) | {_file(k) for k in set(s) | set(p)})
    per_file = {f: {side: run.counts([k for k in run.outcomes if _file(k) == f]) for side, run in
                    (("stock", stock), ("patched", patched))} for f in files}
    expected = dict(suite.expect_not_running)
    not_running, expected_but_ran = [], []
    for f in files:
        why = {side: _not_running_reason(run, f) for side, run in (("stock", stock), ("patched", patched))}
        sides = tuple(side for side in SIDES if why[side])
        if not sides:
            if f in expected:
                expected_but_ran.append((f, expected[f]))
            continue
        ran = _ran_on_both(f, {side: why[side][2] for side in sides}, stock, patched)
        # the same words but for each side's paths and numbers (its interpreter, temp dir): said once
        if len(sides) == 2 and why["stock"][1] != why["patched"][1]:
            not_running += [NotRunning(f, (side,), why[side][0], expected.get(f), *ran) for side in sides]
        else:
            not_running.append(NotRunning(f, sides, why[sides[0]][0], expected.get(f), *ran))
    return SuiteReport(suite, stock, patched, regressions, suspected, fixes, both_fail, both_pass, skipped,
                       only_patched, not_run, per_file, not_running, expected_but_ran)


def _not_running_reason(run: Run, file: str) -> tuple[str, str, str | None] | None:
    """Why ``file`` did not really run on this side, or None when it did (see the module doc): the
    words, the same words with the message normalized (``_key``: two sides say the same when these
    match), and the key of the failure they name (None for none)."""
    outs = [o for k, o in run.outcomes.items() if _file(k) == file]
    early = "" if run.complete else " (the run stopped early)"
    if not outs:
        text = "no test ran: none collected, or all deselected" + early
        return text, text, None
    ran = [o for o in outs if o.status != "skipped"]
    if not ran:
        msg, key, n = _most_common(outs, run)

        def say(m: str) -> str:
            return f"every test skipped ({len(outs)})" + (f": {m}" if n == len(outs) else f"; {n} with: {m}")
        return say(msg), say(key), None
    failing = [o for o in ran if o.status in FAILING]
    if not failing:
        return None
    msg, key, n = _most_common(failing, run)
    if len(failing) == len(ran):  # no test passed
        def say(m: str) -> str:
            return (f"no test passed: {n} of {len(ran)} failed with: {m}" if n == len(ran) else
                    f"no test passed: {len(ran)} failed, the most common failure ({n} of them): {m}")
    elif n >= 2 and 2 * n > len(ran):
        def say(m: str) -> str:
            return f"{n} of {len(ran)} tests that ran failed with one message: {m}"
    else:
        return None
    return say(msg), say(key), key


def _most_common(outs: list[Outcome], run: Run) -> tuple[str, str, int]:
    """The most common of ``outs`` alike (see ``_key``): its first message as it was, its key, and how many."""
    keys = [_key(run, o) for o in outs]
    key, n = collections.Counter(keys).most_common(1)[0]
    first = outs[keys.index(key)]
    return first.message or first.status, key, n


def _ran_on_both(file: str, failures: dict[str, str | None], stock: Run, patched: Run) -> tuple[tuple[str, ...], int]:
    """The tests of ``file`` that ran on both sides (not skipped) without the failure that made a side
    not really run (``failures``: side -> its ``_key``), and how many of those passed on both."""
    ran, passing = [], 0
    for key, a in sorted(stock.outcomes.items()):
        b = patched.outcomes.get(key)
        if _file(key) != file or b is None or "skipped" in (a.status, b.status):
            continue
        if _key(stock, a) == failures.get("stock") or _key(patched, b) == failures.get("patched"):
            continue
        ran.append(key)
        passing += a.status == b.status == "passed"
    return tuple(ran), passing


# --- rendering -----------------------------------------------------------------

_TITLES = (
    ("regressions", "regressions (pass on stock, fail patched)"),
    ("suspected", "suspected regressions (failing on stock, failing differently patched)"),
    ("fixes", "fixes (fail on stock, pass patched)"),
    ("both_fail", "failing on both, the same failure (not caused by the patch)"),
    ("only_patched", "only on patched (not collected on stock)"),
)


def _side_line(run: Run, label: str, timeout: int) -> str:
    c = run.counts()
    state = "complete" if run.complete else "INCOMPLETE: " + exit_reason(run.returncode, run.timed_out, timeout)
    return (f"  {label + ':':8} {c['passed']} passed, {c['failed']} failed, {c['errored']} errored, "
            f"{c['skipped']} skipped, {c['crashed']} crashed; pytest exit {run.returncode} ({state}), "
            f"{run.seconds:.1f}s; log {run.log}")


# which sides' outcomes each list shows under a test id
_SHOW = {"regressions": SIDES, "suspected": SIDES, "fixes": ("stock",), "only_patched": ("patched",)}


def _change_lines(attr: str, c: Change) -> list[str]:
    if attr == "both_fail":
        return [f"    {c.id}  {c.stock}"]
    lines = [f"    {c.id}"]
    for side in _SHOW[attr]:
        o = getattr(c, side)
        if not (attr == "regressions" and side == "stock" and o is not None and o.status == "passed"):
            lines.append(f"        {side + ':':9}{o if o else 'not collected'}")
    return lines


def format_report(r: SuiteReport) -> str:
    name = r.suite.name
    lines = [f"{name}: {len(r.regressions)} regression(s), {len(r.suspected)} suspected regression(s), "
             f"{len(r.fixes)} fix(es), {len(r.both_fail)} failing on both, {r.both_pass} passing on both, "
             f"{r.skipped} skipped, {len(r.not_running)} file(s) that did not really run",
             _side_line(r.stock, "stock", r.suite.timeout), _side_line(r.patched, "patched", r.suite.timeout),
             "  per file, stock / patched:",
             "    | file | " + " | ".join(STATUSES) + " |",
             "    |---|" + "---|" * len(STATUSES)]
    for f, sides in r.files.items():
        lines.append(f"    | {f} | " + " | ".join(f"{sides['stock'][st]} / {sides['patched'][st]}"
                                                  for st in STATUSES) + " |")
    if r.not_running:
        lines.append("  did not really run (the comparison says nothing about these):")
        for n in r.not_running:
            lines.append(f"    {n.file} [{' and '.join(n.sides)}]: {n.message}")
            if n.compared:
                lines.append(f"        {len(n.compared)} of its tests ran on both sides without that failure "
                             f"({n.passing_on_both} passing on both); they are compared one by one")
            if n.expected:
                lines.append(f"        expected (suites file): {n.expected}")
    # the same failure on both sides of a file that did not run on either is said once, above
    # (its tests that ran on both sides without that failure are listed as any other)
    silent = {n.file for n in r.not_running if len(n.sides) == 2}
    compared = {k for n in r.not_running for k in n.compared}
    for attr, title in _TITLES:
        items = getattr(r, attr)
        shown = [c for c in items if attr != "both_fail" or _file(c.id) not in silent or c.id in compared]
        if shown:
            lines.append(f"  {title}:")
            for c in shown:
                lines += _change_lines(attr, c)
        if len(shown) < len(items):
            lines.append(f"    (+{len(items) - len(shown)} in the files above that did not really run; "
                         "listed in report.json)")
    for side in SIDES:
        run = getattr(r, side)
        if r.not_run[side]:
            lines.append(f"  not run on {side} (its run stopped early): {len(r.not_run[side])} test(s), "
                         "listed in report.json")
        if not run.complete:
            why = exit_reason(run.returncode, run.timed_out, r.suite.timeout)
            lines.append(f"  {side} run did not complete ({why}): see {run.log}")
    for node, reason in r.suite.deselect:
        lines.append(f"  deselected {node}: {reason}")
    for f, reason in r.expected_but_ran:
        lines.append(f"  note: {f} is listed in expect_not_running ({reason}) but ran on both sides; "
                     "the entry can go")
    return "\n".join(lines)


def format_reports(reports: list[SuiteReport]) -> str:
    lines = [format_report(r) for r in reports]
    n = {attr: sum(len(getattr(r, attr)) for r in reports) for attr in ("regressions", "suspected", "fixes")}
    incomplete = [r.suite.name for r in reports if not r.complete]
    not_running = [f"{r.suite.name}:{n.file} [{' and '.join(n.sides)}]" for r in reports for n in r.not_running
                   if n.expected is None]
    lines.append(f"summary: {len(reports)} suite(s), {n['regressions']} regression(s), "
                 f"{n['suspected']} suspected regression(s), {n['fixes']} fix(es)"
                 + (f"; incomplete: {', '.join(incomplete)}" if incomplete else "")
                 + (f"; did not really run: {', '.join(not_running)}" if not_running else "")
                 + ("; CLEAN" if all(r.ok for r in reports) else "; NOT CLEAN (exit status 1)"))
    return "\n".join(lines)


_JSON_KEYS = {"suspected": "suspected_regressions"}


def report_json(r: SuiteReport) -> dict:
    def side(run: Run) -> dict:
        return {"python": run.python, "returncode": run.returncode, "timed_out": run.timed_out,
                "complete": run.complete, "seconds": round(run.seconds, 1), "log": str(run.log),
                "junit": str(run.junit) if run.junit else None, **run.counts()}

    return {
        "ok": r.ok,
        "stock": side(r.stock),
        "patched": side(r.patched),
        "files": r.files,
        "not_running": [{"file": n.file, "sides": list(n.sides), "message": n.message,
                         "expected": n.expected, "ran_on_both": len(n.compared),
                         "passing_on_both": n.passing_on_both} for n in r.not_running],
        **{_JSON_KEYS.get(attr, attr): [c.to_json() for c in getattr(r, attr)] for attr, _ in _TITLES},
        "both_pass": r.both_pass,
        "skipped": r.skipped,
        "not_run": r.not_run,
        "deselected": [{"id": n, "reason": why} for n, why in r.suite.deselect],
        "expected_but_ran": [{"file": f, "reason": why} for f, why in r.expected_but_ran],
    }


def exit_status(reports: list[SuiteReport]) -> int:
    """0 when every suite ran to completion on both sides, every file really ran (or was
    expected not to), and nothing regressed or failed differently; else 1."""
    return 0 if all(r.ok for r in reports) else 1
