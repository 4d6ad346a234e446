"""TrainCheck under its paper's protocol, beside the benchmark's (``manage.py traincheck_protocols``).

The paper (TrainCheck, OSDI'25, as its talk states it) counts a bug as detected when the invariant relevant to
the bug fires, read by a person (18 of 20); gives a false-positive rate per invariant (failed / deployed on a
clean program, 5 reference pipelines: under 2 %); and checks 100 invariants selectively for its overhead
figure (under 11 %). This module measures each here, through the real pipeline (campaigns, a local worker, the
real traincheck package): ``measuring``'s ``measure_*`` store their figures in a JSON file, ``rendering.render``
writes the Markdown page from that file alone, and the benchmark's own figures come from a stored evaluation
(``measuring.benchmark_figures``). ``relevance`` holds the rule of which invariants count, and ``protocol`` the
constants of the three parts.
A JSON file rather than database rows: it travels with the page it renders (in the repository, reviewed in
diffs), needs no migration, and the page can be rewritten from any checkout, also where the measuring database
is not at hand.
"""
