"""Timing: the judge's clock around the candidate's calls, on inputs it has never seen.

The judge times the candidate itself; nothing the runner says about time is used. A window:

1. The judge draws P fresh input sets (from its secret seed), times the reference on them in its
   own process (one call per set, back to back, synchronised at the end), and keeps the
   reference's outputs as the truth for this window.
2. It copies the same inputs into a fresh shared region (`shared_region.py`); the runner cannot
   reach it until it gets its descriptor. The outputs go to the output ring: one region the
   runner maps once per timing stage (`Rings`), whose slots the judge zeroes before each window.
3. The clock starts; the judge sends the window (sizes, layout, the ring) and the descriptor on
   the pair's socket. The runner maps it, calls ModelNew once per set, says `computed`, copies
   each output into its slot of the ring, synchronises and answers `committed`.
4. The judge then copies the slots into memory of its own (made before the clock) and
   synchronises; the clock stops there. Work the runner left running after `computed` either
   delays the snapshot (and is counted) or is missing from it (and fails the check). What a
   window costs beyond the calls comes off: after `computed`, the commit and the snapshot as the
   judge times them on its own memory; before it, on a GPU, the opening (hand-over, mapping,
   waits) as the judge's probe process shows it on the same path (`probe.py`), on the CPU the
   judge's own measure of the mapping and a message's round trip.
5. Every slot of the snapshot is compared with the reference's output for the same set.

Windows alternate with reference windows on fresh draws, so both see the same machine, and no
content repeats within or across windows: a cache keyed on an input's contents never hits.

One entry point: `run(TimingJob) -> TimingOutcome` (`job`, `stage`). Its modules: `layouts`
(where a set lies in a lent region), `window_io` (waits both sides share), `runner_window` (the
runner's side of a wall-clock window), `window_timer` (the judge's side), `window_plan` (how many
sets a window holds), `device_clock` (on a GPU, windows on the device's own timeline), `probe`
(on a GPU, a trusted stand-in for the runner) and `probe_windows` (the judge's windows on it),
`stability` (when not to trust a figure), `window_facts` (what the stage records of its clocks),
`summary` (the record's statistics), `gpu_load` (the processes NVML saw busy on the GPU during the
windows: evidence the judge records, read in a process of its own). Whether a timed output is right
is `correctness.TimedBound`'s to say. Imports only torch, the standard library and `core`.
"""

from kernelwright.engine.child.timing.job import TimingFailure, TimingJob, TimingOutcome
from kernelwright.engine.child.timing.stage import run

__all__ = ["TimingFailure", "TimingJob", "TimingOutcome", "run"]
