#!/usr/bin/env python3
"""Paper B's "faster through failures" and "no loss of accuracy" claims under three kills, read
off the runs in this folder (paper A's setting: the CNN, 2 shards, 4 workers, SSP(3), 5 seeds,
the servers' model evaluated; server shard 0 killed at 0.14, 0.37 and 0.6 of the first
control run's length), replica-log ("swift (replica-log/10)") beside checkpointing (adaptive
and every 100 clocks) and a no-kill control.

    python3 docs/results/swift/cnn_three_kills/derive.py

Standard library only: the derivation of ../derive_paper_a_cnn.py (paper A's re-run, one and
two kills) applied to this folder's runs, plus the control's duration over replica-log's.
Comparisons are paired by seed; intervals are 95%, mean +- t(0.975, n-1) * sd / sqrt(n) over
the per-seed values (n = 5, t = 2.776).
"""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from derive_paper_a_cnn import derive  # noqa: E402

derive(HERE, (3,), with_control_ratio=True)
