"""The sensitivity track: silent faults injected at controlled severity into clean pipelines, so that each detector
gets a dose-response curve.

A **fault operator** is a small, reviewed transformation of a clean pipeline's training (one module of
sensitivity/faults/operators): a missing `zero_grad`, a loss scale off by a factor, one bit flipped in a gradient.
Its **severity** is an ordered parameter of at least four levels, from the least harm to the most (how often the
fault strikes, by how much, which bit). A **mutant** is one operator applied to one pipeline at one severity from
one trigger step (`MUT-<operator>-<severity>-<pipeline>-t<trigger>`); its fixed variant, which arms nothing, is its
**clean twin**. The mutants come from sensitivity/spec.yaml (docs/writing-a-fault-operator.md).

**Dose-response.** For a detector and an operator class (software or hardware), the share of manifested mutant runs
it caught in time, at each severity level, with its Wilson interval; the **50 % and 90 % severities** are the lowest
levels at which that share reaches 0.5 and 0.9 (none when it never does). Benign runs are left out of every share.

**How it runs.** `manage.py evaluate_sensitivity` runs every mutant under every detector without a fit phase, over
three seeds, through the real workers. The detectors that only observe the program watch each run together, in one
process with a probe each (a **bundle**): one such run shows each of them the alarms a run of its own shows, alarm
for alarm, which the test suite checks on real runs and `manage.py bench_bundle` measures on any slice. A detector
that changes what the program does (`detect_anomaly` turns a failing backward into a return) or works outside the
process runs in runs of its own, and so does every approved submitted detector. A submitted detector's code runs in
the mutant's process and could read the mutant's files, which name its fault: this track has no canaries, so a
submitted detector's sensitivity rests on the review of its code, and it is never ranked.

**What the track does not claim.** Mutants are not real bugs: an operator is a model of a class of faults, and its
severity scale is its author's. A detector's sensitivity says how large a fault of that kind must be before it sees
it, on these small pipelines; it is reported apart from the real-bug results, which stay the headline and the
ranking.
"""
