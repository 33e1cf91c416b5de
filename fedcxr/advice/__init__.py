"""Method advice from the science regime map (issue 21 §4; the map itself: issue 18 §3).

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
``regime``          the map (``regime_map.csv``, package data): reading and checking it,
                    placing a federation in a cell, the map's verdict there
``cells``           one map row from per-seed results (winner, runner-up, paired interval,
                    the corrected verdict): what the benchmark that measures the map writes
``verdicts``        the corrected verdicts: paired t-tests, the winner's intersection-union
                    test with its selection paid for, Holm over the cells (and over pairs)
==================  ==========================================================================

A leaf above L1: it imports :mod:`fedcxr.errors` only (and pandas/scipy), so the statistics
command and the benchmarks can both use it.
"""
