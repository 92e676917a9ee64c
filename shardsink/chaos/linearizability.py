"""Is a chaos run's history (:mod:`.history`) linearizable? Per shard, by the
Wing-Gong-Lowe search that Knossos and Porcupine use.

A history is linearizable if its operations can be put in one order that
keeps real time (an op that completed before another was invoked comes
first) in which every op's recorded result is what the sequential
:class:`Model` gives. Shards are independent (the consensus protocol keeps
each shard's log on its own), so each is checked alone (P-compositionality).

Before the search, ``fail`` ops are dropped (they did not happen), and so
are reads that did not complete (a read changes nothing). An ``info`` op
may have taken effect or not: it may be put anywhere after its invocation,
or left out. The search (Lowe's formulation of Wing and Gong's) walks the
ops' call and return events in time order, linearizing an op whose call
comes before every pending return and backing up at a return it could not
reach; it remembers every (set of linearized ops, model state) it reached,
so no such configuration is explored twice. Three reductions keep it near
one step per op, each exact: the ``info`` ops a state may take are looked
up by what they need of it (:meth:`Model.needs`), and forgotten once the
state has passed that for good; an op that changes nothing is taken at
once if it must be, and never if it may; and :class:`ShardModel` keeps only
the tokens some retry could tell apart. Its budget is a count of model
steps, not seconds, so a verdict is the same on any machine: past it the
shard is undecided (``unknown``), never a hang.

On a violation the checker finds a short failing sub-history. Every cut it
makes only weakens what the history says, so the sub-history failing
proves the whole one fails: it ends the history at the op at whose return
the search got furthest (no op invoked later can help), summarizes the ops
before a cut by every state they can leave the shard in, takes ops that
straddle the cut as may-or-may-not, and then turns each remaining op into
a may-or-may-not while the rest still fails. What is left is printed: the
start states (each with one op that led there) and the ops that cannot be
linearized from them.

How long: a simulated 300 s run (4 racing coordinators committing about
one append a second, 4 readers reading every 50 ms, 2% of replies lost:
24,496 ops, 15 ``info`` appends) is checked in 0.13-0.18 s, and with its
last read made stale, rejected with its one-op witness in 0.29-0.38 s; at
the pace of a real chaos run (about 50 appends a second, 5% of replies
lost: 69,856 ops, 2,370 ``info`` appends) in 0.54-0.75 s and 1.14-1.84 s
(``python -m tests.chaos.test_linearizability``, three runs on the 2-core
machine shared with other work).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import Literal, NamedTuple, Protocol, TypeVar

import msgspec

from ..server import Op, describe

S = TypeVar("S", bound=Hashable)

#: Model steps a shard's search may take, and its minimisation again.
MAX_STEPS = 5_000_000

#: The time of the end of the events: after every op.
_NEVER = 1 << 63

#: Lines of a witness: start states shown, ops shown.
_STATES_SHOWN = 3
_OPS_SHOWN = 40


class Model(Protocol[S]):
    """A sequential specification of one shard, for the search.

    Invariants every model keeps:

    - ``initial()`` is the state before any op; ``step`` is pure: the same
      state and op give an equal result, and ``state`` is never changed.
    - States are hashable, and equal states are interchangeable: the search
      remembers configurations by them.
    - ``step(state, op)`` is the state after ``op`` with its recorded
      outcome (``ok``, ``already``, ``mismatch``), or ``None`` if that
      outcome is impossible from ``state``. For an ``info`` op it is the
      state after the op took effect, or ``None`` if it can take none from
      ``state`` (leaving it out, which the search always tries, is then the
      same).
    - ``step`` never sees a ``fail`` op or a read that did not complete.
    - ``needs(op)``, if not ``None``, is what ``offers(state)`` must be for
      ``step(state, op)`` to be anything but ``None``; what states offer is
      ordered (with what ops need) and never goes down:
      ``offers(step(state, op)) >= offers(state)``. So the search looks up
      the ops a state may take by what it offers, and an op that needs less
      than a state offers can never step again. A model with nothing to
      tell answers ``None`` to both.
    """

    def initial(self) -> S: ...

    def step(self, state: S, op: Op) -> S | None: ...

    def needs(self, op: Op) -> Hashable | None: ...

    def offers(self, state: S) -> Hashable: ...


class Register(msgspec.Struct, frozen=True):
    """A shard as the consensus protocol's clients see it: its ``upper``
    and each writer's last applied token, as ``(writer, token)`` pairs (of
    :class:`ShardModel`, only those it keeps)."""

    upper: int
    tokens: frozenset[tuple[str, str]]

    def __str__(self) -> str:
        last = ", ".join(f"{w}={t}" for w, t in sorted(self.tokens))
        return f"upper {self.upper}" + (f", last tokens: {last}" if last else "")


class ShardModel:
    """The shard's compare-and-append (``persist.transitions``), as a
    :class:`Model` over :class:`Register` states: an append whose token is
    its writer's last is ``already`` and changes nothing (the server looks at
    the token before the upper); otherwise it commits iff the upper is its
    ``lower``, moving it to its ``upper``, else is a ``mismatch`` seeing the
    upper as ``actual``. A read returns the upper. A commit is ``ok``, or
    ``already`` too: a server whose store call failed without knowing
    whether it stored retries from the head, finds the token its own call
    applied, and answers ``already`` (so an ``already`` took effect before
    its op returned, in it or before it).

    With ``retried`` (:meth:`of` a shard's history), a writer's last token
    is kept only if it is among these (writer, token) pairs, those more than
    one op carries: no op can tell another token from none. Else the states
    of two ways through the history that differ only in which writer's
    lone ``info`` append took effect (two coordinators killed mid-append)
    would stay apart to the end, and each such pair would double the search."""

    def __init__(self, retried: frozenset[tuple[str | None, str | None]] | None = None) -> None:
        self.retried = retried

    @classmethod
    def of(cls, ops: Iterable[Op]) -> ShardModel:
        """The model for a shard's history ``ops``, keeping only retried tokens."""
        carried = Counter((op.writer, op.token) for op in ops if op.kind == "append")
        return cls(frozenset(pair for pair, n in carried.items() if n > 1))

    def initial(self) -> Register:
        return Register(0, frozenset())

    def needs(self, op: Op) -> int | None:
        """The upper ``op`` can step from: an ``already`` needs only its token."""
        if op.kind == "read":
            return op.upper
        return {"mismatch": op.actual, "already": None}.get(op.outcome, op.lower)

    def offers(self, state: Register) -> int:
        return state.upper

    def step(self, state: Register, op: Op) -> Register | None:
        if op.kind == "read":
            return state if op.upper == state.upper else None
        if (op.writer, op.token) in state.tokens:
            return state if op.outcome == "already" else None
        if op.outcome == "mismatch":
            return state if state.upper == op.actual != op.lower else None
        if state.upper != op.lower:
            return None
        assert op.writer is not None and op.token is not None and op.upper is not None
        tokens = [pair for pair in state.tokens if pair[0] != op.writer]
        if self.retried is None or (op.writer, op.token) in self.retried:
            tokens.append((op.writer, op.token))
        return Register(op.upper, frozenset(tokens))


class ShardCheck(msgspec.Struct, kw_only=True, frozen=True):
    """One shard's check: ``ops`` checked, ``info`` of them, ``dropped``
    (``fail`` ops and reads that did not complete), the model ``steps`` the
    search took (and the minimisation, if any); ``valid`` is ``None`` when
    the budget ran out first. An invalid shard has its failing sub-history
    in ``witness``, one line each."""

    shard: str
    ops: int
    info: int
    dropped: int
    steps: int
    valid: bool | None
    reason: str = ""
    witness: tuple[str, ...] = ()


class Result(msgspec.Struct, kw_only=True, frozen=True):
    """A history's check: ``valid`` iff every shard was decided linearizable."""

    valid: bool
    shards: tuple[ShardCheck, ...]

    def lines(self) -> list[str]:
        """The check in words: a line per shard, each witness below its shard."""
        out = []
        for s in self.shards:
            status = {True: "linearizable", False: "NOT linearizable", None: "undecided"}[s.valid]
            out.append(
                f"shard {s.shard}: {status}: {s.ops:,} ops ({s.info:,} info, {s.dropped:,} "
                f"dropped), {s.steps:,} model steps" + (f"; {s.reason}" if s.reason else "")
            )
            out += [f"  {line}" for line in s.witness]
        return out


class Verdict(msgspec.Struct, frozen=True):
    """``valid``, ``invalid`` or ``unknown``, and why in words."""

    verdict: Literal["valid", "invalid", "unknown"]
    reason: str


def verdict(result: Result, appended_ops: int, min_ops: int) -> Verdict:
    """A run's verdict: ``invalid`` if any shard is not linearizable;
    ``unknown`` if a shard was undecided within the budget, or the run
    recorded fewer than ``min_ops`` appends (``appended_ops``: too few to
    judge); ``valid`` otherwise."""
    bad = [s for s in result.shards if s.valid is False]
    if bad:
        return Verdict("invalid", "; ".join(f"shard {s.shard}: {s.reason}" for s in bad))
    undecided = [s for s in result.shards if s.valid is None]
    if undecided:
        return Verdict("unknown", "; ".join(f"shard {s.shard}: {s.reason}" for s in undecided))
    if appended_ops < min_ops:
        return Verdict("unknown", f"{appended_ops} appends recorded, fewer than {min_ops} to judge")
    ops = sum(s.ops for s in result.shards)
    return Verdict("valid", f"{_n(ops, 'op')} on {_n(len(result.shards), 'shard')} linearizable")


def check(ops: Iterable[Op], model: Model | None = None, *, max_steps: int = MAX_STEPS) -> Result:
    """Check ``ops`` (a history, in any order) shard by shard against
    ``model`` (by default each shard's :meth:`ShardModel.of` its ops), each
    shard's search and its minimisation within ``max_steps`` model steps."""
    shards: dict[str, list[Op]] = {}
    for op in ops:
        shards.setdefault(op.shard, []).append(op)
    if not shards:
        return Result(valid=True, shards=())
    origin = min(op.invoke_ns for of in shards.values() for op in of)
    checks = tuple(
        _check_shard(name, shards[name], model, max_steps, origin) for name in sorted(shards)
    )
    return Result(valid=all(c.valid for c in checks), shards=checks)


def _check_shard(
    shard: str, ops: list[Op], model: Model | None, max_steps: int, origin: int
) -> ShardCheck:
    kept = [op for op in ops if op.outcome != "fail" and (op.kind, op.outcome) != ("read", "info")]
    kept.sort(key=lambda op: (op.invoke_ns, op.id))
    model = model if model is not None else ShardModel.of(kept)
    required = [op.outcome != "info" for op in kept]
    found = _search(model, kept, required, [model.initial()], max_steps)
    checked = ShardCheck(
        shard=shard,
        ops=len(kept),
        info=required.count(False),
        dropped=len(ops) - len(kept),
        steps=found.steps,
        valid=found.linearizable,
    )
    if found.linearizable:
        return checked
    if found.linearizable is None:
        reason = f"undecided within {max_steps:,} model steps (max_steps)"
        return msgspec.structs.replace(checked, reason=reason)
    assert found.culprit is not None
    shown, witness, spent = _witness(model, kept, required, found.culprit, max_steps, origin)
    reason = f"{_n(shown, 'op')} cannot be linearized from the states before them"
    return msgspec.structs.replace(
        checked, steps=found.steps + spent, reason=reason, witness=witness
    )


class _Found(NamedTuple):
    """A search's answer: ``linearizable`` (``None``: the budget ran out),
    the ``steps`` taken, the ``culprit`` (the required op at whose return
    the search got furthest, if it failed) and, when collecting, ``ends``:
    every state the ops can all be linearized into, with the index of the
    op that last changed the state on one way there (``None``: none did)."""

    linearizable: bool | None
    steps: int
    culprit: int | None
    ends: dict[Hashable, int | None]


class _Links:
    """The required ops' call and return events in time order, doubly linked,
    so an op's events are taken out and put back in O(1). At equal times a
    call comes first, so the two ops count as concurrent: the clocks were
    read around the calls, not at their effects."""

    def __init__(self, ops: Sequence[Op], required: Sequence[bool]) -> None:
        events = [(op.invoke_ns, 0, i) for i, op in enumerate(ops) if required[i]]
        events += [(op.complete_ns or 0, 1, i) for i, op in enumerate(ops) if required[i]]
        events.sort()
        n = len(events)
        self.tail = n + 1
        self.nxt = [*range(1, n + 2), n + 1]
        self.prv = [0, *range(n + 1)]
        times, kinds, order = zip(*events, strict=True) if events else ((), (), ())
        self.op = [-1, *order, -1]
        self.is_return = [False, *map(bool, kinds), False]
        self.time = [0, *times, _NEVER]
        self.call = [0] * len(ops)
        self.ret = [0] * len(ops)
        for entry, (_, kind, i) in enumerate(events, 1):
            (self.ret if kind else self.call)[i] = entry

    def lift(self, i: int) -> None:
        nxt, prv = self.nxt, self.prv
        for e in (self.call[i], self.ret[i]):
            nxt[prv[e]] = nxt[e]
            prv[nxt[e]] = prv[e]

    def unlift(self, i: int) -> None:
        nxt, prv = self.nxt, self.prv
        for e in (self.ret[i], self.call[i]):
            nxt[prv[e]] = e
            prv[nxt[e]] = e


class _Pool:
    """The optional ops by what they need of the state (:meth:`Model.needs`),
    each kind in order of invocation, so a configuration tries only those
    its state offers: an ``info`` append whose lower the upper has passed is
    never looked at again on that path, nor remembered as used or not."""

    def __init__(self, model: Model, ops: Sequence[Op], required: Sequence[bool]) -> None:
        rank = _ranks(required)
        self.by_need: dict[Hashable, list[int]] = {}
        for i, op in enumerate(ops):
            if not required[i]:
                self.by_need.setdefault(model.needs(op), []).append(i)
        self.invoked = {k: [ops[i].invoke_ns for i in of] for k, of in self.by_need.items()}
        masks = {k: sum(1 << rank[i] for i in of) for k, of in self.by_need.items()}
        self.needs = sorted(k for k in masks if k is not None)
        # alive[j]: the ops that may still step from a state offering needs[j] or less
        alive = list(itertools.accumulate(reversed([masks[k] for k in self.needs]), int.__or__))
        self.alive = [m | masks.get(None, 0) for m in [*reversed(alive), 0]]

    def candidates(self, offered: Hashable, until: int, opt: int, rank: list[int]) -> list[int]:
        """Those not linearized (in ``opt``) invoked by ``until``, to pop earliest first."""
        out: list[int] = []
        for need in {offered, None}:
            of = self.by_need.get(need, [])
            invoked = of[: bisect.bisect_right(self.invoked.get(need, []), until)]
            out += [i for i in invoked if not opt >> rank[i] & 1]
        out.sort(reverse=True)
        return out

    def living(self, opt: int, offered: Hashable) -> int:
        """``opt`` without the ops that can never step again from ``offered`` on."""
        return opt & self.alive[bisect.bisect_left(self.needs, offered)] if opt else 0


def _ranks(required: Sequence[bool]) -> list[int]:
    """Each op's bit: a required op's among the required, an optional's among the others."""
    counts = [0, 0]
    ranks = []
    for req in required:
        ranks.append(counts[req])
        counts[req] += 1
    return ranks


def _search(
    model: Model,
    ops: Sequence[Op],
    required: Sequence[bool],
    starts: Iterable[Hashable],
    budget: int,
    collect: bool = False,
) -> _Found:
    """Can every required op of ``ops`` and any of the others be linearized
    from one of ``starts``, within ``budget`` model steps? ``collect``: go on
    to find every state they can end in.

    A configuration first tries the required ops whose call comes before the
    first pending return, then the optional ones invoked by then. The set of
    linearized ops is kept as ``base`` (every required op of a lower rank is
    linearized) and ``rest`` (bits above it), with ``opt`` for the optional
    ops, so a remembered configuration costs a few small ints however long
    the history."""
    links, pool, rank = _Links(ops, required), _Pool(model, ops, required), _ranks(required)
    step, offers, nxt, tail = model.step, model.offers, links.nxt, links.tail
    memo: set[tuple[int, int, int, Hashable]] = set()
    ends: dict[Hashable, int | None] = {}
    steps = deepest = 0
    for start in starts:
        config = (0, 0, 0, start)
        _, _, opt, state = config
        entry, pending = nxt[0], None
        stack: list[tuple] = []
        while True:
            if pending is None and entry != tail and not links.is_return[entry]:
                i, entry = links.op[entry], nxt[entry]
            elif pending is None:  # the first pending return, or none: the optional ops' turn
                if entry == tail and not collect:
                    return _Found(True, steps, None, ends)
                if entry == tail:
                    ends.setdefault(state, _last_change(stack, state))
                deepest = max(deepest, entry if entry != tail else 0)
                pending = pool.candidates(offers(state), links.time[entry], opt, rank)
                continue
            elif pending:
                i = pending.pop()
            elif stack:  # nothing left to try here: back up
                i, config, entry, pending = stack.pop()
                _, _, opt, state = config
                if required[i]:
                    links.unlift(i)
                continue
            else:
                break
            steps += 1
            if steps > budget:
                return _Found(None, steps, None, ends)
            new = step(state, ops[i])
            if new is None:
                continue
            # an op that changes nothing: a required one is best taken now (any order taking
            # it later takes it here as well), so nothing else is tried here; an optional one
            # is best left out
            idle = new is state or new == state
            base, rest = config[0], config[1]
            if required[i]:
                moved = rest | 1 << (rank[i] - base)
                ones = (moved ^ (moved + 1)).bit_length() - 1
                key = (base + ones, moved >> ones, pool.living(opt, offers(new)), new)
            elif idle:
                continue
            else:
                key = (base, rest, pool.living(opt | 1 << rank[i], offers(new)), new)
            if key in memo:
                pending = [] if idle else pending
                continue
            memo.add(key)
            stack.append((i, config, entry, [] if idle else pending))
            if required[i]:
                links.lift(i)
            config = key
            _, _, opt, state = config
            entry, pending = nxt[0], None
    culprit = links.op[deepest] if deepest else None
    return _Found(bool(ends), steps, culprit, ends)


def _last_change(stack: list[tuple], state: Hashable) -> int | None:
    """The op on the search's path that last changed the state, if any."""
    for i, before, *_ in reversed(stack):
        if before[3] != state:
            return i
    return None


class _Cut(NamedTuple):
    """A failing sub-history: the ops before it (``past``), the states they
    can leave (``ends``, from :class:`_Found`) and the ops after, of which
    those ``required`` must be linearized and the others may be."""

    past: list[Op]
    ends: dict[Hashable, int | None]
    ops: list[Op]
    required: list[bool]


def _witness(
    model: Model, ops: list[Op], required: list[bool], culprit: int, budget: int, origin: int
) -> tuple[int, tuple[str, ...], int]:
    """The shortest failing sub-history found within ``budget`` steps, of a
    history (``ops`` sorted by invocation) whose search got furthest at
    ``culprit``: how many ops it holds, its lines, and the steps taken."""
    end = ops[culprit].complete_ns
    assert end is not None
    # nothing invoked after the culprit completed can help: the history ends there, and
    # what was still running then may or may not have happened by then
    ops = ops[: bisect.bisect_right([op.invoke_ns for op in ops], end)]
    required = [
        req and op.complete_ns is not None and op.complete_ns <= end
        for req, op in zip(required, ops, strict=False)  # ops cut short
    ]
    best = _Cut([], {model.initial(): None}, ops, required)
    left = budget
    for t0 in _cuts(ops, required):
        past, past_required, window, window_required = _split(ops, required, t0)
        reach = _search(model, past, past_required, [model.initial()], left, collect=True)
        left -= reach.steps
        if reach.linearizable is None:
            break
        tried = _search(model, window, window_required, list(reach.ends), left)
        left -= tried.steps
        if tried.linearizable is False:
            best = _Cut(past, reach.ends, window, window_required)
            break
        if tried.linearizable is None:
            break
    required, left = _loosen(model, best, left)
    return required.count(True), _lines(best._replace(required=required), origin), budget - left


def _cuts(ops: list[Op], required: list[bool]) -> Iterable[int]:
    """Where to cut: before the last 1, 2, 4, ... required ops to complete,
    at the earliest invocation among them, until the cut is at the start."""
    ends = sorted(
        (op.complete_ns or 0, op.invoke_ns) for op, r in zip(ops, required, strict=True) if r
    )
    earliest = list(itertools.accumulate((t for _, t in reversed(ends)), min))
    w, last = 1, None
    while True:
        t0 = earliest[min(w, len(earliest)) - 1]
        if t0 != last:
            yield t0
        if w >= len(earliest):
            return
        w, last = 2 * w, t0


def _split(
    ops: list[Op], required: list[bool], t0: int
) -> tuple[list[Op], list[bool], list[Op], list[bool]]:
    """``ops`` cut at ``t0``: the past (the ops invoked before, required iff
    required and complete before) and the window (the rest, with what
    straddles the cut as may-or-may-not: it may have happened on either side)."""
    past: list[Op] = []
    past_required: list[bool] = []
    window: list[Op] = []
    window_required: list[bool] = []
    for op, req in zip(ops, required, strict=True):
        if op.invoke_ns >= t0:
            window.append(op)
            window_required.append(req)
            continue
        done = req and op.complete_ns is not None and op.complete_ns < t0
        past.append(op)
        past_required.append(done)
        if not done:
            window.append(op)
            window_required.append(False)
    return past, past_required, window, window_required


def _loosen(model: Model, cut: _Cut, budget: int) -> tuple[list[bool], int]:
    """``cut.required`` with every op turned into a may-or-may-not, oldest
    first, that the rest still fails without, within ``budget`` steps; and
    the budget left."""
    required = list(cut.required)
    starts = list(cut.ends)
    for j, req in enumerate(required):
        if not req:
            continue
        required[j] = False
        tried = _search(model, cut.ops, required, starts, budget)
        budget -= tried.steps
        if tried.linearizable is not False:
            required[j] = True
        if tried.linearizable is None:
            break
    return required, budget


def _lines(cut: _Cut, origin: int) -> tuple[str, ...]:
    where = (
        f"the {_n(len(cut.past), 'op')} before leave the shard" if cut.past else "the shard starts"
    )
    lines = [f"{where} in {_n(len(cut.ends), 'state')}:"]
    for state, by in list(cut.ends.items())[:_STATES_SHOWN]:
        how = "as it starts" if by is None else f"e.g. after {describe(cut.past[by], origin)}"
        lines.append(f"  {state}  ({how})")
    if len(cut.ends) > _STATES_SHOWN:
        lines.append(f"  and {len(cut.ends) - _STATES_SHOWN:,} more")
    shown = [describe(op, origin) for op, req in zip(cut.ops, cut.required, strict=True) if req]
    others = _n(len(cut.ops) - len(shown), "other op")
    lines.append(f"from which no order of these fits ({others} around taken as may-or-may-not):")
    lines += [f"  {line}" for line in shown[:_OPS_SHOWN]]
    if len(shown) > _OPS_SHOWN:
        lines.append(f"  and {len(shown) - _OPS_SHOWN:,} more")
    return tuple(lines)


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"
