"""What a rule provides, as data: :class:`Rule` and its parts.

A rule declares its pieces here once; :mod:`kvselect.rules` lists the rules,
and every list the package would otherwise keep by hand is derived from that
list: ``kvselect check``'s dump kinds and their checkers, ``kvselect eval``'s
policies, their budget units and their command-line flags, the API
reference's sections, the test suites' lists.

The records *point* at the rule's code by dotted name (resolved by
:func:`resolve`, checked by the registry test): its reference twin, its
assertions, its cases. The packages users import them from derive their names
from the records, on first use (``kvselect._exports``): :mod:`kvselect` (each
rule's ``api``), :mod:`kvselect.reference` (``twins``), :mod:`kvselect.testing`
(``assertions``) and :mod:`kvselect.testing.cases` (``cases``,
``case_functions``). So the code may live where it was first written (the
earlier rules' twins in ``kvselect/reference/<rule>.py``, their assertions in
``kvselect/testing/__init__.py``) or, for a new rule, all in its one module
``kvselect/rules/<rule>.py`` (``docs/adding-a-rule.md``).

A rule module imports nothing at its top that reads the registry while it is
imported: ``kvselect`` (the native API), ``kvselect.checking``'s helpers, the
twin's argument layer ``kvselect.reference._args``, the assertions' helpers
``kvselect.testing._assert`` and ``kvselect.testing.cases.Case`` are all safe, since those packages
read the registry only when a name is asked of them; the layers that read the
registry at their top (``kvselect.evaluate``, the CLI) are not imported by a
rule module.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

if TYPE_CHECKING:  # annotations only: evaluate imports this module
    from kvselect.evaluate.settings import Settings

#: A dump key's row: (dtype class, shape, when required, meaning). The dtype
#: classes: "float" (float16/32/64, or raw bits with an ``X_format``), "int"
#: (any integer dtype), "int scalar", "number", "str", "cache".
KeyRow = Tuple[str, str, str, str]

#: A dump checker: ``(dump, atol, rtol, precision, filler) -> [(name, report)]``,
#: one named report per check the kind runs.
Checker = Callable[[Mapping[str, np.ndarray], float, float, str, str], Sequence[Tuple[str, Mapping[str, Any]]]]


@dataclass(frozen=True, repr=False)
class DumpKind:
    """A ``kind`` of the one dump format that ``kvselect check`` reads.

    Attributes
    ----------
    name : str
        The ``kind`` string stored in the dump.
    table : mapping of str to KeyRow
        Every key the kind may hold (``docs/dump-format.md`` is these
        tables); a key outside it is refused.
    note : str
        The kind's paragraph in ``docs/dump-format.md``.
    check : Checker
        Checks a validated dump of the kind.
    exact : bool
        The kind's rule has no tolerance (the witness rule): its report's
        tolerance reads ``"exact"``, 0, 0.
    fillers : bool
        The kind's rows take a ``filler`` (token top-k rows).
    no_rtol : callable or None
        ``dump -> why no relative tolerance applies to it`` (None when one
        does): a dump that carries no error scale for its scores is checked
        at ``rtol = 0`` unless the caller gives one, and the report says why.
    row_keys : tuple of str
        The keys with one entry per dump row, cut when a dump is checked in
        chunks of rows (``kvselect check --chunk-rows``); every other key is
        shared by the rows. Empty: the dump is checked in one piece.
    rows : callable
        ``dump -> its number of rows`` (default: ``len(dump["rows"])``).
    row_axis : callable
        ``(dump, key) -> the axis of key that runs over the rows`` (default 0).
    heads : callable
        ``dump -> report rows per dump row`` (a blocks dump reports each
        query's KV heads as rows ``query * heads + head``; default 1).
    assert_case : callable or None
        ``(case, rows) -> report``: how a :class:`kvselect.testing.cases.Case`
        of this kind checks a kernel's rows (:meth:`Case.assert_rows`). None:
        the rule's first assertion, called as ``assertion(rows, **case.inputs,
        **case.check)``.
    """

    name: str
    table: Mapping[str, KeyRow]
    note: str
    check: Checker
    exact: bool = False
    fillers: bool = False
    no_rtol: Optional[Callable[[Mapping[str, np.ndarray]], Optional[str]]] = None
    row_keys: Tuple[str, ...] = ()
    rows: Callable[[Mapping[str, np.ndarray]], int] = field(default=lambda d: len(d["rows"]))
    row_axis: Callable[[Mapping[str, np.ndarray], str], int] = field(default=lambda d, key: 0)
    heads: Callable[[Mapping[str, np.ndarray]], int] = field(default=lambda d: 1)
    assert_case: Optional[Callable[[Any, Any], Any]] = None

    def __repr__(self) -> str:
        return f"DumpKind({self.name!r})"


@dataclass(frozen=True, repr=False)
class BudgetUnit:
    """What a policy's budget counts, charged against the one token budget ``k``.

    A policy that selects whole units (blocks, pages) of ``size`` tokens gets
    ``k // size`` of them; its ``forced`` units (init and local blocks, a
    forced last page) come out of those. A policy is ``n/a`` at a budget that
    holds no whole unit or less than its forced units, with that reason.

    Attributes
    ----------
    noun : str
        One unit, in messages (``"token"``, ``"block"``).
    size : callable
        ``settings -> tokens per unit``.
    forced : callable
        ``settings -> units the rule always selects``.
    """

    noun: str
    size: Callable[["Settings"], int] = field(default=lambda s: 1)
    forced: Callable[["Settings"], int] = field(default=lambda s: 0)

    def units(self, s: "Settings") -> int:
        """The budget in units: ``k // size``."""
        return s.budget // self.size(s)

    def note(self, s: "Settings") -> Optional[str]:
        """Why a policy counted in these units cannot run at ``s`` (None if it can)."""
        size, units, forced = self.size(s), self.units(s), self.forced(s)
        if units < 1:
            return f"the budget ({s.budget}) holds no {self.noun} of {size} tokens"
        if forced > units:
            return (
                f"its forced {self.noun}s alone ({forced} of {size} tokens) exceed the budget "
                f"({s.budget} tokens, {units} {self.noun}s)"
            )
        return None

    def __repr__(self) -> str:
        return f"BudgetUnit({self.noun!r})"


#: One slot per token: the budget is ``k`` tokens.
TOKENS = BudgetUnit("token")


@dataclass
class Selection:
    """A policy's selection of one head: ``rows`` ``[n, width]`` (int32, -1
    padded, at most ``k`` distinct valid positions a row) and the seconds it
    was charged. ``dense``: the rule reads every visible position on this
    head (Quest's dense first layers), its rows wider than ``k``."""

    rows: np.ndarray
    seconds: float
    dense: bool = False


def timed(fn: Callable[[], np.ndarray]) -> Selection:
    """``fn()``'s rows, charged the wall time the call took."""
    t0 = time.perf_counter()
    rows = fn()
    return Selection(rows, time.perf_counter() - t0)


@dataclass
class EvalContext:
    """What a policy selects from, for one KV head at one budget.

    Attributes
    ----------
    head : Any
        The head's tensors (``kvselect.evaluate``'s ``_Head``: ``q``, ``k``,
        ``v``, ``index_q``, ``index_k``, ``learned`` (the indexer's inputs),
        ``probs`` (dense attention probabilities ``[n, group, T]``),
        ``scale``, ``layers`` (the workload's layers), and in the boundary
        experiment ``observe``: the queries of the prefix ``[P, group, d]``).
    pos : ndarray of int64, [n]
        The query positions (in the boundary experiment, a per-query
        policy is asked at ``P - 1``: its budget spent on the prefix).
    settings : Settings
        The run's settings (``settings.budget`` is ``k``).
    units : int
        The policy's budget in its own unit (:meth:`BudgetUnit.units`).
    done : dict of str to Selection
        The selections of the policies before this one at this budget (a
        policy that builds on another's rows reads them here).
    """

    head: Any
    pos: np.ndarray
    settings: "Settings"
    units: int
    done: Dict[str, Selection]

    @property
    def lens(self) -> np.ndarray:
        """Each query's context, ``pos + 1``, int32."""
        return (self.pos + 1).astype(np.int32)


@dataclass(frozen=True, repr=False)
class Knob:
    """A setting a policy takes, with its ``kvselect eval`` flag.

    Attributes
    ----------
    field : str
        The :class:`kvselect.evaluate.Settings` field.
    flag : str
        Its command-line flag.
    help : str
        The flag's help.
    minimum : int
        1 for a count that must be positive, 0 for one that may be zero.
    """

    field: str
    flag: str
    help: str
    minimum: int = 1

    def __repr__(self) -> str:
        return f"Knob({self.field!r})"


@dataclass(frozen=True, repr=False)
class Policy:
    """A selection policy ``kvselect eval`` compares at the one budget.

    Attributes
    ----------
    name : str
        Its row in the table.
    select : callable
        ``EvalContext -> Selection``, or a ``str``: why it cannot run on
        this head (the table's ``n/a`` note).
    doc : str
        One sentence: what it selects.
    unit : BudgetUnit
        What its budget counts (:data:`TOKENS` by default).
    knobs : tuple of Knob
        The settings it takes (each declared by one policy, the first that
        uses it).
    eviction : bool
        An eviction policy: it decides once, at the boundary, from the
        prefix (``ctx.head.observe``), and runs only in the boundary
        experiment (``Settings.boundary``); a per-query policy (False) runs
        in both.
    """

    name: str
    select: Callable[[EvalContext], Union[Selection, str]]
    doc: str
    unit: BudgetUnit = TOKENS
    knobs: Tuple[Knob, ...] = ()
    eviction: bool = False

    def __repr__(self) -> str:
        return f"Policy({self.name!r})"


@dataclass(frozen=True, repr=False)
class Rule:
    """A selection rule, every piece of it in one record.

    Attributes
    ----------
    name : str
        The rule's name (its module in :mod:`kvselect.rules`).
    title : str
        Its section title in the API reference.
    api : tuple of str
        Its native names (of ``kvselect.__all__``), its API reference section.
    reference : str or None
        The dotted module of its reference twin: a module of
        :mod:`kvselect.reference` (``"kvselect.reference.moba"``), or the rule's
        own module (``"kvselect.rules.<rule>"``) when the twin is written there.
    twins : tuple of str
        The twin's public names (functions, classes, constants of the
        ``reference`` module): :mod:`kvselect.reference` exports each under
        its name, and its ``__all__`` is the shared names and these.
    assertions : tuple of str
        The dotted names of its assertions, where they are defined
        (``"kvselect.testing.assert_moba"``, or ``"kvselect.rules.<rule>.assert_<rule>"``):
        :mod:`kvselect.testing` exports each under its last component.
    cases : str or None
        The dotted name of its cases' generator (``all_<rule>_cases``: every
        input that has broken its kernels), exported by
        :mod:`kvselect.testing.cases` under its last component.
    case_functions : tuple of str
        The dotted names of its public case generators (one input each), exported
        by :mod:`kvselect.testing.cases` likewise.
    dumps : tuple of DumpKind
        The dump kinds ``kvselect check`` reads for it.
    policies : tuple of Policy
        Its ``kvselect eval`` policies.
    guide : str or None
        Its page under ``docs/``.
    """

    name: str
    title: str
    api: Tuple[str, ...] = ()
    reference: Optional[str] = None
    twins: Tuple[str, ...] = ()
    assertions: Tuple[str, ...] = ()
    cases: Optional[str] = None
    case_functions: Tuple[str, ...] = ()
    dumps: Tuple[DumpKind, ...] = ()
    policies: Tuple[Policy, ...] = ()
    guide: Optional[str] = None

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"


def resolve(dotted: str) -> Any:
    """The object a dotted name names: a module (``kvselect.reference.witness``)
    or a module's attribute (``kvselect.testing.assert_blocks``)."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, attr = dotted.rpartition(".")
        return getattr(importlib.import_module(module), attr)
