"""A package's public names derived from the rules' registry, read on first use.

``kvselect``, ``kvselect.reference``, ``kvselect.testing`` and
``kvselect.testing.cases`` each export the names no one rule owns (listed in
the package) and every rule's pieces of their kind, declared once in the
rule's record (:class:`kvselect.rules.Rule`: ``api``, ``twins``,
``assertions``, ``cases`` and ``case_functions``). The package's ``__all__``
is computed from the registry whenever it is read, and a rule's piece that is
not already a name of the package (a rule that keeps its twin, assertion and
cases in its own module, ``kvselect/rules/<rule>.py``) is imported from where
the record says when it is first read (PEP 562 module ``__getattr__``).

Why on first use, not at import: the registry imports every rule module, and a
rule module imports these packages' helpers at its top (the twin's argument
layer ``kvselect.reference._args``, the assertions' ``kvselect.testing``
helpers, ``kvselect.testing.cases.Case``). Reading the registry while one of
these packages is first imported would be an import cycle; reading it when a
name is asked for is not, since by then both are imported. What would break
it: a package reading ``__all__`` or a rule's piece at its own import time.

The existing rules' pieces stay where they were written (``kvselect.reference.moba``,
``kvselect.testing.assert_moba``): the package's own names win, and the record
names them where they are (``tests/python/test_rules.py`` checks that each
package's name is the object its record names). Type checkers see the names
bound in the package (and ``kvselect``'s natives through ``_core``'s stub);
a piece that lives only in its rule's module is typed ``Any`` through
``__getattr__`` (its own module is fully typed).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Sequence

if TYPE_CHECKING:
    from kvselect.rules._rule import Rule


class RuleExports:
    """The names package ``package`` derives from the registry.

    Parameters
    ----------
    package : str
        The package's dotted name (its module in ``sys.modules``).
    shared : callable
        ``() -> names`` the package exports that no one rule owns, first in
        ``__all__``, in their order (a callable: ``kvselect``'s come from the
        registry module too).
    pieces : callable
        ``rule -> dotted names`` of the rule's pieces the package exports, each
        under its last component, in ``__all__`` in the rules' order.
    shared_first : bool
        The shared names before the rules' pieces in ``__all__`` (else after).
    """

    def __init__(
        self,
        package: str,
        shared: Callable[[], Sequence[str]],
        pieces: Callable[["Rule"], Iterable[str]],
        shared_first: bool = True,
    ) -> None:
        self.package = package
        self.shared = shared
        self.pieces = pieces
        self.shared_first = shared_first

    def dotted(self) -> Dict[str, str]:
        """Every rule's piece by the name the package exports it under, in the
        rules' order (the registry read now: nothing is cached, so a changed
        registry is seen).

        Raises
        ------
        ValueError
            Two pieces would be exported under one name.
        """
        from kvselect.rules import RULES

        out: Dict[str, str] = {}
        for rule in RULES:
            for dotted in self.pieces(rule):
                name = dotted.rpartition(".")[2]
                if out.get(name, dotted) != dotted:
                    raise ValueError(f"{self.package}.{name}: both {out[name]} and {dotted} (two rules' pieces)")
                out[name] = dotted
        return out

    def all(self) -> List[str]:
        """The package's ``__all__``: the shared names and every rule's pieces."""
        shared = list(self.shared())
        owned = [n for n in self.dotted() if n not in shared]
        return shared + owned if self.shared_first else owned + shared

    def getattr(self, name: str) -> Any:
        """The module ``__getattr__``: ``__all__``, or a rule's piece the package
        does not bind itself (imported from the rule's module)."""
        if name == "__all__":
            return self.all()
        if not name.startswith("_"):
            try:
                dotted = self.dotted().get(name)
            except ImportError as e:  # the registry is itself being imported: not a piece yet
                raise AttributeError(f"module {self.package!r} has no attribute {name!r} ({e})") from None
            if dotted is not None and dotted.rpartition(".")[0] != self.package:
                from kvselect.rules._rule import resolve

                return resolve(dotted)
        raise AttributeError(f"module {self.package!r} has no attribute {name!r}")

    def dir(self) -> List[str]:
        """The module ``__dir__``: its own names and the derived ones."""
        return sorted(set(vars(sys.modules[self.package])) | set(self.all()))
