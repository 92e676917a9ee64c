"""The compiled loops of :mod:`.digest`: one pass over the rows each.

Why compiled: numpy needs a pass over the rows for every multiply, add,
shift and xor, and the hash has about twenty of them; a trickle interval's
digest took 11.7 ns of CPU a row that way against 5.7-6.0 with these (40
intervals of 50,000 rows, each hashed right after it was generated, as a
worker does; ``time.process_time``, by hand). Every loop wraps around
mod 2^64.

A pass per leaf but for leaves of one word per row (integers, floats,
temporal types, booleans), each folded into the pass after it, and the
last pass mixes and sums the rows itself: a trickle digest (an ``int64``
key, 32-byte values) is one pass over its rows, where a pass per leaf and
one to finish took two more, each writing or reading a word a row (2.6 ns a
row against 1.5, each interval hashed right after it was generated,
``perf_counter``, by hand). Every loop ends in the same few lines that fold,
read and finish a row: written out in each, because a compiled function
taking the arrays, called per row, cost 30 ns a row (its arrays' reference
counts), twenty times the loop.

Compiled by numba on first use (2.4 s for what :func:`.digest.prepare`
calls, with an empty ``NUMBA_CACHE_DIR``) and cached on disk
(``cache=True``: numba's index and object files in ``__pycache__`` beside
this module, or its user cache directory where that is read-only;
``NUMBA_CACHE_DIR`` moves them). They are pickles, written
and read by this machine's own processes only, as ``.pyc`` files are;
nothing from a socket or shared memory goes into them. A process loads
them in about 0.3 s; the zygote does before it forks (:func:`.digest.prepare`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_ONE = np.uint64(1)
_EIGHT = np.uint64(8)
#: The splitmix64 finalizer's constants.
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True)
def _mix(z):
    z ^= z >> np.uint64(30)
    z *= _MIX_1
    z ^= z >> np.uint64(27)
    z *= _MIX_2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def mix(sums):
    """Overwrite each of ``sums`` (``uint64``) with its splitmix64 finalizer."""
    for i in range(sums.shape[0]):
        sums[i] = _mix(sums[i])


@njit(cache=True, nogil=True)
def add_fold(rows):
    """The pass of ``rows`` with no leaf of its own (see :func:`add_records`):
    a row's sum is the folded word leaf's share, plus ``sums[r]`` if
    ``read``. A leaf of one word per row is hashed so, as the fold."""
    fold, fold_constant, sums, diffs, read, last = rows
    hashed = np.uint64(0)
    count = 0
    for i in range(sums.shape[0]):
        total = np.uint64(0)
        if fold.shape[0]:
            total += np.uint64(fold[i]) * fold_constant
        if read:
            total += sums[i]
        if last:
            diff = diffs[i]
            hashed += _mix(total) * np.uint64(diff)
            count += diff
        else:
            sums[i] = total
    return hashed, count


@njit(cache=True, nogil=True)
def add_records(values, constants, plus, rows):
    """The pass of a leaf of values of one length, 1 to :data:`RECORD_WORDS`
    - 1 words, as records of that many words (field ``w``): each row's sum
    is ``Σ_j constants[j] · values[r].w[j] + plus``, plus the rest of
    ``rows = (fold, fold_constant, sums, diffs, read, last)``: the folded word
    leaf's ``fold[r] · fold_constant`` (``fold`` empty: none), and
    ``sums[r]`` if ``read``. ``last``: returns ``(Σ diffs[r] · mix(sum),
    Σ diffs)`` and leaves ``sums`` as it was; else writes the sums into
    ``sums`` and returns zeros.

    The count of words is part of the record's type, so each count compiles
    a loop of its own, which the compiler unrolls and vectorizes across
    rows: 0.45 ns a 32-byte value against 1.5-2.4 for :func:`add_matrix`,
    whose count is only known at run time (50,000 rows, hot, by hand)."""
    fold, fold_constant, sums, diffs, read, last = rows
    hashed = np.uint64(0)
    count = 0
    for i in range(values.shape[0]):
        words = values[i].w
        total = plus
        for j in range(words.shape[0]):
            total += constants[j] * words[j]
        if fold.shape[0]:
            total += np.uint64(fold[i]) * fold_constant
        if read:
            total += sums[i]
        if last:
            diff = diffs[i]
            hashed += _mix(total) * np.uint64(diff)
            count += diff
        else:
            sums[i] = total
    return hashed, count


#: Words a value of one length has from which :func:`add_matrix` hashes it
#: faster than :func:`add_records` (8 words: 1.2 ns a value against 2.4;
#: 7 words: 2.2 against 0.8; by hand, as there).
RECORD_WORDS = 8


@njit(cache=True, nogil=True)
def add_matrix(words, tails, constants, plus, rows):
    """:func:`add_records` for values of one length: ``words[r]`` their whole
    words, ``tails[r]`` the bytes after them (under 8; none for a multiple
    of 8 bytes), both views of the values' buffer with a row's stride, so a
    row's words are unaligned unless the length is a multiple of 8. From
    :data:`RECORD_WORDS` words on the compiler vectorizes the words of a row
    (1.2 ns a 64-byte value); fewer whole words and no tail go to
    :func:`add_records`. Why not :func:`add_ragged` for one length: 4.9 ns
    a 36-byte value (a uuid's text) against 12.4, 7.0 a 100-byte one
    against 27.7 (50,000 rows, hot, by hand)."""
    fold, fold_constant, sums, diffs, read, last = rows
    hashed = np.uint64(0)
    count = 0
    row_count, word_count = words.shape
    tail_bytes = tails.shape[1]
    for i in range(row_count):
        total = plus
        for j in range(word_count):
            total += constants[j] * words[i, j]
        if tail_bytes:
            word = np.uint64(0)
            for b in range(tail_bytes):
                word |= np.uint64(tails[i, b]) << (_EIGHT * np.uint64(b))
            total += constants[word_count] * word
        if fold.shape[0]:
            total += np.uint64(fold[i]) * fold_constant
        if read:
            total += sums[i]
        if last:
            diff = diffs[i]
            hashed += _mix(total) * np.uint64(diff)
            count += diff
        else:
            sums[i] = total
    return hashed, count


@njit(cache=True, nogil=True)
def length_range(offsets):
    """``(shortest, longest)`` length of the values between ``offsets``
    (``(0, 0)`` for none), in one pass without an early exit (a loop the
    compiler vectorizes)."""
    if offsets.shape[0] < 2:
        return 0, 0
    shortest = longest = offsets[1] - offsets[0]
    for i in range(1, offsets.shape[0] - 1):
        length = offsets[i + 1] - offsets[i]
        shortest = min(shortest, length)
        longest = max(longest, length)
    return shortest, longest


@njit(cache=True, nogil=True)
def _last_word(data, start):
    """The little-endian word of the bytes of ``data`` from ``start`` to its
    end (under 8 of them beyond its last whole word), zero-padded."""
    word = np.uint64(0)
    for b in range(min(8, data.shape[0] - start)):
        word |= np.uint64(data[start + b]) << (_EIGHT * np.uint64(b))
    return word


@njit(cache=True, nogil=True)
def add_ragged(data, words, offsets, constants, length_constant, rows):
    """:func:`add_records` for values of any length: a row's own share is
    ``Σ_j constants[j] · w_j + length · length_constant`` over the
    little-endian words ``w_j`` of value ``r``, ``data[offsets[r]:offsets[r+1]]``
    (the last zero-padded); ``words`` is ``data``'s whole words from its first
    byte; ``constants`` has a place for the longest value's words.

    A value's word is cut from the two whole words it spans, in this loop.
    Why: loaded from an array of a word at every byte (stride 1), or cut the
    same way in a function of its own, a 12-byte key cost 43-50 ns; cut
    here, 4.2-5.7 (150,000 keys, ``perf_counter``, by hand)."""
    fold, fold_constant, sums, diffs, read, last = rows
    hashed = np.uint64(0)
    count = 0
    for i in range(offsets.shape[0] - 1):
        start = np.int64(offsets[i])
        end = np.int64(offsets[i + 1])
        total = np.uint64(end - start) * length_constant
        place = 0
        while start < end:
            at = start >> 3
            shift = np.uint64(start & 7) * _EIGHT
            if at + 1 < words.shape[0]:
                word = words[at] >> shift
                if shift:  # bytes of the next word too (a shift by 64 is undefined)
                    word |= words[at + 1] << (np.uint64(64) - shift)
            else:
                word = _last_word(data, start)
            if end - start < 8:
                word &= (_ONE << (_EIGHT * np.uint64(end - start))) - _ONE
            total += constants[place] * word
            place += 1
            start += 8
        if fold.shape[0]:
            total += np.uint64(fold[i]) * fold_constant
        if read:
            total += sums[i]
        if last:
            diff = diffs[i]
            hashed += _mix(total) * np.uint64(diff)
            count += diff
        else:
            sums[i] = total
    return hashed, count
