"""The evaluation's settings: the policies, one budget, and the settings derived
from a workload (part of :mod:`kvselect.evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import kvselect as ks
from kvselect import rules

POLICIES = tuple(p.name for p in rules.policies() if not p.eviction)
"""The per-query policies, in the table's order: every rule's (:mod:`kvselect.rules`)."""

EVICTION_POLICIES = tuple(p.name for p in rules.policies() if p.eviction)
"""The eviction baselines: rows of the boundary experiment only, after :data:`POLICIES`."""

AUTO_BOUNDARY = 0
"""``Settings.boundary`` for "the first evaluated query position": the
boundary that leaves every evaluated query after it (an empty prefix has
nothing to keep, so 0 is free to mean this)."""


@dataclass(frozen=True)
class Settings:
    """What the harness compares at: the budget ``k``, the witness segment
    count ``S``, the block geometry and the nulls' knobs.

    Attributes
    ----------
    budget : int
        The token budget ``k``: slots per query row.
    segments : int
        The witness segment count ``S``.
    block_size, init_blocks, local_blocks : int
        Block-sparse's block geometry: tokens per block, forced init blocks,
        forced local blocks.
    sinks : int
        The sink + window policy's sink count.
    quest_page_size : int
        Quest's page, in tokens.
    quest_dense_layers : int
        Quest's dense first layers (its model code's ``_quest_skip_layer``,
        2): on a workload of more than one layer, Quest's rows on layers
        below it read every visible position (more than ``k``: the table
        says so); 0 keeps Quest at the identical budget on every layer.
    snapkv_window : int
        SnapKV's (and PyramidKV's) observation window, in queries.
    h2o_recent : int or None
        H2O's recent positions, out of the budget (the rest heavy hitters);
        None: ``budget // 2`` (H2O's equal shares), at any budget.
    infllm_local_blocks : int or None
        InfLLM-v2's local window in blocks of 64; None: half the budget's
        blocks (MiniCPM4's 32 of 64).
    boundary : int or None
        The boundary experiment's ``P`` (None: the per-query experiment;
        :data:`AUTO_BOUNDARY`, 0: the first evaluated query position of
        each workload). See :func:`kvselect.evaluate.resolve_boundary`.
    seed : int
        The seed of the random null and of the unordered served row's
        shuffle.
    """

    budget: int = 2048
    segments: int = 64
    block_size: int = 64
    init_blocks: int = 1
    local_blocks: int = 2
    sinks: int = 4
    quest_page_size: int = 16
    quest_dense_layers: int = 2
    snapkv_window: int = 64
    h2o_recent: Optional[int] = None
    infllm_local_blocks: Optional[int] = None
    boundary: Optional[int] = None
    seed: int = 0

    def check(self) -> None:
        """Refuses settings that cannot work at all. A block larger than the
        budget is not refused: block-sparse then cannot run at this budget
        and is reported ``n/a`` (see :meth:`block_sparse_note`) while the
        other policies run.

        Returns
        -------
        None

        Raises
        ------
        ValueError
            A budget below 1, ``segments`` outside ``1..64`` or past the
            budget, ``block_size`` below 1, negative ``init_blocks`` /
            ``local_blocks`` / ``sinks``, or fixed blocks that exceed the budget.
        """
        if self.budget < 1:
            raise ValueError(f"budget must be at least 1, got {self.budget}")
        if not 1 <= self.segments <= ks.MAX_TOPOLOGY_SEGMENTS:
            raise ValueError(f"segments must be in 1..{ks.MAX_TOPOLOGY_SEGMENTS}, got {self.segments}")
        if self.segments > self.budget:
            raise ValueError(
                f"segments ({self.segments}) cannot exceed the budget ({self.budget}): the witnesses need a slot each"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        if self.quest_page_size < 1:
            raise ValueError(f"quest_page_size must be at least 1, got {self.quest_page_size}")
        if self.quest_dense_layers < 0:
            raise ValueError(f"quest_dense_layers must be non-negative, got {self.quest_dense_layers}")
        if self.snapkv_window < 1:
            raise ValueError(f"snapkv_window must be at least 1, got {self.snapkv_window}")
        if self.h2o_recent is not None and self.h2o_recent < 0:
            raise ValueError(f"h2o_recent must be non-negative, got {self.h2o_recent}")
        if self.infllm_local_blocks is not None and self.infllm_local_blocks < 0:
            raise ValueError(f"infllm_local_blocks must be non-negative, got {self.infllm_local_blocks}")
        if self.boundary is not None and self.boundary < 0:
            raise ValueError(f"boundary must be non-negative (0: the first evaluated query), got {self.boundary}")
        if self.init_blocks < 0 or self.local_blocks < 0 or self.sinks < 0:
            raise ValueError("init_blocks, local_blocks and sinks must be non-negative")
        if self.budget >= self.block_size and self.block_size * (self.init_blocks + self.local_blocks) > self.budget:
            raise ValueError(
                f"init_blocks + local_blocks ({self.init_blocks} + {self.local_blocks}) "
                f"blocks of {self.block_size} exceed the budget ({self.budget})"
            )

    def block_sparse_note(self) -> Optional[str]:
        """Why block-sparse cannot run at these settings (``None`` if it can):
        the budget holds no whole block, or not its forced blocks (its
        budget unit's note, :class:`kvselect.rules.BudgetUnit`).

        Returns
        -------
        str or None
            The reason, for the table's ``n/a`` row, or None.
        """
        return rules.policy("block-sparse").unit.note(self)


class SettingsError(ValueError):
    """Settings that cannot work (a :class:`ValueError`), raised by
    :func:`derive_settings`.

    Attributes
    ----------
    fields : tuple of str
        The settings the caller gave that would have to change (empty when
        none of them is to blame).
    """

    def __init__(self, message: str, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


#: The settings :func:`derive_settings` may derive from the budget, with the
#: defaults they take whenever the budget allows: every policy's settings
#: (:func:`kvselect.rules.knobs`).
DERIVED_FIELDS = tuple(k.field for k in rules.knobs())


def derive_settings(
    budget: int,
    *,
    segments: Optional[int] = None,
    block_size: Optional[int] = None,
    init_blocks: Optional[int] = None,
    local_blocks: Optional[int] = None,
    sinks: Optional[int] = None,
    quest_page_size: Optional[int] = None,
    quest_dense_layers: Optional[int] = None,
    snapkv_window: Optional[int] = None,
    h2o_recent: Optional[int] = None,
    infllm_local_blocks: Optional[int] = None,
    boundary: Optional[int] = None,
    seed: int = 0,
    names: Optional[Mapping[str, str]] = None,
) -> Tuple[Settings, Dict[str, int]]:
    """The settings at ``budget``.

    What the caller gave (not ``None``) is kept, what it left out is derived
    from the budget.

    The derivation keeps :class:`Settings`' defaults (S = 64, blocks of 64,
    1 init + 2 local blocks, 4 sinks) wherever the budget allows them (so a
    run that worked on the defaults is unchanged), and scales only what must
    scale with ``k``:

    - ``segments``: ``min(64, max(1, k // 8))``: 64 from ``k = 512`` on, at
      most an eighth of the row below (S = k would leave the reserved tail no
      learned slot and overwrite the whole row as served);
    - ``block_size``: the largest power of two up to 64 whose forced blocks
      (``init_blocks + local_blocks``, at least one block) fit the budget;
      64 from ``k = 192`` on with the default 1 + 2 forced blocks;
    - ``init_blocks``, ``local_blocks``: trimmed, init blocks first, when the
      forced blocks do not fit the budget's ``k // block_size`` blocks (with
      a given ``block_size``, or below 3 tokens);
    - ``sinks``: ``min(4, k - 1)`` (the window keeps one slot);
    - ``quest_page_size``: the largest power of two up to 16 (Quest's page)
      that fits the budget: 16 from ``k = 16`` on (a given page larger than
      the budget makes Quest ``n/a``).

    A given ``block_size`` larger than the budget is kept: block-sparse is
    then ``n/a`` at this budget (:meth:`Settings.block_sparse_note`).

    Parameters
    ----------
    budget : int
        The token budget ``k`` (at least 1).
    segments, block_size, init_blocks, local_blocks, sinks, quest_page_size, quest_dense_layers, snapkv_window, h2o_recent, infllm_local_blocks : int or None
        The settings the caller gives; ``None`` derives it from the budget
        as above.
    boundary : int or None
        :attr:`Settings.boundary`, kept as given.
    seed : int
        :attr:`Settings.seed`, kept as given.
    names : mapping of str to str, optional
        How the caller spells each field in error messages
        (``{"local_blocks": "--local-blocks"}``, say; the field names by
        default).

    Returns
    -------
    settings : Settings
        The checked settings at ``budget``.
    derived : dict of str to int
        The derived values that differ from the defaults (empty when the
        defaults fit).

    Raises
    ------
    SettingsError
        A budget below 1, or a given setting that cannot work, naming it
        (as ``names`` spells it) in the message and in ``fields``.
    ValueError
        Settings that :meth:`Settings.check` refuses.
    """
    spell = dict(names or {})

    def name(f: str) -> str:
        return spell.get(f, f)

    d = Settings()
    k = int(budget)
    if k < 1:
        raise SettingsError(f"budget must be at least 1, got {k}")
    derived: Dict[str, int] = {}

    if segments is None:
        # At most an eighth of the row: S = k would make the reserved tail
        # all witnesses and the as-served row none of the learned top-k.
        segs = min(d.segments, max(1, k // 8))
    else:
        segs = int(segments)
        if not 1 <= segs <= ks.MAX_TOPOLOGY_SEGMENTS:
            raise SettingsError(
                f"{name('segments')} must be in 1..{ks.MAX_TOPOLOGY_SEGMENTS}, got {segs}",
                ["segments"],
            )
        if segs > k:
            raise SettingsError(
                f"{name('segments')} ({segs}) cannot exceed the budget ({k}): the witnesses "
                f"need a slot each; lower {name('segments')}, or leave it out to use "
                f"min({d.segments}, max(1, k // 8))",
                ["segments"],
            )

    init = d.init_blocks if init_blocks is None else int(init_blocks)
    local = d.local_blocks if local_blocks is None else int(local_blocks)
    if block_size is None:
        bs = d.block_size
        while bs > 1 and max(init + local, 1) * bs > k:
            bs //= 2
    else:
        bs = int(block_size)
        if bs < 1:
            raise SettingsError(f"{name('block_size')} must be at least 1, got {bs}", ["block_size"])
    blocks = k // bs
    if blocks >= 1 and init + local > blocks:
        # Trim what was not given; the newest blocks (the query's own) last.
        if init_blocks is None:
            init = max(0, min(init, blocks - local))
        if local_blocks is None:
            local = max(0, min(local, blocks - init))
        if init + local > blocks:
            given = [
                f
                for f, v in (("init_blocks", init_blocks), ("local_blocks", local_blocks), ("block_size", block_size))
                if v is not None
            ]
            raise SettingsError(
                f"{init} init + {local} local blocks of {bs} tokens "
                f"({(init + local) * bs} tokens) exceed the budget ({k}): lower " + " or ".join(name(f) for f in given),
                given,
            )

    if sinks is None:
        sink = min(d.sinks, k - 1)
    else:
        sink = int(sinks)
        if sink < 0:
            raise SettingsError(f"{name('sinks')} must be non-negative, got {sink}", ["sinks"])
        if sink >= k:
            raise SettingsError(
                f"{name('sinks')} ({sink}) leaves no slot for the window at the budget "
                f"({k}): lower {name('sinks')}, or leave it out to use min({d.sinks}, k - 1)",
                ["sinks"],
            )

    if quest_page_size is None:
        qp = d.quest_page_size
        while qp > 1 and qp > k:  # one page (the forced last one) must fit
            qp //= 2
    else:
        qp = int(quest_page_size)
    if qp < 1:
        raise SettingsError(f"{name('quest_page_size')} must be at least 1, got {qp}", ["quest_page_size"])

    dense_layers = d.quest_dense_layers if quest_dense_layers is None else int(quest_dense_layers)
    if dense_layers < 0:
        raise SettingsError(
            f"{name('quest_dense_layers')} must be non-negative, got {dense_layers}", ["quest_dense_layers"]
        )

    window = d.snapkv_window if snapkv_window is None else int(snapkv_window)
    if window < 1:
        raise SettingsError(f"{name('snapkv_window')} must be at least 1, got {window}", ["snapkv_window"])
    recent = None if h2o_recent is None else int(h2o_recent)
    if recent is None:
        pass
    elif recent < 0:
        raise SettingsError(f"{name('h2o_recent')} must be non-negative, got {recent}", ["h2o_recent"])
    elif recent > k:
        raise SettingsError(
            f"{name('h2o_recent')} ({recent}) exceeds the budget ({k}): lower it, or leave it out to use k // 2",
            ["h2o_recent"],
        )

    infllm_local = None if infllm_local_blocks is None else int(infllm_local_blocks)
    if infllm_local is not None and infllm_local < 0:
        raise SettingsError(
            f"{name('infllm_local_blocks')} must be non-negative, got {infllm_local}", ["infllm_local_blocks"]
        )

    s = Settings(
        budget=k,
        segments=segs,
        block_size=bs,
        init_blocks=init,
        local_blocks=local,
        sinks=sink,
        quest_page_size=qp,
        quest_dense_layers=dense_layers,
        snapkv_window=window,
        h2o_recent=recent,
        infllm_local_blocks=infllm_local,
        boundary=boundary,
        seed=seed,
    )
    given_values = dict(
        segments=segments,
        block_size=block_size,
        init_blocks=init_blocks,
        local_blocks=local_blocks,
        sinks=sinks,
        quest_page_size=quest_page_size,
        quest_dense_layers=quest_dense_layers,
        snapkv_window=snapkv_window,
        h2o_recent=h2o_recent,
        infllm_local_blocks=infllm_local_blocks,
    )
    for f in DERIVED_FIELDS:
        if given_values[f] is None and getattr(s, f) != getattr(d, f):
            derived[f] = getattr(s, f)
    s.check()
    return s, derived
